"""``lampo``: LamPO's pairwise decomposed advantage with policy-confidence weights (LambdaRank style).

Yuan, Zhou, Li, Chen, Deng, Chen, Zhao, "LamPO: A Lambda Style Policy Optimization for Reasoning Language
Models", arXiv:2605.21235 (predecessor "LambdaPO", arXiv:2605.19416). BOTH ENTRIES ARE WITHDRAWN and the
formula is reconstructed from abstracts and LambdaRank (specs §15); it is an optional estimator, never a
default. Per group of M samples with rewards R and policy scores s:
  s_i  = (1/|y_i|) Σ_t log π_old(y_i,t)            (``score: mean``; ``sum`` = raw sequence log-prob)
  w_ij = σ(−β · sgn(R_i − R_j) · (s_i − s_j))       symmetric, in (0, 1): small when the policy already
                                                    ranks the pair like the reward, large when it does not
  A_i  = (2/(M − 1)) Σ_{j≠i} (R_i − R_j) · w_ij      (``std_norm``: then / (std_M(R) + eps), ddof 1)
β = 0 gives w = 1/2 and A_i = M/(M−1)·(R_i − R̄), i.e. ``rloo`` exactly. Σ_i A_i = 0 (antisymmetric gaps,
symmetric weights); all-equal rewards and singleton groups give 0. The update keeps ``ppo_clip``.

Design choices: π_old is the generator's ``rollout_logprobs`` (the sampling policy, at the sampling
temperature; no extra forward pass), summed over loss-bearing tokens (``loss_mask``; prefilled tokens are
not the policy's choice) whose log-prob is known (edited tokens carry NaN and are skipped). A sample with
no known token gets w = 1/2 on all its pairs. The optional ROUGE-L auxiliary reward of the paper is the
reward term ``rouge_l`` (methods/lampo/rouge_l.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Literal

from groupwise.advantages import ADVANTAGES
from groupwise.advantages.stats import group_count, group_std
from groupwise.lazy import torch
from groupwise.types import ScoredBatch

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class LamPOConfig:
    beta: float = 5.0
    """β_L, the confidence temperature (0: plain leave-one-out advantage); the spec sweeps {1, 5, 10}."""
    score: Literal["mean", "sum"] = "mean"
    std_norm: bool = False
    eps: float = 1e-4

    def __post_init__(self) -> None:
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"beta={self.beta}: the confidence temperature must be finite and >= 0")
        if self.eps < 0:
            raise ValueError(f"eps={self.eps}: must be >= 0")


def sequence_scores(batch: ScoredBatch, score: str) -> tuple[Tensor, Tensor]:
    """Per-sample π_old score s [N, G] (float64) and whether it is known [N, G] (bool)."""
    s = torch.zeros(batch.rewards.shape, dtype=torch.float64)
    known = torch.zeros(batch.rewards.shape, dtype=torch.bool)
    for i, grp in enumerate(batch.groups):
        for j, smp in enumerate(grp.samples):
            lp = smp.rollout_logprobs.to(torch.float64)
            ok = smp.loss_mask & torch.isfinite(lp)
            if ok.any():
                s[i, j] = lp[ok].sum() / (ok.sum() if score == "mean" else 1)
                known[i, j] = True
    return s, known


@ADVANTAGES.register("lampo", config=LamPOConfig)
def lampo(batch: ScoredBatch, cfg: LamPOConfig) -> Tensor:
    r, m = batch.rewards, batch.mask
    s, known = sequence_scores(batch, cfg.score)
    gap = r[:, :, None] - r[:, None, :]  # [N, G, G]: R_i − R_j
    w = torch.sigmoid(-cfg.beta * torch.sign(gap) * (s[:, :, None] - s[:, None, :]))
    w = torch.where(known[:, :, None] & known[:, None, :], w, torch.full_like(w, 0.5))
    pairs = m[:, :, None] & m[:, None, :]
    n = group_count(m)
    adv = 2 / (n - 1).clamp(min=1) * (gap * w * pairs).sum(-1) * (n > 1)
    if cfg.std_norm:
        std = group_std(r, m, 1)
        adv = torch.where(std > 0, adv / (std + cfg.eps).clamp(min=1e-300), torch.zeros_like(adv))
    return adv * m
