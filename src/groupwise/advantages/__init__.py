"""Advantages: group-level estimators over padded [N, G] rewards, then optional transforms.

Registry forms (pure functions; building one binds its config):
  ADVANTAGES            ``fn(batch: ScoredBatch, cfg) -> Tensor[N, G]``              bound: ``Advantage``
  ADVANTAGE_TRANSFORMS  ``fn(batch: ScoredBatch, adv: Tensor[N, G], cfg) -> Tensor[N, G]`` (in order)
Padded entries (``batch.mask`` False) must come out 0. A plug-in's output is checked against ``contract``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from groupwise.lazy import torch
from groupwise.registry import Registry
from groupwise.types import ScoredBatch

if TYPE_CHECKING:
    from torch import Tensor


@runtime_checkable
class Advantage(Protocol):
    def __call__(self, batch: ScoredBatch) -> Tensor: ...


@runtime_checkable
class AdvantageTransform(Protocol):
    def __call__(self, batch: ScoredBatch, adv: Tensor) -> Tensor: ...


def contract(out: object, batch: ScoredBatch, *_: object) -> str:
    """What is wrong with an advantage (or advantage transform) output for ``batch`` ("" when nothing)."""
    n, g = batch.mask.shape
    if isinstance(out, torch.Tensor) and out.shape == batch.mask.shape and out.is_floating_point():
        return ""
    got = f"shape {tuple(out.shape)} ({out.dtype})" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
    return f"returned {got} for {n} groups x {g} samples; the contract is a (groups, group_size) float tensor"


ADVANTAGES = Registry("advantage", Advantage, "function", ("batch", "cfg"), contract=contract)
ADVANTAGE_TRANSFORMS = Registry("advantage transform", AdvantageTransform, "function",
                                ("batch", "adv", "cfg"), contract=contract)

