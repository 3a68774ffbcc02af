"""Advantages: group-level estimators over padded [N, G] rewards, then optional transforms.

Registry signatures:
  ADVANTAGES            ``fn(batch: ScoredBatch, cfg) -> Tensor[N, G]``
  ADVANTAGE_TRANSFORMS  ``fn(batch: ScoredBatch, adv: Tensor[N, G], cfg) -> Tensor[N, G]`` (in order)
Padded entries (``batch.mask`` False) must come out 0.
"""

from groupwise.registry import Registry

ADVANTAGES = Registry("advantage", "fn(batch: ScoredBatch, cfg) -> Tensor[N, G]")
ADVANTAGE_TRANSFORMS = Registry("advantage transform", "fn(batch: ScoredBatch, adv: Tensor[N, G], cfg) -> Tensor[N, G]")

from groupwise.advantages import garl, grpo, lampo, mode_balance  # noqa: E402,F401  (registration)
