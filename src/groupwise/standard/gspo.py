"""``gspo``: Group Sequence Policy Optimization (Zheng et al., arXiv:2507.18071), and its GSPO-token variant.

The importance ratio is the sequence's, length-normalised (the geometric mean of the token ratios):
  s_i = exp( (1/|o_i|) Σ_t (logprobs_t − old_logprobs_t) )            over the row's loss tokens
  level sequence        w_i,t = s_i                                        (the gradient flows through s_i)
  level sequence_token  w_i,t = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]          (GSPO-token, the paper's §4.3)
  l_i,t = −min(w_i,t · A_i,t, clip(w_i,t, 1 − clip_low, 1 + clip_high) · A_i,t)
TRL's ``importance_sampling_level="sequence"`` (loss_type ``grpo``) and, for ``sequence_token``, TRL's
``trl.experimental.gspo_token`` (pinned against both in tests/unit/losses/test_gspo.py). The two levels have the
same value; their gradients differ only where advantages vary along a row (credit components), which GSPO-token
exists for. Defaults are the paper's clip range, 3e-4 / 4e-4 (v2, §5.1).

Reduction: GSPO's objective is a mean over sequences, so ``level: sequence`` is refused at load with any
``loss.reduction`` but ``seq_mean_token_mean`` (a token mean would weight each sequence by its length: TRL warns
about the same); ``sequence_token`` is a token-level objective and takes any. On-policy (one epoch, s_i = 1) the
gradient is −A·mean_t ∇logprobs_t per row: ``ppo_clip``'s with ``seq_mean_token_mean``. A row without loss tokens
has s_i = 1. Metrics (token shares, as ``ppo_clip``): ``loss/clip_frac_low`` (A < 0, w < 1 − clip_low),
``loss/clip_frac_high`` (A > 0, w > 1 + clip_high), ``loss/ratio_mean`` (mean s_i over loss tokens).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from groupwise.lazy import torch
from groupwise.losses import LOSSES
from groupwise.standard.ppo_clip import clipped_surrogate
from groupwise.types import LossInputs, LossTerms

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class GSPOConfig:
    clip_low: float = 3e-4
    """ε_low of the sequence ratio's clip (the paper: 3e-4; TRL's ``epsilon``)."""
    clip_high: float = 4e-4
    """ε_high (the paper: 4e-4; TRL's ``epsilon_high``)."""
    level: Literal["sequence", "sequence_token"] = "sequence"
    """TRL's ``importance_sampling_level``: ``sequence`` is GSPO, ``sequence_token`` GSPO-token."""

    def __post_init__(self) -> None:
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"clip_low={self.clip_low} must be in [0, 1) and clip_high={self.clip_high} >= 0")

    def check(self, run) -> None:
        if self.level == "sequence" and run.loss.reduction != "seq_mean_token_mean":
            raise ValueError(f"level sequence is a mean over sequences; loss.reduction={run.loss.reduction} would "
                             "weight each sequence by its length; allowed: loss.reduction=seq_mean_token_mean, or "
                             "level sequence_token")


def sequence_log_ratio(inp: LossInputs) -> Tensor:
    """(1/|o_i|) Σ_t (logprobs − old_logprobs) over each row's loss tokens: [B, 1], with grad; 0 for a row without
    loss tokens."""
    m = inp.completion_mask
    log_ratio = torch.where(m, inp.logprobs - inp.old_logprobs, torch.zeros_like(inp.logprobs))
    return log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)


# advantage_only: loss and grad are 0 where A = 0
@LOSSES.register("gspo", config=GSPOConfig, advantage_only=True, provides=("policy_gradient",))
def gspo(inp: LossInputs, cfg: GSPOConfig) -> LossTerms:
    log_s = sequence_log_ratio(inp)  # [B, 1]
    if cfg.level == "sequence":
        log_w = log_s.expand_as(inp.logprobs)
    else:  # value s_i, gradient of log π_θ(y_t) alone: exp(x − x.detach()) is 1 with the gradient of x
        log_w = inp.logprobs - inp.logprobs.detach() + log_s.detach()
    return clipped_surrogate(torch.exp(log_w), inp.advantages, inp.completion_mask, cfg.clip_low, cfg.clip_high)
