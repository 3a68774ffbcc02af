"""``dash_drift``: DASH, drift-aware segment-level advantage shaping for overthinking (arXiv:2607.00482).

Lee, Dai, Zhou, Slavin, Su, Zhang, Sahu, Campbell, "Know When to Stop: Segment-Level Credit Assignment for
Reducing Overthinking" (no code found; spec §6, whose constants are [design]). Two registered parts, one
method: a group transform that finds each rollout's answer commitments and shapes the reward of drift traces,
and a credit component that gives each segment between commitments its own advantage.

Transform (after scoring, before advantages): commitments p_1 < ... < p_m are the matches of
``commit_pattern`` (the lab's ``so X.``), each labelled ℓ_k = the task's verifier accepting
``answer_template.format(X)``; segments S_k = (p_{k−1}, p_k], the tail after p_m joining S_m. A drift trace
(some commitment correct, the final answer wrong) gets r ← r + β · (#correct segments / #segments), β =
``drift_reward`` (0.5), so it ranks above fully wrong traces in the group baseline.
Credit (``TokenBatch.advantages``): with A the row's sequence advantage and L_ref its group's mean length,
  ℓ_k = 1   +|A| · α₊ · ρ^j        j = earlier correct commitments (repeats decay, ρ = 0.5); α_weak = 0.25
                                    replaces α₊ in drift traces (the correct prefix is weakly credited)
  ℓ_k = 0   −|A| · α₋ · w_k        w_k = min(w_max, 1 + η · d_k / L_ref), d_k = tokens from the first correct
                                    commitment to the end of S_k (0 if none came before), w_max = 2, η = 1
Segment advantages replace A (spec's resolution); rows without commitments keep A; η = 0 is the
no-escalation ablation. Metrics (transform): ``rollout/drift_frac`` (a correct commitment, a wrong final
answer), ``rollout/fix_frac`` (a wrong commitment, a correct final answer), ``rollout/tokens_after_correct``.
"""

from __future__ import annotations

import dataclasses
import re

from groupwise.credit import CREDIT
from groupwise.rollout import TRANSFORMS
from groupwise.rollout.base import RolloutContext, char_ends, token_index, verified
from groupwise.types import Group, TokenBatch


