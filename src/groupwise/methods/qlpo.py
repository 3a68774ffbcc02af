"""QLPO group transform: over-generate K samples per prompt, keep M chosen by length/correctness quadrant.

"QLPO: Quadrant-weighted Sampling for Length-aware Policy Optimization" (Siwei Chen, Siqi Chen, Xupeng Miao,
Bin Cui; arXiv:2607.21793). The run samples K = ``rollout.group_size`` completions per prompt; this transform
keeps ``keep`` = M of them, and reward, GRPO advantage and loss run unchanged on those M (the K − M others
are not trained on). Preferring short correct and long incorrect samples makes the group-relative
advantages push toward short successes and away from long failures, with no length term in the reward.

For a group with n+ correct and n− = K − n+ incorrect samples (``Sample.correct``, the verifier's verdict):
  quotas     m+ = ⌊M·n+/K + ½⌋ (round half up, exact integer arithmetic), m− = M − m+; if both pools are
             non-empty, m+ is clamped to [1, M − 1] so a mixed pool stays mixed (spec §4 step 3)
  quadrants  each pool is ranked by completion length (ties broken at random); its shorter ⌈n/2⌉ are
             "short", the rest "long": SC / LC in the correct pool, SI / LI in the incorrect pool
  weights    favoured members (SC, LI) weigh 1, disfavoured ones (LC, SI) weigh α (paper: α = 1/3)
  draw       m+ of the correct pool and m− of the incorrect pool by weighted sampling without replacement,
             done with exponential keys E_i / w_i (E_i ~ Exp(1); the m smallest win), which has the same
             law as drawing one at a time with probability ∝ w (Efraimidis–Spirakis). α = 0 is the limit
             α → 0+: favoured members first (uniformly), then disfavoured ones (uniformly).
The kept samples stay in their original order. Consequences, pinned in tests/unit/rollout/test_qlpo.py:
α = 1 is a ratio-preserving uniform subsample; keep = K returns every group unchanged for any α (bit-identical
to GRPO on K); the same random draws couple all α, so the kept correct samples get shorter and the kept
incorrect ones longer as α falls, draw by draw; with K = 2M and no clamp, m+ = |SC| and m− = |LI|, so α = 0
keeps exactly the m+ shortest correct and the m− longest incorrect samples.

Design choices (the paper's sampler is reconstructed, spec §4 [design]): the quota rounding and clamp, the
median-by-rank quadrant split and α as a relative weight are ours; the spec's optional ``alpha_mode:
fraction`` and continuous length weights are not implemented. Randomness comes only from ``ctx.rng("qlpo")``
(one generator per call). Metrics, over all groups the transform saw in the step: quadrant shares of the
pool and of the kept samples ``rollout/qlpo_{sc,lc,si,li}_frac_{before,after}``, mean length and correct
share before/after, and ``rollout/qlpo_pool_tokens`` (completion tokens of all K samples, discarded ones
included, as seen by the transform; the trainer's ``perf/gen_tokens`` also counts every generated token,
discarded samples included).
"""

from __future__ import annotations

import dataclasses

from groupwise.lazy import torch
from groupwise.rollout import TRANSFORMS
from groupwise.rollout.base import RolloutContext
from groupwise.types import Group

QUADRANTS = ("sc", "lc", "si", "li")
FAVOURED = ("sc", "li")


@dataclasses.dataclass(frozen=True, kw_only=True)
class QLPOConfig:
    keep: int = 8
    """M, the samples kept per group (the GRPO group); the run's ``rollout.group_size`` is K (paper: 16 -> 8)."""
    alpha: float = 1 / 3
    """Weight of the disfavoured quadrants (long correct, short incorrect) against 1 for the favoured ones."""

    def __post_init__(self) -> None:
        if self.keep < 2:
            raise ValueError(f"keep={self.keep}: must be >= 2 (a group-relative advantage needs two samples)")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha={self.alpha}: must be in [0, 1] (1 = uniform subsample, 0 = deterministic)")

    def check(self, run) -> None:
        k = run.rollout.group_size
        if self.keep > k:
            raise ValueError(f"keep={self.keep} exceeds rollout.group_size={k}: QLPO keeps M <= K of the K samples")


def positive_quota(n_pos: int, k: int, m: int) -> int:
    """m+ = ⌊M·n+/K + ½⌋, clamped to [1, M − 1] when the pool is mixed."""
    m_pos = (2 * m * n_pos + k) // (2 * k)  # round half up without floats
    return min(max(m_pos, 1), m - 1) if 0 < n_pos < k else m_pos


