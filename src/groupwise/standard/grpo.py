"""Group-relative advantages: ``grpo`` (std-normalised), ``dr_grpo`` (mean-centred), ``rloo`` (leave-one-out).

Conventions (pinned in tests/unit/advantages/test_grpo.py, stated in docs/conventions.md):
  grpo     A_i = (r_i - mean_g r) / (std_g r + eps), std with ddof=1 and eps=1e-4 (TRL's choice);
           a zero-variance group gives exactly 0, also with eps = 0 (decided by the rewards being all equal,
           not by a float std, which round-off makes ~1e-17 for six rewards of 0.1); a singleton gives 0.
           Scale-safe: a group whose squared deviations would overflow (|r| above ~1e150) is computed on r
           divided by a power of two >= its max |r| (exact), so 1e300 rewards do not zero the advantages;
           every other group is computed on r itself, bit for bit.
  dr_grpo  A_i = r_i - mean_g r  (arXiv:2503.20783, "Understanding R1-Zero-Like Training").
  rloo     A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_g r)  (arXiv:2402.14740); singleton -> 0.
Constant groups and padded entries get exactly 0 from all three.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from groupwise.advantages import ADVANTAGES
from groupwise.advantages.stats import group_centred, group_constant, group_count, group_scale, group_std
from groupwise.lazy import torch
from groupwise.registry import NoConfig
from groupwise.types import ScoredBatch

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    eps: float = 1e-4
    """Added to the std (TRL: 1e-4; verl: 1e-6)."""
    ddof: int = 1
    """Std degrees of freedom: 1 (Bessel, TRL/verl) or 0 (population)."""

    def __post_init__(self) -> None:
        if self.eps < 0 or self.ddof not in (0, 1):
            raise ValueError(f"eps={self.eps}, ddof={self.ddof}: eps must be >= 0 and ddof 0 or 1")


@ADVANTAGES.register("grpo", config=GRPOConfig)
def grpo(batch: ScoredBatch, cfg: GRPOConfig) -> Tensor:
    r, m = batch.rewards, batch.mask
    scale = group_scale(r, m)  # 1 (so x is r, bit for bit) unless r's squares would overflow
    x = r / scale
    centred = group_centred(x, m)
    std = group_std(x, m, cfg.ddof)
    spread = ~group_constant(r, m) & (std > 0)  # with eps = 0, 0/0 would be NaN
    # (x - mean x) / (std x + eps / scale) = (r - mean r) / (std r + eps)
    return torch.where(spread, centred / (std + cfg.eps / scale).clamp(min=1e-300), torch.zeros_like(centred))


@ADVANTAGES.register("dr_grpo", config=NoConfig)
def dr_grpo(batch: ScoredBatch, cfg: NoConfig) -> Tensor:
    return group_centred(batch.rewards, batch.mask)


@ADVANTAGES.register("rloo", config=NoConfig)
def rloo(batch: ScoredBatch, cfg: NoConfig) -> Tensor:
    r, m = batch.rewards, batch.mask
    n = group_count(m)
    scale = n / (n - 1).clamp(min=1)
    return group_centred(r, m) * scale * (n > 1)
