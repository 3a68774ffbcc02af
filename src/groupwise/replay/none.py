"""The ``none`` buffer: nothing replayed (the default)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from groupwise.registry import NoConfig
from groupwise.replay import BUFFERS
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
def none(cfg: NoConfig, env) -> NoReplay:
    return NoReplay()


