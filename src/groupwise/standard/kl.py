"""``kl`` and ``teacher_kl``: per-token estimates of KL(π_θ ‖ π_target) on the sampled tokens (weight = the
coefficient), with π_target the frozen reference (``kl``) or the run's teacher (``teacher_kl``).

With x = target_logprobs − logprobs (Schulman, "Approximating KL divergence", 2020):
  k1 = −x                   unbiased, high variance, can be negative
  k2 = x² / 2               biased, low variance
  k3 = exp(x) − 1 − x       unbiased, ≥ 0, low variance (GRPO's choice, arXiv:2402.03300)
The reference model (the initial policy) exists only when a ``kl`` term has non-zero weight; the teacher's
pass runs only when a ``teacher_kl`` (or another ``needs=("teacher",)``) term does. ``teacher_kl`` with k1 is
the sampled-token reverse-KL self-distillation signal, −(log π_T − log π_θ) per token, pulling π_θ toward
the teacher's view of the student's own samples.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from groupwise.lazy import torch
from groupwise.losses import LOSSES
from groupwise.losses.reduce import masked_sum_count
from groupwise.types import LossInputs, LossTerms

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class KLConfig:
    estimator: Literal["k1", "k2", "k3"] = "k3"


def estimate(target: Tensor, logprobs: Tensor, estimator: str) -> Tensor:
    x = target - logprobs
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x**2
    return torch.exp(x) - 1 - x


@LOSSES.register("kl", config=KLConfig, needs=("ref",))
def kl(inp: LossInputs, cfg: KLConfig) -> LossTerms:
    assert inp.ref_logprobs is not None, "kl needs ref_logprobs (the update computes them when weight != 0)"
    per_token = estimate(inp.ref_logprobs, inp.logprobs, cfg.estimator)
    return LossTerms(per_token, {"loss/kl_ref": masked_sum_count(per_token.detach(), inp.completion_mask)})


@LOSSES.register("teacher_kl", config=KLConfig, needs=("teacher",))
def teacher_kl(inp: LossInputs, cfg: KLConfig) -> LossTerms:
    assert inp.teacher is not None, "teacher_kl needs the teacher's log-probs (set `teacher:` in the recipe)"
    per_token = estimate(inp.teacher.logprobs, inp.logprobs, cfg.estimator)
    return LossTerms(per_token, {"loss/kl_teacher": masked_sum_count(per_token.detach(), inp.completion_mask)})
