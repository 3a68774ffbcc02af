"""Sampler-trainer mismatch: its importance-sampling correction and its per-step metrics.

The generator's ``rollout_logprobs`` (log q, the sampler: vLLM, or the ``hf`` decode loop with its KV cache)
and the trainer's ``old_logprobs`` (log π_old: the update's teacher-forced pass at the weights that sampled;
for on-policy rows the first epoch's detached log-probs) should agree; they drift with kernels, dtypes and
engines. With δ = old_logprobs − rollout_logprobs on the loss tokens (0 where the sampler's log-prob is NaN:
tokens it did not sample) and the band [lo, cap] (lo = ``clip_min``; unset: no lower bound), the modes:

  token_*      w_t = exp(δ_t)                       sequence_*  w_t = exp(Σ_s δ_s) for every token of the row
  *_truncate   w = clamp(w, lo, cap)                *_mask      w = 0 outside [lo, cap] (a zero weight: the
                                                                token or row stays in the denominators)
  geometric_mask   w_t = 1 on a row whose geometric-mean ratio g = exp(mean_s δ_s) lies in [lo, cap], else 0
  seq_mask_tis     w_t = exp(δ_t) (untruncated) on such a row, else 0

The first four are TRL's ``vllm_importance_sampling_mode`` with ``_clip_min`` / ``_clip_max``
(trl/trainer/grpo_trainer.py, ``_generate_and_score_completions``, TRL 1.16; ICEPOP's band is ``token_mask``
with both bounds); ``geometric_mask`` is SkyRL's ``sequence_mask_metric: geometric`` (``geo_mask_low`` / ``_high``)
and ``seq_mask_tis`` NeMo-RL's and OpenRLHF's ``seq-mask-tis``; g is over the row's loss tokens, a NaN one
counting as δ = 0 (NeMo-RL's rule); every mode is pinned against its reference's lines in
tests/unit/losses/test_mismatch.py. Departures: a masked row stays in the denominators (TRL's and NeMo-RL's rule;
SkyRL takes it out of its loss mask instead, so its token mean divides by the kept tokens); a NaN sampler
log-prob gives w = 1 in ``seq_mask_tis`` (TRL's rule; NeMo-RL's ``nan_to_num`` gives 0).

Every loss term's per-token loss is multiplied by w (detached), in ``update.Learner.loss``. Departure from
TRL: TRL weights only the policy-gradient term and adds its β·KL unweighted; here every term is weighted (the
update has one per-token weight for all terms, ``TokenBatch.loss_weights``). Both sides are log-probs of
logits / temperature over the full vocabulary, so under top-p the ratio carries no kept-mass factor (see
``types.Completion``). Replayed rows' behaviour log-probs are what their buffer stores (by default the
sampler's own, so their w is 1: their PPO ratio already divides by the sampler).

Metrics (over the loss tokens whose sampler log-prob is finite, of the rows the update runs; with mode none of
exp(δ), the weight that would apply):
``mismatch/kl`` = mean of k3 = exp(δ) − 1 − δ, an unbiased estimate of KL(q ‖ π_old) from q's samples;
``mismatch/max_abs_dlogp`` = max |δ|; ``mismatch/is_weight_mean`` = mean w; ``mismatch/clipped_frac`` = share of
tokens whose weight was truncated or zeroed (outside the band, or in a row the band masks);
``mismatch/masked_seq_frac`` = share of rows whose every weight is 0 (the sequence drop fraction);
``mismatch/ess`` = (Σ w)² / (n Σ w²), the effective sample size as a share of the n tokens (verl's
``rollout_is_eff_sample_size``: 1 when all weights are equal, 1/n when one token carries them all, 0 when all are
0), from the step's sums of w and w² (``effective_sample_size``), so it does not depend on the micro-batches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from groupwise.lazy import no_grad, torch

if TYPE_CHECKING:
    from torch import Tensor

MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_mask",
         "seq_mask_tis")
GEOMETRIC = ("geometric_mask", "seq_mask_tis")


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One micro-batch's correction: ``weight`` [B, T] (None with mode none) and its metrics as (sum, count)
    pairs, plus the peak ``max_abs_dlogp`` (None when no token has a sampler log-prob)."""

    weight: Tensor | None
    metrics: dict[str, tuple[float, float]]
    max_abs_dlogp: float | None


@no_grad
def importance_weights(old: Tensor, sampler: Tensor, mask: Tensor, mode: str, cap: float,
                       clip_min: float | None = None) -> tuple[Tensor, Tensor]:
    """(w [B, T], clipped [B, T] bool: outside the band) for ``mode`` (not ``none``); see the module docstring."""
    if mode not in MODES[1:]:
        raise ValueError(f"unknown importance sampling mode '{mode}'; allowed: {', '.join(MODES)}")
    delta = torch.nan_to_num((old - sampler) * mask, nan=0.0)  # NaN sampler log-prob: no correction
    lo = -math.inf if clip_min is None else clip_min
    if mode in GEOMETRIC:
        geo = torch.exp(delta.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1))  # [B, 1]
        out = ((geo < lo) | (geo > cap)).expand_as(old)
        kept = torch.ones_like(old) if mode == "geometric_mask" else torch.exp(delta)
        return kept.masked_fill(out, 0.0), out & mask
    if mode.startswith("sequence"):
        delta = delta.sum(-1, keepdim=True).expand_as(old)
    raw = torch.exp(delta)
    out = (raw < lo) | (raw > cap)
    if mode.endswith("truncate"):
        return torch.clamp(raw, min=clip_min, max=cap), out & mask
    return raw.masked_fill(out, 0.0), out & mask


@no_grad
def mismatch(old: Tensor, sampler: Tensor, mask: Tensor, mode: str, cap: float,
             clip_min: float | None = None) -> Mismatch:
    """The IS weight for ``mode`` and the mismatch metrics of one micro-batch ([B, T], ``mask`` bool)."""
    known = mask & torch.isfinite(sampler)
    n = float(known.sum())
    delta = torch.where(known, old - sampler, torch.zeros_like(old)).double()
    if mode == "none":
        weight, shown, clipped = None, torch.exp(delta), torch.zeros_like(known)
    else:
        weight, clipped = importance_weights(old, sampler, mask, mode, cap, clip_min)
        shown = weight.double()
    if not n:
        return Mismatch(weight, {}, None)
    k = known.double()
    rows = known.any(-1)
    dropped = rows & ~((shown != 0) & known).any(-1)  # rows with sampler log-probs, every weight 0
    metrics = {"mismatch/kl": (float(((torch.exp(delta) - 1 - delta) * k).sum()), n),
               "mismatch/is_weight_mean": (float((shown * k).sum()), n),
               "mismatch/is_weight_sq_mean": (float((shown.square() * k).sum()), n),
               "mismatch/clipped_frac": (float((clipped & known).sum()), n),
               "mismatch/masked_seq_frac": (float(dropped.sum()), float(rows.sum()))}
    return Mismatch(weight, metrics, float(delta.abs().max()))


def effective_sample_size(metrics: dict[str, float]) -> None:
    """Replaces the step's ``mismatch/is_weight_sq_mean`` (a mean over the same tokens as ``is_weight_mean``) by
    ``mismatch/ess`` = mean(w)² / mean(w²) (0 when every weight is 0), in place; nothing when the step logged no
    mismatch."""
    sq = metrics.pop("mismatch/is_weight_sq_mean", None)
    if sq is not None:
        metrics["mismatch/ess"] = metrics["mismatch/is_weight_mean"] ** 2 / sq if sq > 0 else 0.0
