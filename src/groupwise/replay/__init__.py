"""Replay buffers: stored scored groups mixed into the fresh batch.

Registry form: ``factory(cfg, env) -> Buffer`` (every buffer is ``stateful``: its store is checkpointed).
The fresh stream is never changed: a buffer only appends stored groups to the step's update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from groupwise.registry import Registry, anything, described, list_of
from groupwise.types import Group, Replayed

if TYPE_CHECKING:
    from torch import Tensor


@runtime_checkable
class Buffer(Protocol):
    """``sample(step, ctx)`` -> stored groups to replay this step (never ones added at ``step``), each with
    the sequence advantages it was stored with and behaviour log-probs in ``Sample.old_logprobs``;
    ``ctx.policy_logprobs`` is one teacher-forced pass of the current policy, the only model call a buffer
    should make. ``add(groups, advantages, step)`` offers the step's fresh groups and their advantages
    ``[N, G]`` after the update."""

    def sample(self, step: int, ctx: Any) -> list[Replayed]: ...

    def add(self, groups: list[Group], advantages: Tensor, step: int) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def sample_contract(out: object, *_: object) -> str:
    """What is wrong with a buffer's ``sample`` output ("" when nothing)."""
    return "" if list_of(out, Replayed) else f"returned {described(out)}; the contract is a list of Replayed"


BUFFERS = Registry("replay buffer", Buffer, "factory", ("cfg", "env"), contract={"sample": sample_contract,
                                                                                       "add": anything})
