"""``dash_opsd``: DASH, divergence-adaptive supervision horizons for on-policy self-distillation.

Hou, Tang, ..., Wang, Deng, "DASH: Divergence-Adaptive Supervision Horizons for On-Policy Self-Distillation of
Reasoning Models", arXiv:2608.06243 (code github.com/DBtxy/DASH-OPSD, not readable here; spec §3). OPSD
(``methods/opsd/loss.py``) weighs every token's divergence r_t equally; DASH turns r_t, relative to its row's mean
r̄, into a stop-gradient gate and propagates supervision backwards along the rollout:

  g_t = r_t − r̄            r̄ = mean of r over the row's loss tokens (padding and prefilled tokens excluded)
  λ_t = sg(σ(−s·κ·g_t))     κ = 5; s = ``gate_sign`` (+1: a below-mean divergence opens the gate; −1 inverts it)
  A_T = r_T,  A_t = r_t + λ_t A_{t+1},    L = (1/T) Σ_t A_t
computed in its equivalent O(T) forward-weight form (spec, derived): L = (1/T) Σ_k w_k r_k with w_1 = 1,
w_k = 1 + λ_{k−1} w_{k−1}, so the per-token loss is sg(w_t)·r_t and gradients flow only through r. Options:
``gate: fixed`` uses λ_t = ``fixed_lambda`` (the spec's fixed-λ ablation, w_k = (1 − λ^k)/(1 − λ)); ``scale_match``
divides w by its mean over the row's loss tokens (a uniform divergence then gives exactly vanilla OPSD).
λ ≡ 0 (``gate: fixed, fixed_lambda: 0``) is vanilla OPSD bit for bit.

Design choices: r_t is ``opsd``'s divergence with the same knobs (default β = 0, i.e. KL(π_T‖π_S) with the
per-entry clip τ = 0.05, the spec's default); (1/T) Σ over the row is replaced by the run's reduction
(``token_mean``, a step-global token mean, as OPSD's reference trainer; the per-sequence mean is the spec's
open question); the teacher's outputs are the ones OPSD already computes, so DASH adds no forward pass.
Metrics: ``loss/dash_weight_mean``, ``loss/dash_gate_mean`` and OPSD's.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from groupwise.lazy import torch
from groupwise.losses import LOSSES
from groupwise.losses.reduce import masked_sum_count
from groupwise.methods.opsd.loss import OPSDConfig, needs, token_divergence
from groupwise.types import LossInputs, LossTerms

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class DASHConfig(OPSDConfig):
    beta: float = 0.0
    """The divergence's β (0: KL(π_T‖π_S), the spec's default)."""
    kappa: float = 5.0
    gate: Literal["adaptive", "fixed"] = "adaptive"
    fixed_lambda: float = 0.5
    """λ for ``gate: fixed`` (the spec's ablation uses 0.5 and 0.9; 0 is vanilla OPSD)."""
    gate_sign: Literal[1, -1] = 1
    scale_match: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.kappa >= 0:
            raise ValueError(f"kappa={self.kappa}: must be >= 0")
        if not 0.0 <= self.fixed_lambda < 1.0:
            raise ValueError(f"fixed_lambda={self.fixed_lambda}: must be in [0, 1)")


def gates(r: Tensor, mask: Tensor, cfg: DASHConfig) -> Tensor:
    """λ_t [B, T] (detached): σ(−s·κ·(r_t − r̄)) with r̄ the row mean over loss tokens, or the fixed λ."""
    if cfg.gate == "fixed":
        return torch.full_like(r, cfg.fixed_lambda)
    r = r.detach()
    mean = (r * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return torch.sigmoid(-cfg.gate_sign * cfg.kappa * (r - mean))


def horizon_weights(lam: Tensor, mask: Tensor) -> Tensor:
    """w [B, T]: w = 1 at a row's first loss token, w_k = 1 + λ_prev · w_prev along its loss tokens (0 elsewhere)."""
    w = torch.zeros_like(lam)
    carry = torch.zeros(lam.shape[0], dtype=lam.dtype, device=lam.device)  # λ_prev · w_prev
    for t in range(lam.shape[1]):
        on = mask[:, t]
        w[:, t] = torch.where(on, 1.0 + carry, torch.zeros_like(carry))
        carry = torch.where(on, lam[:, t] * w[:, t], carry)  # skipped (masked) positions pass the carry on
    return w


@LOSSES.register("dash_opsd", config=DASHConfig, needs=needs)
def dash_opsd(inp: LossInputs, cfg: DASHConfig) -> LossTerms:
    r, clip = token_divergence(inp, cfg)
    m = inp.completion_mask
    lam = gates(r, m, cfg)
    w = horizon_weights(lam, m)
    if cfg.scale_match:
        w = w / ((w * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)).clamp(min=1e-12)
    metrics = {"loss/opsd_div": masked_sum_count(r.detach(), m), "loss/opsd_clip_frac": masked_sum_count(clip, m),
               "loss/dash_weight_mean": masked_sum_count(w, m), "loss/dash_gate_mean": masked_sum_count(lam, m)}
    return LossTerms(w.detach() * r, metrics)
