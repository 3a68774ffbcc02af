"""The members that do nothing, each its kind's default: the ``none`` replay buffer (nothing replayed) and the
``none`` teacher (no teacher; a loss term that requires one is refused at load). The ``none`` filter is
``filters.py``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from groupwise.registry import NoConfig
from groupwise.replay import BUFFERS
from groupwise.teachers import TEACHERS
from groupwise.types import Group, Replayed

if TYPE_CHECKING:
    from torch import Tensor


class NoReplay:
    def sample(self, step: int, ctx: Any) -> list[Replayed]:
        return []

    def add(self, groups: list[Group], advantages: Tensor, step: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@BUFFERS.register("none", config=NoConfig, stateful=True)
def no_replay(cfg: NoConfig, env) -> NoReplay:
    return NoReplay()


@TEACHERS.register("none", config=NoConfig)
def no_teacher(cfg: NoConfig, env) -> None:
    return None


