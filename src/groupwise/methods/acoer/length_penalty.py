"""``length_penalty``: correctness minus a length penalty applied to every answer, r = c − κ·ℓ/ℓ_max.

The plain length-shaped reward that ACOER (arXiv:2606.22716) argues against, kept as the baseline of its
side-by-side experiment (spec §7 acceptance: "GRPO + length penalty applied to all answers"). c ∈ {0, 1} is
the verifier's verdict, ℓ the completion length in tokens (``Sample.length``, EOS included), κ = ``coef``
and ℓ_max = ``max_length`` (set it to ``rollout.max_completion_tokens``); there is no clipping. The term
contains correctness: use it *instead of* ``correctness``; ``coef: 0`` equals ``correctness``.

Failure mode it documents: inside an all-incorrect group rewards differ only by −κ·ℓ/ℓ_max, and GRPO's std
normalisation rescales those small differences into unit-size advantages that favour shorter wrong answers
(tests/unit/rewards/test_acoer.py pins the contrast with ACOER, which gives that group all zeros).
"""

from __future__ import annotations

import dataclasses

from groupwise.rewards import REWARDS
from groupwise.types import Group


@dataclasses.dataclass(frozen=True, kw_only=True)
class LengthPenaltyConfig:
    coef: float = 0.2
    """κ, the penalty for a completion of length ``max_length``."""
    max_length: int = 64
    """ℓ_max in tokens (normally ``rollout.max_completion_tokens``)."""

    def __post_init__(self) -> None:
        if self.coef < 0 or self.max_length < 1:
            raise ValueError(f"coef={self.coef}, max_length={self.max_length}: need coef >= 0 and max_length >= 1")


@REWARDS.register("length_penalty", config=LengthPenaltyConfig)
def length_penalty(cfg: LengthPenaltyConfig, env):
    def term(groups: list[Group], step: int) -> list[list[float]]:
        return [[float(s.correct) - cfg.coef * s.length / cfg.max_length for s in g.samples] for g in groups]

    return term
