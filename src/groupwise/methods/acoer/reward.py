"""ACOER reward term: a correct-only brevity bonus whose weight and length budget follow a control loop.

"Beyond Penalizing Mistakes: Stabilizing Efficiency Training in Large Reasoning Models via Adaptive
Correct-Only Rewards" (Jungseob Lee et al.; arXiv:2606.22716; official code github.com/js-lee-AI/ACOER,
``acoer/reward.py``, which this follows). Per sample, with ℓ its length and B_t, α_t the current budget and weight:

  incorrect (or unparseable)   R = 0
  correct                      R = 1 + α_t · f(n),   n = min(ℓ / B_t, 1)
                               f(n) = log(1 + s·(1 − n)) / log(1 + s)   (mode "log", s = ``log_scale`` = 5)
                               f(n) = 1 − n                              (mode "linear")

so R ∈ [1, 1 + α_t] for correct samples, non-increasing in ℓ and exactly 1 for ℓ ≥ B_t. The term already
contains correctness: use it *instead of* ``correctness`` in ``reward.terms``. An all-incorrect group gets
all-zero rewards, hence zero advantages under any normalisation (no length signal among wrong answers;
contrast ``length_penalty``). Control loop, once per reward call, after the call's rewards are computed (so a
batch is scored with the α and budget set by earlier batches):

  EMA (decay d = 2/(span + 1)) of the call's accuracy and of the mean length of its correct samples;
  the EMA accuracy is appended to a history; once step >= ``warmup_steps`` and the history holds ``window``
  entries, with the value ``window − 1`` calls back as reference:
      α ← max(α_min, down·α)  if EMA_acc(ref) − EMA_acc(now) > ``acc_drop_threshold``
      α ← min(α_max, up·α)    otherwise
      B ← max(B_min, ``budget_ratio`` · EMA_len)   (just below the current mean correct length)

Conventions and deviations: lengths are completion tokens (``Sample.length``, EOS included) by default; the
official code counts think-block characters with a 4-chars-per-token heuristic. ``length_unit: think_chars``
measures the characters inside ``<think>...</think>`` instead (0 if absent, as upstream), with the budgets then
in characters (no tokenizer needed; the embedded lab tokenizer has one token per character). Warm-up counts
training steps (``step``, as upstream's trainer callback); the window and the EMAs count reward calls, so
dynamic-sampling refills advance them faster. Deviation: a call with no correct sample leaves the length EMA
unchanged (upstream folds in a mean length of 0, which drags the budget down after a bad batch). The
neutral setting α_init = α_min = α_max = 0 equals ``correctness``. The companion format reward is the
separate ``format`` term. State (α, B, EMAs, history, calls) is checkpointed; metrics ``reward/acoer_*``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Literal

from groupwise.rewards import REWARDS
from groupwise.types import Group, Sample

_THINK = re.compile(r"<think>(.*?)</think>", re.S)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ACOERConfig:
    alpha_init: float = 0.02
    alpha_min: float = 0.01
    alpha_max: float = 0.5
    alpha_up: float = 1.02
    """Multiplier of α when accuracy holds."""
    alpha_down: float = 0.95
    """Multiplier of α when EMA accuracy drops by more than ``acc_drop_threshold`` over the window."""
    acc_drop_threshold: float = 0.02
    ema_span: int = 50
    window: int = 100
    """Reward calls between the compared EMA accuracies (the reference is ``window - 1`` calls back)."""
    warmup_steps: int = 200
    """Training steps before α and the budget may move."""
    budget_init: float = 4096.0
    """B_0 in ``length_unit`` (upstream: 4,096 max thinking tokens)."""
    budget_min: float = 512.0
    budget_ratio: float = 0.85
    mode: Literal["log", "linear"] = "log"
    log_scale: float = 5.0
    """s in f(n) = log(1 + s(1 - n)) / log(1 + s) (mode "log" only)."""
    length_unit: Literal["tokens", "think_chars"] = "tokens"

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha_min <= self.alpha_init <= self.alpha_max:
            raise ValueError(f"alpha_min={self.alpha_min}, alpha_init={self.alpha_init}, alpha_max={self.alpha_max}:"
                             " need 0 <= alpha_min <= alpha_init <= alpha_max")
        if self.alpha_up < 1.0 or not 0.0 < self.alpha_down <= 1.0:
            raise ValueError(f"alpha_up={self.alpha_up}, alpha_down={self.alpha_down}: need up >= 1 and 0 < down <= 1")
        if self.budget_min <= 0 or self.budget_init < self.budget_min:
            raise ValueError(f"budget_init={self.budget_init}, budget_min={self.budget_min}:"
                             " need 0 < budget_min <= budget_init")
        if self.budget_ratio <= 0 or self.log_scale <= 0 or self.acc_drop_threshold < 0:
            raise ValueError("budget_ratio and log_scale must be > 0, acc_drop_threshold >= 0")
        if self.ema_span < 1 or self.window < 1 or self.warmup_steps < 0:
            raise ValueError(f"ema_span={self.ema_span}, window={self.window}, warmup_steps={self.warmup_steps}:"
                             " need ema_span, window >= 1 and warmup_steps >= 0")


def efficiency(length: float, budget: float, mode: str, log_scale: float) -> float:
    """f(n) with n = min(ℓ / B, 1): 1 for an empty trace, 0 at or beyond the budget."""
    n = min(length / budget, 1.0)
    if mode == "log":
        return math.log1p(log_scale * (1.0 - n)) / math.log1p(log_scale)
    return 1.0 - n


class ACOER:
    """The stateful reward term: ``term(groups, step) -> rewards``, plus state_dict / metrics."""

    def __init__(self, cfg: ACOERConfig):
        self.cfg = cfg
        self.alpha = cfg.alpha_init
        self.budget = cfg.budget_init
        self.ema_acc: float | None = None
        self.ema_len: float | None = None
        self.history: list[float] = []  # EMA accuracy after each call, the last ``window`` of them
        self.calls = 0
        self.bonus_mean = 0.0

    def length(self, s: Sample) -> float:
        if self.cfg.length_unit == "tokens":
            return float(s.length)
        m = _THINK.search(s.text)
        return float(len(m.group(1))) if m else 0.0

    def __call__(self, groups: list[Group], step: int) -> list[list[float]]:
        c = self.cfg
        out, correct_lengths, bonuses, n = [], [], [], 0
        for g in groups:
            row = []
            for s in g.samples:
                n += 1
                if not s.correct:
                    row.append(0.0)
                    continue
                correct_lengths.append(self.length(s))
                bonuses.append(self.alpha * efficiency(correct_lengths[-1], self.budget, c.mode, c.log_scale))
                row.append(1.0 + bonuses[-1])
            out.append(row)
        self.bonus_mean = sum(bonuses) / len(bonuses) if bonuses else 0.0
        if n:
            self.update(len(correct_lengths) / n, correct_lengths, step)
        return out

    def update(self, acc: float, correct_lengths: list[float], step: int) -> None:
        """Fold one call's statistics into the EMAs, then run the α / budget controller."""
        c, d = self.cfg, 2.0 / (self.cfg.ema_span + 1)
        self.calls += 1
        self.ema_acc = acc if self.ema_acc is None else d * acc + (1 - d) * self.ema_acc
        if correct_lengths:
            mean_len = sum(correct_lengths) / len(correct_lengths)
            self.ema_len = mean_len if self.ema_len is None else d * mean_len + (1 - d) * self.ema_len
        self.history = [*self.history, self.ema_acc][-c.window:]
        if step < c.warmup_steps or len(self.history) < c.window:
            return
        if self.history[0] - self.ema_acc > c.acc_drop_threshold:
            self.alpha = max(c.alpha_min, self.alpha * c.alpha_down)
        else:
            self.alpha = min(c.alpha_max, self.alpha * c.alpha_up)
        if self.ema_len is not None and self.ema_len > 0:
            self.budget = max(c.budget_min, c.budget_ratio * self.ema_len)

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "budget": self.budget, "ema_acc": self.ema_acc, "ema_len": self.ema_len,
                "history": list(self.history), "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha, self.budget = float(state["alpha"]), float(state["budget"])
        self.ema_acc, self.ema_len = state["ema_acc"], state["ema_len"]
        self.history, self.calls = [float(x) for x in state["history"]], int(state["calls"])

    def metrics(self) -> dict[str, float]:
        out = {"reward/acoer_alpha": self.alpha, "reward/acoer_budget": self.budget,
               "reward/acoer_bonus_mean": self.bonus_mean}
        if self.ema_acc is not None:
            out["reward/acoer_ema_acc"] = self.ema_acc
        if self.ema_len is not None:
            out["reward/acoer_ema_len"] = self.ema_len
        return out


@REWARDS.register("acoer", config=ACOERConfig, stateful=True, reports=True)
def acoer(cfg: ACOERConfig, env) -> ACOER:
    return ACOER(cfg)
