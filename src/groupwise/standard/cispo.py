"""``cispo``: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585).

  r_t = exp(logprobs_t − old_logprobs_t)
  l_t = −sg[clip(r_t, 1 − clip_low, 1 + clip_high)] · A_t · logprobs_t
The clipped ratio is a detached weight, so every token keeps its gradient −w_t·A_t·∇logprobs_t (PPO's clip
zeroes it outside the range); only its size is bounded. NeMo-RL's ``use_cispo`` (``ratio_clip_min`` /
``ratio_clip_max`` are ``clip_low`` / ``clip_high``, the same additive convention) and TRL's
``loss_type="cispo"`` (one absolute cap, ``epsilon_high`` = 1 + ``clip_high``; no lower bound, i.e.
``clip_low`` = 1), both pinned in tests/unit/losses/test_cispo.py. Defaults: no lower bound (MiniMax-M1 sets none)
and a cap of 5 (``clip_high`` 4: TRL's and ScaleRL's recommended ε_max = 5; NeMo-RL's recipe caps at 6).

The per-token value is −w·A·logprobs, not a ratio: ``loss/cispo`` is not comparable with ``loss/ppo_clip``'s value,
only the gradients are. On-policy (one epoch, r = 1) the gradient is −A·∇logprobs, ``ppo_clip``'s. TRL and NeMo-RL
reduce it over the step's tokens: the ``token_mean`` reduction (the default). Metrics (token shares, whatever
the sign of A, since the weight is bounded on both sides): ``loss/clip_frac_low`` (r < 1 − clip_low),
``loss/clip_frac_high`` (r > 1 + clip_high), ``loss/ratio_mean``.
"""

from __future__ import annotations

import dataclasses

from groupwise.lazy import torch
from groupwise.losses import LOSSES
from groupwise.losses.reduce import masked_sum_count
from groupwise.types import LossInputs, LossTerms


@dataclasses.dataclass(frozen=True, kw_only=True)
class CISPOConfig:
    clip_low: float = 1.0
    """ε_low^IS: the weight's floor is 1 − clip_low (1: no floor, as MiniMax-M1; NeMo-RL's ``ratio_clip_min``)."""
    clip_high: float = 4.0
    """ε_high^IS: the weight's cap is 1 + clip_high (NeMo-RL's ``ratio_clip_max``; TRL's ``epsilon_high`` − 1)."""

    def __post_init__(self) -> None:
        if not (0 <= self.clip_low <= 1 and self.clip_high >= 0):
            raise ValueError(f"clip_low={self.clip_low} must be in [0, 1] and clip_high={self.clip_high} >= 0 "
                             "(the weight is clipped to [1 - clip_low, 1 + clip_high])")


# advantage_only: loss and grad are 0 where A = 0
@LOSSES.register("cispo", config=CISPOConfig, advantage_only=True, provides=("policy_gradient",))
def cispo(inp: LossInputs, cfg: CISPOConfig) -> LossTerms:
    ratio = torch.exp(inp.logprobs.detach() - inp.old_logprobs)
    weight = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)  # detached: a weight, not a path for the gradient
    per_token = -weight * inp.advantages * inp.logprobs
    m = inp.completion_mask
    low = (ratio < 1 - cfg.clip_low).float()
    high = (ratio > 1 + cfg.clip_high).float()
    metrics = {"loss/clip_frac_low": masked_sum_count(low, m), "loss/clip_frac_high": masked_sum_count(high, m),
               "loss/ratio_mean": masked_sum_count(ratio, m)}
    return LossTerms(per_token, metrics)
