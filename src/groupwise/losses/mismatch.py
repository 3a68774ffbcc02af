"""Sampler-trainer mismatch: its importance-sampling correction and its per-step metrics.

The generator's ``rollout_logprobs`` (log q, the sampler: vLLM, or the ``hf`` decode loop with its KV cache)
and the trainer's ``old_logprobs`` (log π_old: the update's teacher-forced pass at the weights that sampled;
for on-policy rows the first epoch's detached log-probs) should agree; they drift with kernels, dtypes and
engines. With δ = old_logprobs − rollout_logprobs on the loss tokens (0 where the sampler's log-prob is NaN:
tokens it did not sample), TRL's ``vllm_importance_sampling_mode`` semantics (trl/trainer/grpo_trainer.py,
``_generate_and_score_completions``, TRL 1.16):

  token_*      w_t = exp(δ_t)                       sequence_*  w_t = exp(Σ_s δ_s) for every token of the row
  *_truncate   w = min(w, cap)                      *_mask      w = 0 where w > cap (a zero weight: the
                                                                token or row stays in the denominators)

Every loss term's per-token loss is multiplied by w (detached), in ``update.Learner.loss``. Departure from
TRL: TRL weights only the policy-gradient term and adds its β·KL unweighted; here every term is weighted (the
update has one per-token weight for all terms, ``TokenBatch.loss_weights``). Both sides are log-probs of
logits / temperature over the full vocabulary, so under top-p the ratio carries no kept-mass factor (see
``types.Completion``). Replayed rows' behaviour log-probs are what their buffer stores (by default the
sampler's own, so their w is 1: their PPO ratio already divides by the sampler).

Metrics (over the loss tokens whose sampler log-prob is finite, of the rows the update runs):
``mismatch/kl`` = mean of k3 = exp(δ) − 1 − δ, an unbiased estimate of KL(q ‖ π_old) from q's samples;
``mismatch/max_abs_dlogp`` = max |δ|; ``mismatch/is_weight_mean`` = mean w (with mode none: of exp(δ), the
weight that would apply); ``mismatch/clipped_frac`` = share of tokens whose weight was truncated or masked.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from groupwise.lazy import no_grad, torch

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One micro-batch's correction: ``weight`` [B, T] (None with mode none) and its metrics as (sum, count)
    pairs, plus the peak ``max_abs_dlogp`` (None when no token has a sampler log-prob)."""

    weight: Tensor | None
    metrics: dict[str, tuple[float, float]]
    max_abs_dlogp: float | None


@no_grad
def importance_weights(old: Tensor, sampler: Tensor, mask: Tensor, mode: str,
                       cap: float) -> tuple[Tensor, Tensor]:
    """(w [B, T], clipped [B, T] bool) for ``mode`` (not ``none``); see the module docstring."""
    delta = torch.nan_to_num((old - sampler) * mask, nan=0.0)  # NaN sampler log-prob: no correction
    if mode.startswith("sequence"):
        delta = delta.sum(-1, keepdim=True).expand_as(old)
    raw = torch.exp(delta)
    clipped = (raw > cap) & mask
    if mode.endswith("truncate"):
        return torch.clamp(raw, max=cap), clipped
    if mode.endswith("mask"):
        return raw.masked_fill(raw > cap, 0.0), clipped
    raise ValueError(f"unknown importance sampling mode '{mode}'; allowed: none, token_truncate, token_mask, "
                     "sequence_truncate, sequence_mask")


@no_grad
def mismatch(old: Tensor, sampler: Tensor, mask: Tensor, mode: str, cap: float) -> Mismatch:
    """The IS weight for ``mode`` and the mismatch metrics of one micro-batch ([B, T], ``mask`` bool)."""
    known = mask & torch.isfinite(sampler)
    n = float(known.sum())
    delta = torch.where(known, old - sampler, torch.zeros_like(old)).double()
    if mode == "none":
        weight, shown, clipped = None, torch.exp(delta), torch.zeros_like(known)
    else:
        weight, clipped = importance_weights(old, sampler, mask, mode, cap)
        shown = weight.double()
    if not n:
        return Mismatch(weight, {}, None)
    k = known.double()
    metrics = {"mismatch/kl": (float(((torch.exp(delta) - 1 - delta) * k).sum()), n),
               "mismatch/is_weight_mean": (float((shown * k).sum()), n),
               "mismatch/clipped_frac": (float((clipped & known).sum()), n)}
    return Mismatch(weight, metrics, float(delta.abs().max()))
