"""``kl``: a per-token estimate of KL(π_θ ‖ π_ref) on the sampled tokens (weight = the KL coefficient).

With x = ref_logprobs − logprobs (Schulman, "Approximating KL divergence", 2020):
  k1 = −x                   unbiased, high variance, can be negative
  k2 = x² / 2               biased, low variance
  k3 = exp(x) − 1 − x       unbiased, ≥ 0, low variance (GRPO's choice, arXiv:2402.03300)
The reference model is loaded only when this term's weight is non-zero.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import torch

from groupwise.losses import LOSSES
from groupwise.losses.reduce import masked_sum_count
from groupwise.types import LossInputs, LossTerms


@dataclasses.dataclass(frozen=True, kw_only=True)
class KLConfig:
    estimator: Literal["k1", "k2", "k3"] = "k3"
    needs: ClassVar[tuple[str, ...]] = ("ref",)


@LOSSES.register("kl", config=KLConfig)
def kl(inp: LossInputs, cfg: KLConfig) -> LossTerms:
    assert inp.ref_logprobs is not None, "kl needs ref_logprobs (the update computes them when weight != 0)"
    x = inp.ref_logprobs - inp.logprobs
    if cfg.estimator == "k1":
        per_token = -x
    elif cfg.estimator == "k2":
        per_token = 0.5 * x**2
    else:
        per_token = torch.exp(x) - 1 - x
    return LossTerms(per_token, {"loss/kl_ref": masked_sum_count(per_token.detach(), inp.completion_mask)})
