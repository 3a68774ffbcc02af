"""The J_Q (Tsallis q-log) family, advantage stage: ``garl`` (transform) and ``paft`` (resampling weights).

Lin & Ie, "How Fast Should a Model Commit to Supervision? Training Reasoning Models on the J_Q Loss
Continuum" (arXiv:2604.25907; v1 titled "...on the Tsallis Loss Continuum"). With P_θ(x) the chance that a
sampled completion is correct, J_Q = E_x[ln_q P_θ(x)], ln_q(u) = (u^{1−q} − 1)/(1 − q) (ln_1 = log):
q = 0 is RLVR (expected reward), q = 1 log-likelihood. ∇ln_q P = P^{−q}·∇P, so every q follows the
RL gradient direction, amplified per prompt by P^{−q}: cold prompts (small P) escape faster.

``garl`` (GARL: sample from the policy, amplify the RL gradient). A transform on the configured advantage:
  A'_m = amp_i · A_m,   amp_i = min(max(P̂_i, 1/M_i)^{−q}, amp_max),   P̂_i = (1/M_i) Σ_m r_m
With ``advantage: rloo`` (A_m = r_m − mean_{m'≠m} r_m', the spec's leave-one-out baseline) this is the
spec's GARL estimator; at q = 0, amp = 1 exactly and the transform is the identity (any base advantage,
``grpo`` included, passes through bit for bit). The floor 1/M is the p → 0 clip: one success in M gives
the largest factor, M^q; ``amp_max`` (0 = off) caps it further. Degenerate groups: all-correct → amp 1;
all-wrong → amp M^q times a base advantage that is 0 for binary rewards, so no signal is created. Note
that ``grpo``'s std division already amplifies ~P̂^{−1/2} at small P̂; combine ``garl`` with ``rloo`` or
``dr_grpo`` for the paper's estimator.

``paft`` (PAFT: importance-resample successes, do SFT). An advantage estimator whose values are the SFT
weights read by the ``paft`` loss term (methods/garl/loss.py, per-token loss −w·log π). Per group, draw K_r
samples with replacement with probability ∝ r_m (uniform over successes for binary r); sample m drawn
c_m times gets
  w_m = P̂^{1−q} · M · c_m / K_r
so that, under the ``token_mean`` reduction, the step loss is (1/N) Σ_i P̂_i^{1−q} (1/K_r) Σ_k NLL(z_k)/L̄,
the spec's default (sequence NLL over the mean length). ``resample: expected`` replaces c_m by its
expectation K_r·r_m/Σr (Rao-Blackwellised): w_m = P̂^{−q}·r_m, GARL without a baseline (spec property 3).
Design choice: the weights are computed here, not in the loss term, because the resampling needs the
whole group and a loss term sees one micro-batch of rows. Draws are seeded from (step, group index,
problem id): deterministic and resume-safe. Zero successes → all weights 0; the update skips those rows.

``success``: P̂ and r from the verifier's ``correct`` flags (default) or the total reward (must lie in
[0, 1], e.g. F1-style rewards; a value outside raises).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from groupwise.advantages import ADVANTAGE_TRANSFORMS, ADVANTAGES
from groupwise.advantages.stats import group_count
from groupwise.lazy import torch
from groupwise.seeding import stable_seed
from groupwise.types import ScoredBatch

if TYPE_CHECKING:
    from torch import Tensor


def ln_q(u: Tensor, q: float) -> Tensor:
    """Tsallis q-logarithm: (u^{1−q} − 1)/(1 − q), and log u at q = 1."""
    return torch.log(u) if q == 1 else (u ** (1 - q) - 1) / (1 - q)


def success(batch: ScoredBatch, source: str) -> Tensor:
    """Per-sample success r ∈ [0, 1] as [N, G] float64 (0 on padding)."""
    r = batch.correct.to(torch.float64) if source == "correct" else batch.rewards.to(torch.float64)
    if source == "reward" and bool(((r < 0) | (r > 1))[batch.mask].any()):
        raise ValueError("success='reward' needs rewards in [0, 1]; use success='correct' for other rewards")
    return r * batch.mask


def amplification(p_hat: Tensor, m: Tensor, q: float, amp_max: float = 0.0) -> Tensor:
    """max(P̂, 1/M)^{−q}, capped at amp_max when > 0; lies in [1, M^q]."""
    amp = torch.maximum(p_hat, 1 / m.clamp(min=1)) ** (-q)
    return amp.clamp(max=amp_max) if amp_max > 0 else amp


def _check_q(q: float, extra: str = "") -> None:
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q}: the J_Q continuum needs 0 <= q <= 1 (0 = RLVR, 1 = log-likelihood){extra}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GARLConfig:
    q: float = 0.75
    """0 leaves the advantage unchanged (RLVR); the paper uses 0.75 for cold starts."""
    success: Literal["correct", "reward"] = "correct"
    amp_max: float = 0.0
    """Cap on the amplification (0: only the automatic M^q bound)."""

    def __post_init__(self) -> None:
        _check_q(self.q)
        if not (self.amp_max == 0 or self.amp_max >= 1):
            raise ValueError(f"amp_max={self.amp_max}: use 0 (off) or a cap >= 1")


@ADVANTAGE_TRANSFORMS.register("garl", config=GARLConfig, provides=("q_weighting",))
def garl(batch: ScoredBatch, adv: Tensor, cfg: GARLConfig) -> Tensor:
    m = group_count(batch.mask)
    p_hat = success(batch, cfg.success).sum(-1, keepdim=True) / m.clamp(min=1)
    return adv * amplification(p_hat, m, cfg.q, cfg.amp_max) * batch.mask


@dataclasses.dataclass(frozen=True, kw_only=True)
class PAFTConfig:
    q: float = 0.75
    success: Literal["correct", "reward"] = "correct"
    resample: Literal["sampled", "expected"] = "sampled"
    k_r: int = 0
    """Resampled sequences per group (0: the group size M)."""

    def __post_init__(self) -> None:
        _check_q(self.q)
        if self.k_r < 0:
            raise ValueError(f"k_r={self.k_r}: use 0 (the group size) or a positive count")



# its advantages are the SFT weights the 'paft' loss term reads; they already carry the J_Q factor P̂^(1−q)
@ADVANTAGES.register("paft", config=PAFTConfig, provides=("paft_weights", "q_weighting"), requires=("paft_loss",),
                     conflicts=("q_weighting",))
def paft(batch: ScoredBatch, cfg: PAFTConfig) -> Tensor:
    r = success(batch, cfg.success)
    m = group_count(batch.mask)
    total = r.sum(-1, keepdim=True)
    p_hat = total / m.clamp(min=1)
    if cfg.resample == "expected":
        share = r / total.clamp(min=1e-300)  # E[c_m] / K_r
    else:
        share = torch.zeros_like(r)
        for i in range(r.shape[0]):
            if total[i] > 0:
                k = cfg.k_r or int(m[i])
                pid = batch.groups[i].problem.id if i < len(batch.groups) else ""
                gen = torch.Generator().manual_seed(stable_seed("paft", batch.step, i, pid))
                draws = torch.multinomial(r[i], k, replacement=True, generator=gen)
                share[i] = torch.bincount(draws, minlength=r.shape[1]).to(torch.float64) / k
    return p_hat ** (1 - cfg.q) * m * share * batch.mask
