"""``paft``: PAFT's importance-resampled SFT term of the J_Q family (Lin & Ie, arXiv:2604.25907).

PAFT estimates ∇J_Q = P^{1−q}·E_{z ~ π(·|x, r=1)}[∇log π(z)] by resampling the group's successes and
fine-tuning on them (no negatives, no ratio, no clipping; several epochs are allowed):
  L = −P̂^{1−q} · (1/K_r) Σ_k log π_θ(z_k)
Per token this term is −w_b · log π_θ(y_{b,t}), where the row weight w_b = P̂^{1−q}·M·c_b/K_r comes from
the ``paft`` advantage (methods/garl/advantage.py), which sees the whole group and draws the resample counts c_b;
the configured reduction then divides by the step's tokens (``token_mean``: the spec's "sequence NLL over
the mean length"). Rows with weight 0 (failures, undrawn successes) carry no loss, so the term is
``advantage_only`` and the update skips them. Pair it with ``advantage: paft`` (checked at load).
Metric ``loss/paft_nll``: the token-mean NLL of the rows being fine-tuned (w > 0).
"""

from __future__ import annotations

import dataclasses

from groupwise.losses import LOSSES
from groupwise.losses.reduce import masked_sum_count
from groupwise.types import LossInputs, LossTerms


@dataclasses.dataclass(frozen=True, kw_only=True)
class PAFTLossConfig:
    """No knobs: it fine-tunes on the resampling weights of the ``paft`` advantage (``requires``)."""


@LOSSES.register("paft", config=PAFTLossConfig, advantage_only=True, provides=("paft_loss", "policy_gradient"),
                 requires=("paft_weights",))  # −A·log π: zero where A is 0
def paft(inp: LossInputs, cfg: PAFTLossConfig) -> LossTerms:
    per_token = -inp.advantages * inp.logprobs
    picked = inp.completion_mask & (inp.advantages > 0)
    return LossTerms(per_token, {"loss/paft_nll": masked_sum_count(-inp.logprobs.detach(), picked)})