@dataclasses.dataclass(frozen=True, kw_only=True)
class DriftMarksConfig:
    commit_pattern: str = r"so ([^.;<]*)\."
    """A regex whose group 1 is a committed answer; the commitment ends where the match ends."""
    answer_template: str = "<answer>{}</answer>"
    """How a committed answer is shown to the task's verifier."""
    drift_reward: float = 0.5
    """β: a drift trace's reward gains β × its share of correct segments (0: no reward shaping)."""

    def __post_init__(self) -> None:
        if re.compile(self.commit_pattern).groups < 1 or "{}" not in self.answer_template:
            raise ValueError("commit_pattern needs one capture group and answer_template one '{}'")
        if not 0 <= self.drift_reward < 1:
            raise ValueError(f"drift_reward={self.drift_reward}: must be in [0, 1) (below a correct trace's 1)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DASHDriftConfig:
    alpha_pos: float = 1.0
    alpha_neg: float = 1.0
    repeat_decay: float = 0.5
    """ρ: the j-th repeated correct commitment gets ρ^j of the first one's credit."""
    eta: float = 1.0
    """η: escalation of a wrong segment's penalty with its distance past the first correct commitment (0: none)."""
    w_max: float = 2.0
    alpha_weak: float = 0.25
    """α_weak: the credit of correct segments in drift traces."""

    def __post_init__(self) -> None:
        if min(self.alpha_pos, self.alpha_neg, self.eta, self.alpha_weak) < 0 or not 0 < self.repeat_decay <= 1:
            raise ValueError("alpha_pos, alpha_neg, eta, alpha_weak must be >= 0 and repeat_decay in (0, 1]")
        if self.w_max < 1:
            raise ValueError(f"w_max={self.w_max}: must be >= 1 (the penalty of a segment with no earlier answer)")



def commitments(text: str, ids: list[int], tokenizer, is_gold, pattern: str) -> list[tuple[int, bool]]:
    """(tokens up to the end of the commitment, correct) for each commitment that ends on a token boundary."""
    ends = char_ends(ids, tokenizer)
    out = []
    for m in re.finditer(pattern, text):
        k = token_index(ends, m.end())
        if k is not None:
            out.append((k, bool(is_gold(m.group(1).strip()))))
    return out


class DriftMarks:
    def __init__(self, cfg: DriftMarksConfig):
        self.cfg, self._step, self._n = cfg, -1, {}

    def __call__(self, groups: list[Group], ctx: RolloutContext) -> list[Group]:
        if ctx.step != self._step:
            self._step, self._n = ctx.step, {}
        for g in groups:
            def is_gold(x: str, p=g.problem) -> bool:
                return verified(ctx, p, self.cfg.answer_template.format(x))

            for s in g.samples:
                marks = commitments(s.text, s.completion_ids.tolist(), ctx.tokenizer, is_gold, self.cfg.commit_pattern)
                s.meta["commits"] = marks
                good = [k for k, ok in marks if ok]
                drift = bool(good) and not s.correct
                s.meta["drift"] = drift
                if drift and self.cfg.drift_reward:
                    s.reward += self.cfg.drift_reward * len(good) / len(marks)
                self._add("n", 1)
                self._add("drift", drift)
                self._add("fix", s.correct and any(not ok for _, ok in marks))
                if good:
                    self._add("after", s.length - good[0])
                    self._add("with_correct", 1)
        return groups

    def _add(self, key: str, v: float) -> None:
        self._n[key] = self._n.get(key, 0.0) + float(v)

    def metrics(self) -> dict[str, float]:
        n = self._n.get("n", 0.0)
        if not n:
            return {}
        out = {"rollout/drift_frac": self._n["drift"] / n, "rollout/fix_frac": self._n["fix"] / n}
        if self._n.get("with_correct"):
            out["rollout/tokens_after_correct"] = self._n["after"] / self._n["with_correct"]
        return out


@TRANSFORMS.register("dash_drift", config=DriftMarksConfig, provides=("drift_marks",), reports=True)
def drift_marks(cfg: DriftMarksConfig, env) -> DriftMarks:
    return DriftMarks(cfg)


def segment_values(marks: list[tuple[int, bool]], a: float, drift: bool, l_ref: float,
                   cfg: DASHDriftConfig) -> list[tuple[int, int, float]]:
    """(start, end, advantage) per segment; the tail after the last commitment joins the last segment."""
    out, start, first, repeats = [], 0, None, 0
    for k, (end, ok) in enumerate(marks):
        stop = None if k == len(marks) - 1 else end  # None: to the end of the row
        if ok:
            value = abs(a) * (cfg.alpha_weak if drift else cfg.alpha_pos) * cfg.repeat_decay ** repeats
            repeats += 1
            first = end if first is None else first
        else:
            d = (end - first) if first is not None else 0
            value = -abs(a) * cfg.alpha_neg * min(cfg.w_max, 1 + cfg.eta * d / max(l_ref, 1.0))
        out.append((start, stop, value))
        start = end
    return out


@CREDIT.register("dash_drift", config=DASHDriftConfig, requires=("drift_marks",))
def dash_drift(batch: TokenBatch, cfg: DASHDriftConfig) -> TokenBatch:
    adv = batch.advantages.clone()  # [B, T]
    lengths = batch.completion_mask.sum(-1).float()
    for b, s in enumerate(batch.samples):
        marks = s.meta.get("commits") or []
        if not marks:
            continue
        same = batch.group_index == batch.group_index[b]
        l_ref = float(lengths[same].mean())
        a = float(batch.advantages[b].abs().max())
        for start, stop, value in segment_values(marks, a, bool(s.meta.get("drift")), l_ref, cfg):
            adv[b, start:stop] = value
    return dataclasses.replace(batch, advantages=adv * batch.completion_mask)