def quadrants(lengths: list[int], correct: list[bool], tiebreak: list[float]) -> list[str]:
    """Each sample's quadrant: the shorter ⌈n/2⌉ of its pool (by length, then ``tiebreak``) are short."""
    out = [""] * len(lengths)
    for flag, short, long_ in ((True, "sc", "lc"), (False, "si", "li")):
        pool = sorted((i for i, c in enumerate(correct) if c == flag), key=lambda i: (lengths[i], tiebreak[i]))
        n_short = (len(pool) + 1) // 2
        for rank, i in enumerate(pool):
            out[i] = short if rank < n_short else long_
    return out


def select(lengths: list[int], correct: list[bool], keep: int, alpha: float,
           gen: torch.Generator) -> tuple[list[int], list[str]]:
    """Indices kept (ascending) and every sample's quadrant, for one group of K = len(lengths) samples."""
    k = len(lengths)
    tiebreak = torch.rand(k, generator=gen, dtype=torch.float64).tolist()
    clocks = torch.empty(k, dtype=torch.float64).exponential_(generator=gen).tolist()  # E_i ~ Exp(1)
    quad = quadrants(lengths, correct, tiebreak)

    def key(i: int) -> tuple[int, float]:
        if quad[i] in FAVOURED:
            return 0, clocks[i]
        # weight α: key E/α; α = 0 puts disfavoured members after every favoured one, still in E order
        return (0, clocks[i] / alpha) if alpha > 0 else (1, clocks[i])

    m_pos = positive_quota(sum(correct), k, keep)
    chosen: list[int] = []
    for flag, m in ((True, m_pos), (False, keep - m_pos)):
        chosen += sorted((i for i in range(k) if correct[i] == flag), key=key)[:m]
    return sorted(chosen), quad


class QLPOTransform:
    """Keeps ``cfg.keep`` samples of every group (see the module docstring); exposes per-step ``metrics()``."""

    def __init__(self, cfg: QLPOConfig):
        self.cfg = cfg
        self._step: int | None = None
        self._counts: dict[str, float] = {}

    def __call__(self, groups: list[Group], ctx: RolloutContext) -> list[Group]:
        if ctx.step != self._step:  # statistics cover every call of one step (refills included)
            self._step, self._counts = ctx.step, {}
        gen = ctx.rng("qlpo")
        out = []
        for g in groups:
            lengths, correct = [s.length for s in g.samples], [bool(s.correct) for s in g.samples]
            keep = min(self.cfg.keep, len(lengths))
            chosen, quad = select(lengths, correct, keep, self.cfg.alpha, gen)
            self._count("before", [(quad[i], lengths[i], correct[i]) for i in range(len(lengths))])
            self._count("after", [(quad[i], lengths[i], correct[i]) for i in chosen])
            keep_all = len(chosen) == len(g.samples)
            out.append(g if keep_all else dataclasses.replace(g, samples=[g.samples[i] for i in chosen]))
        return out

    def _count(self, when: str, rows: list[tuple[str, int, bool]]) -> None:
        c = self._counts
        for q, length, ok in rows:
            c[f"{q}_{when}"] = c.get(f"{q}_{when}", 0.0) + 1
            c[f"n_{when}"] = c.get(f"n_{when}", 0.0) + 1
            c[f"len_{when}"] = c.get(f"len_{when}", 0.0) + length
            c[f"correct_{when}"] = c.get(f"correct_{when}", 0.0) + ok

    def metrics(self) -> dict[str, float]:
        c, out = self._counts, {}
        for when in ("before", "after"):
            n = c.get(f"n_{when}", 0.0)
            if n == 0:
                continue
            for q in QUADRANTS:
                out[f"rollout/qlpo_{q}_frac_{when}"] = c.get(f"{q}_{when}", 0.0) / n
            out[f"rollout/qlpo_len_mean_{when}"] = c[f"len_{when}"] / n
            out[f"rollout/qlpo_correct_frac_{when}"] = c[f"correct_{when}"] / n
        if "len_before" in c:
            out["rollout/qlpo_pool_tokens"] = c["len_before"]
        return out


@TRANSFORMS.register("qlpo", config=QLPOConfig, reports=True)
def qlpo(cfg: QLPOConfig, env) -> QLPOTransform:
    return QLPOTransform(cfg)
