"""``think_mode``: the mode-shaped reward of adaptive think modes (arXiv:2608.20256, "Learning When to Think").

The policy's first token picks a mode m ∈ {<NT>, <SH>, <LG>} (the ``think_modes`` group builder records it
in ``Sample.meta``); each mode has a hard cap on the tokens after the mode token and a reward curve that is
best at a different length, so GRPO itself learns to route easy problems to cheap modes:

  R(m, c, L) = c · 1[L ≤ cap_m] · b_m · γ_m^L,   γ_m = b_m^(−1/cap_m)   (cap-anchored, spec §2 [design])

c ∈ {0, 1} is the verifier's verdict, L the tokens after the mode tag (EOS included; a tag may be several
tokens, ``meta["mode_len"]``), b_m the mode's base
value. With the defaults b_NT = 1.5, b_SH = 1.25, b_LG = 1 (γ_LG = 1, so Long is a constant 1 when
correct), every mode's reward equals Long's exactly at its own cap, R(m, 1, cap_m) = 1, and the crossover
lengths are ordered L*(NT, SH) < L*(SH, LG) = cap_SH.

Design choices (the paper's constants are unknown; spec §2): the cap-anchored γ is the default and an
explicit ``gamma_*`` in (0, 1] overrides it. Caps have one source of truth, the builder, which writes
``meta["mode_cap"]`` on every sample; a rollout the builder marks ``over_cap`` (its mode's cap cut it off)
or ``mode == "invalid"`` (first token not an allowed mode: a format failure) gets 0.
"""

from __future__ import annotations

import dataclasses
import math

from groupwise.rewards import REWARDS
from groupwise.types import Group

MODE_NAMES = ("NT", "SH", "LG")


def shaped_reward(correct: bool, length: int, cap: int, base: float, gamma: float = 0.0) -> float:
    """R = c · 1[L ≤ cap] · b · γ^L with γ = b^(−1/cap) unless ``gamma`` > 0 is given."""
    if not correct or length > cap:
        return 0.0
    g = gamma if gamma > 0 else base ** (-1.0 / cap)
    return base * g**length


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThinkModeRewardConfig:
    base_nt: float = 1.5
    """b_NT: NoThink's reward at length 0 (spec default 1.5; the spec suggests sweeping {1.25, 1.5, 2})."""
    base_sh: float = 1.25
    """b_SH: Short's reward at length 0."""
    base_lg: float = 1.0
    """b_LG: Long's reward (constant when γ_LG = 1)."""
    gamma_nt: float = 0.0
    """γ_NT per-token discount; 0 means cap-anchored, b_NT^(−1/cap_NT)."""
    gamma_sh: float = 0.0
    gamma_lg: float = 1.0
    """γ_LG = 1: a correct Long rollout earns b_LG whatever its length (the paper's constant 1.0)."""

    def __post_init__(self) -> None:
        for m in MODE_NAMES:
            b, g = getattr(self, f"base_{m.lower()}"), getattr(self, f"gamma_{m.lower()}")
            if not (math.isfinite(b) and b > 0):
                raise ValueError(f"base_{m.lower()}={b}: must be a finite number > 0")
            if not 0 <= g <= 1:
                raise ValueError(f"gamma_{m.lower()}={g}: allowed 0 (cap-anchored) or a discount in (0, 1]")


@REWARDS.register("think_mode", config=ThinkModeRewardConfig, requires=("think_modes",))
def think_mode(cfg: ThinkModeRewardConfig, env):
    params = {f"<{m}>": (getattr(cfg, f"base_{m.lower()}"), getattr(cfg, f"gamma_{m.lower()}")) for m in MODE_NAMES}

    def term(groups: list[Group], step: int) -> list[list[float]]:
        out = []
        for g in groups:
            row = []
            for s in g.samples:
                mode = s.meta.get("mode", "invalid")
                if mode not in params or s.meta.get("over_cap", False):
                    row.append(0.0)
                    continue
                base, gamma = params[mode]
                # L counts the tokens after the mode tag (the builder's cap counts the same tokens)
                row.append(shaped_reward(s.correct, s.length - int(s.meta.get("mode_len", 1)),
                                         int(s.meta["mode_cap"]), base, gamma))
            out.append(row)
        return out

    return term
