"""``gmpo``: Geometric-Mean Policy Optimization (Zhao et al., arXiv:2507.20673).

GRPO's arithmetic mean of token ratios becomes their geometric mean, clipped per token in log space:
  x_t = logprobs_t − old_logprobs_t
  x̃_t = min(x_t, clamp(x_t, −clip_low, clip_high)) where A_t > 0, else max(x_t, clamp(…))   (PPO's pessimism)
  l_i,t = −exp( (1/|o_i|) Σ_s x̃_s ) · A_i,t                                                over the row's loss tokens
TRL's ``trl.experimental.gmpo.GMPOTrainer`` (pinned in tests/unit/losses/test_gmpo.py); defaults are its and the
paper's range, (e^−0.4, e^0.4). The objective is a mean over sequences (TRL: ``per_sequence_loss.mean()``), so
the term is refused at load with any ``loss.reduction`` but ``seq_mean_token_mean``, which then gives
−exp(…)·mean_t A_i,t per row: TRL's −exp(…)·A_i when the advantage is the row's (groupwise carries per-token
advantages, which credit components may vary along a row; the clip's side follows each token's sign).

Unlike TRL, a KL term is its own loss term here, token-level (TRL's GMPO averages its KL per sequence). On-policy
(one epoch, x = 0) the gradient is −A·mean_t ∇logprobs_t per row, as ``gspo``'s. A row without loss tokens
has weight 1. Metrics (token shares, TRL's): ``loss/clip_frac_low`` (A < 0, x < −clip_low), ``loss/clip_frac_high``
(A > 0, x > clip_high), ``loss/ratio_mean`` (the mean geometric-mean weight over loss tokens).
"""

from __future__ import annotations

import dataclasses

from groupwise.lazy import torch
from groupwise.losses import LOSSES
from groupwise.losses.reduce import masked_sum_count
from groupwise.types import LossInputs, LossTerms


@dataclasses.dataclass(frozen=True, kw_only=True)
class GMPOConfig:
    clip_low: float = 0.4
    """In log space: a token ratio's floor is e^−clip_low (TRL's ``epsilon``)."""
    clip_high: float = 0.4
    """In log space: a token ratio's cap is e^clip_high (TRL's ``epsilon_high``)."""

    def __post_init__(self) -> None:
        if not (self.clip_low >= 0 and self.clip_high >= 0):
            raise ValueError(f"clip_low={self.clip_low} and clip_high={self.clip_high} must be >= 0 (log-space "
                             "bounds: the ratio is clipped to [e^-clip_low, e^clip_high])")

    def check(self, run) -> None:
        if run.loss.reduction != "seq_mean_token_mean":
            raise ValueError(f"GMPO's objective is a mean over sequences; loss.reduction={run.loss.reduction} would "
                             "weight each sequence by its length; allowed: loss.reduction=seq_mean_token_mean")


# advantage_only: loss and grad are 0 where A = 0
@LOSSES.register("gmpo", config=GMPOConfig, advantage_only=True, provides=("policy_gradient",))
def gmpo(inp: LossInputs, cfg: GMPOConfig) -> LossTerms:
    m, adv = inp.completion_mask, inp.advantages
    log_ratio = torch.where(m, inp.logprobs - inp.old_logprobs, torch.zeros_like(inp.logprobs))
    bounded = torch.clamp(log_ratio, -cfg.clip_low, cfg.clip_high)
    clipped = torch.where(adv > 0, torch.minimum(log_ratio, bounded), torch.maximum(log_ratio, bounded))
    log_w = (clipped * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
    weight = torch.exp(log_w)
    per_token = -weight * adv
    with torch.no_grad():
        low = ((log_ratio < -cfg.clip_low) & (adv < 0)).float()
        high = ((log_ratio > cfg.clip_high) & (adv > 0)).float()
        metrics = {"loss/clip_frac_low": masked_sum_count(low, m), "loss/clip_frac_high": masked_sum_count(high, m),
                   "loss/ratio_mean": masked_sum_count(weight.expand_as(adv), m)}
    return LossTerms(per_token, metrics)
