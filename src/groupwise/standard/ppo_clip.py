"""``ppo_clip``: the clipped surrogate, per token, with separate lower and upper clip ranges.

  ρ = exp(logprobs − old_logprobs)
  l = −min(ρ·A, clip(ρ, 1 − clip_low, 1 + clip_high)·A)
clip_low = clip_high = 0.2 is PPO/GRPO; clip_high > clip_low is DAPO's clip-higher (arXiv:2503.14476).
On-policy (one epoch, ρ = 1) the gradient is −A·∇logprobs, i.e. REINFORCE with the group baseline.
Metrics: ``loss/clip_frac_low`` (A<0, ρ<1−clip_low), ``loss/clip_frac_high`` (A>0, ρ>1+clip_high),
``loss/ratio_mean``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from groupwise.lazy import torch
from groupwise.losses import LOSSES
from groupwise.losses.reduce import masked_sum_count
from groupwise.types import LossInputs, LossTerms

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOClipConfig:
    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self) -> None:
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"clip_low={self.clip_low} must be in [0, 1) and clip_high={self.clip_high} >= 0")


# advantage_only: loss and grad are 0 where A = 0
@LOSSES.register("ppo_clip", config=PPOClipConfig, advantage_only=True, provides=("policy_gradient",))
def ppo_clip(inp: LossInputs, cfg: PPOClipConfig) -> LossTerms:
    ratio = torch.exp(inp.logprobs - inp.old_logprobs)
    return clipped_surrogate(ratio, inp.advantages, inp.completion_mask, cfg.clip_low, cfg.clip_high)


def clipped_surrogate(ratio: Tensor, adv: Tensor, mask: Tensor, clip_low: float, clip_high: float) -> LossTerms:
    """−min(ρ·A, clip(ρ, 1 − clip_low, 1 + clip_high)·A) per token for any ratio ρ [B, T] (``gspo`` passes the
    sequence's), with the metrics of the module docstring over the ``mask``ed tokens."""
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        low = ((ratio < 1 - clip_low) & (adv < 0)).float()
        high = ((ratio > 1 + clip_high) & (adv > 0)).float()
        metrics = {"loss/clip_frac_low": masked_sum_count(low, mask),
                   "loss/clip_frac_high": masked_sum_count(high, mask),
                   "loss/ratio_mean": masked_sum_count(ratio, mask)}
    return LossTerms(per_token, metrics)
