"""``maxrl``: Maximum Likelihood Reinforcement Learning (Tajwar et al., arXiv:2602.02710); prime-rl's ``max_rl``.

  A_i = (r_i − mean_g r) / mean_g r          where mean_g r > 0;   A_i = 0 in a group whose mean is <= 0
GRPO's centred reward divided by the group mean instead of its std: for 0/1 rewards a success in a group of pass
rate p gets (1 − p)/p, so hard problems weigh ~1/p (the gradient of the order-G truncation of the maximum-likelihood
objective log p). Written for non-negative (canonically 0/1) rewards, as the paper and prime-rl; negative rewards
are not refused, and a group whose mean is <= 0 carries no signal (prime-rl's ``mean <= 0`` rule, pinned against
its lines in tests/unit/advantages/test_maxrl.py). Like ``grpo``, a constant group (all successes), a singleton and
padding get exactly 0 (prime-rl's float32 (r − mean)/mean gives −7.5e-8 for eight rewards of 0.1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from groupwise.advantages import ADVANTAGES
from groupwise.advantages.stats import group_centred, group_mean
from groupwise.lazy import torch
from groupwise.registry import NoConfig
from groupwise.types import ScoredBatch

if TYPE_CHECKING:
    from torch import Tensor


@ADVANTAGES.register("maxrl", config=NoConfig)
def maxrl(batch: ScoredBatch, cfg: NoConfig) -> Tensor:
    mean = group_mean(batch.rewards, batch.mask)  # [N, 1]
    safe = torch.where(mean > 0, mean, torch.ones_like(mean))  # no 0/0 where the group carries no signal
    return torch.where(mean > 0, group_centred(batch.rewards, batch.mask) / safe, torch.zeros_like(batch.rewards))
