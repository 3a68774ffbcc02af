"""Advantages: group-level estimators over padded [N, G] rewards, then optional transforms.

Registry forms (pure functions; building one binds its config):
  ADVANTAGES            ``fn(batch: ScoredBatch, cfg) -> Tensor[N, G]``              bound: ``Advantage``
  ADVANTAGE_TRANSFORMS  ``fn(batch: ScoredBatch, adv: Tensor[N, G], cfg) -> Tensor[N, G]`` (in order)
Padded entries (``batch.mask`` False) must come out 0.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from groupwise.registry import Registry, import_members
from groupwise.types import ScoredBatch


@runtime_checkable
class Advantage(Protocol):
    def __call__(self, batch: ScoredBatch) -> Tensor: ...


@runtime_checkable
class AdvantageTransform(Protocol):
    def __call__(self, batch: ScoredBatch, adv: Tensor) -> Tensor: ...


ADVANTAGES = Registry("advantage", Advantage, "function", ("batch", "cfg"))
ADVANTAGE_TRANSFORMS = Registry("advantage transform", AdvantageTransform, "function", ("batch", "adv", "cfg"))

import_members(__name__, __path__)
