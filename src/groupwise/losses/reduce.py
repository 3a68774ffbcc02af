"""Loss reduction with step-global denominators, so the loss and its gradient do not depend on how the
step's rows are split into micro-batches (the bug behind TRL #2995/#3021 and verl #593).

The update computes one ``Normalizer`` per optimizer step over all rows, then reduces each micro-batch:
  token_mean           Σ_b Σ_t l_bt m_bt / tokens_step
  seq_mean_token_mean  Σ_b (Σ_t l_bt m_bt / Σ_t m_bt) / seqs_step
  seq_sum_const        Σ_b Σ_t l_bt m_bt / (seqs_step · max_completion_tokens)   (Dr.GRPO)
Summing the micro-batch results gives the full-batch value exactly. Rows without loss tokens count in
no denominator.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from groupwise.lazy import torch

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True)
class Normalizer:
    tokens: float  # loss-bearing tokens in the optimizer step
    seqs: float  # rows with at least one loss-bearing token
    const: float  # the constant of seq_sum_const (max_completion_tokens)

    @staticmethod
    def from_masks(masks: list[Tensor], const: float) -> Normalizer:
        counts = [float(m.sum()) for m in masks]
        return Normalizer(tokens=max(sum(counts), 1.0), seqs=max(float(sum(c > 0 for c in counts)), 1.0),
                          const=const)


def reduce(per_token: Tensor, mask: Tensor, norm: Normalizer, mode: str) -> Tensor:
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum() / norm.tokens
    if mode == "seq_mean_token_mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / norm.seqs
    if mode == "seq_sum_const":
        return masked.sum() / (norm.seqs * norm.const)
    raise ValueError(f"unknown reduction '{mode}'; valid: token_mean, seq_mean_token_mean, seq_sum_const")


def masked_sum_count(x: Tensor, mask: Tensor) -> tuple[float, float]:
    """A metric as (sum, count) over masked tokens, so it can be averaged across micro-batches exactly."""
    with torch.no_grad():
        return float((x * mask).sum()), float(mask.sum())
