"""``dre``: Dynamic Rollout Editing (arXiv:2606.17890), a group transform that cuts post-answer thinking.

Overthinking as a credit-assignment failure: GRPO gives a successful rollout one sequence-level credit, so
the useful prefix and the useless thinking after the answer emerged are reinforced together. DRE edits each
successful rollout that keeps thinking after its answer, y' = y[:t*] ⊕ c ⊕ z, and places the edit in the group.

  * Detector (text, the spec's default): t* is the end of the first commitment inside the thinking span
    (``commit_pattern``, the lab's ``so X.``) whose X the task verifies as the gold answer
    (``ctx.task.verify(problem, answer_template.format(X))``). Earlier commitments to wrong values do not
    count; a trace whose correct answer first appears at ``</think>`` has no tail.
  * Eligible iff correct, and L_tail = (tokens from t* to ``</think>``) ≥ max(τ_abs, τ_rel · L_think), with
    L_think the tokens between ``<think>`` and ``</think>``.
  * Edit (``copy`` answer mode): c = the original ``</think>`` token and z = the original answer section, so
    y' is y with the tail tokens y[t*:think_end] deleted. y' is scored with ``ctx.score`` (every reward
    term) and kept only if the verifier accepts it; otherwise the original stays unedited.
  * ``replace`` (default): y' takes y's place. Its reward equals y's under a correctness reward, so every
    advantage is unchanged; the prefix keeps its credit, the early ``</think>`` earns it, the tail earns none.
  * ``append_margin``: y' is appended (the group grows to G + n_edit) and the original's reward drops by δ
    (1 → 1 − δ for 0/1 rewards, ``meta["dre_margin"] = −δ``); advantages are computed by the engine after
    transforms, over the augmented group, so A(y') > A(y) > A(failures).
  * Log-probs: the prefix keeps its ``rollout_logprobs``; the edited tokens (c, z), which the generator never
    sampled in this context, carry NaN, and the whole row gets ``old_logprobs = None``. The update then
    uses the current policy's detached log-probs from its first forward pass as the PPO denominator. Those
    weights are π_old (no optimizer step has happened yet this RL step), so this is exactly the spec's
    "recompute ℓ_old with one teacher-forced pass of π_old", with ρ = 1 at the first epoch, and costs no
    extra pass; later PPO epochs reuse the first epoch's values. For the prefix tokens it equals the
    generator's log-probs (same weights, same context).
  * Dynamic: emergence points are found afresh on every batch. At most ``max_edits_per_group`` edits per
    group (default G/2; when more are eligible a random subset is kept), each eligible rollout edited with
    probability ``p_edit``; all randomness from ``ctx.rng("dre")``.

Metrics (per step, ``metrics()``): ``rollout/dre_edited_frac`` (edited / all rollouts),
``rollout/dre_eligible_frac``, ``rollout/dre_rejected`` (edits the verifier refused), ``rollout/dre_tokens_removed``
(mean per rollout), and the paper's diagnostic ``rollout/dre_tail_correct`` / ``rollout/dre_tail_incorrect``:
mean tokens between the first commitment (any value) and ``</think>`` of correct / incorrect rollouts, with
``rollout/dre_ot_correct`` / ``_incorrect`` the same as a share of the thinking span (OT). Measured on the
rollouts as generated, before editing.
Not implemented (spec options): the probe detector and ``regen`` answer mode (the lab's text commitment is
exact); stateful reward terms see the edited samples scored as an extra call.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Literal

import torch

from groupwise.rollout import TRANSFORMS
from groupwise.rollout.base import RolloutContext, verified
from groupwise.types import Group, Problem, Sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class DREConfig:
    tau_abs: int = 16
    """τ_abs: minimum tail tokens to edit (spec default 16; a lab re-check ``chk 3+4=7;`` is 10 tokens)."""
    tau_rel: float = 0.1
    """τ_rel: minimum tail as a share of the thinking span."""
    mode: Literal["replace", "append_margin"] = "replace"
    delta: float = 0.25
    """δ: the original's reward margin below its edit in ``append_margin`` mode."""
    max_edits_per_group: int | None = None
    """None means half the group (G // 2, at least 1)."""
    p_edit: float = 1.0
    """Probability that an eligible rollout is edited."""
    commit_pattern: str = r"so ([^.;<]*)\."
    """A regex whose group 1 is a candidate answer; t* is the end of the whole match."""
    answer_template: str = "<answer>{}</answer>"
    """How a candidate is shown to the task's verifier."""
    think_open: str = "<think>"
    think_close: str = "</think>"

    def __post_init__(self) -> None:
        if self.tau_abs < 0 or self.tau_rel < 0 or not 0 < self.delta < 1 or not 0 <= self.p_edit <= 1:
            raise ValueError(f"tau_abs={self.tau_abs}, tau_rel={self.tau_rel}, delta={self.delta}, p_edit="
                             f"{self.p_edit}: need tau_* >= 0, delta in (0, 1), p_edit in [0, 1]")
        if self.max_edits_per_group is not None and self.max_edits_per_group < 0:
            raise ValueError(f"max_edits_per_group={self.max_edits_per_group}: must be >= 0 (or null for G/2)")
        if re.compile(self.commit_pattern).groups < 1 or "{}" not in self.answer_template:
            raise ValueError("commit_pattern needs one capture group and answer_template one '{}'")


@dataclasses.dataclass
class Span:
    """Character offsets in a completion's text: the thinking span and the commitments inside it."""

    think_start: int  # just after the opening tag
    think_end: int  # at the closing tag
    first_commit_end: int | None  # end of the first commitment (any value)
    answer_end: int | None  # end of the first commitment whose value verifies as the gold answer


def find_span(text: str, is_gold, cfg: DREConfig) -> Span | None:
    """The text detector. ``is_gold(candidate) -> bool``; None when the text has no closed thinking span."""
    a = text.find(cfg.think_open)
    b = text.find(cfg.think_close, a + len(cfg.think_open)) if a >= 0 else -1
    if b < 0:
        return None
    start = a + len(cfg.think_open)
    first = answer = None
    for m in re.finditer(cfg.commit_pattern, text[start:b]):
        first = first if first is not None else start + m.end()
        if is_gold(m.group(1).strip()):
            answer = start + m.end()
            break
    return Span(start, b, first, answer)


def char_ends(ids: list[int], tokenizer) -> list[int]:
    """ends[k] = length of the decoded text of ids[:k+1] (the completion text as ``to_sample`` decodes it)."""
    pieces = [tokenizer.decode([t], skip_special_tokens=True) for t in ids]
    full = tokenizer.decode(ids, skip_special_tokens=True)
    if "".join(pieces) == full:  # per-token decoding is exact (character and tag vocabularies)
        out, n = [], 0
        for p in pieces:
            n += len(p)
            out.append(n)
        return out
    return [len(tokenizer.decode(ids[:k + 1], skip_special_tokens=True)) for k in range(len(ids))]


def token_index(ends: list[int], char: int) -> int | None:
    """The number of tokens whose text ends exactly at ``char`` (None if ``char`` is inside a token)."""
    if char == 0:
        return 0
    for k, e in enumerate(ends):
        if e == char:
            return k + 1
        if e > char:
            return None
    return None


@dataclasses.dataclass
class Edit:
    index: int  # sample index in the group
    t_star: int  # tokens kept before the closing cue
    think_end: int  # token index of the closing tag
    l_think: int
    tail: int


class DRE:
    def __init__(self, cfg: DREConfig):
        self.cfg = cfg
        self._step = -1
        self._sums: dict[str, float] = {}

    def __call__(self, groups: list[Group], ctx: RolloutContext) -> list[Group]:
        cfg = self.cfg
        if ctx.step != self._step:
            self._step, self._sums = ctx.step, {}
        rng = ctx.rng("dre")
        cap = cfg.max_edits_per_group if cfg.max_edits_per_group is not None else max(ctx.group_size // 2, 1)
        for grp in groups:
            eligible = []
            for j, s in enumerate(grp.samples):
                edit = self._analyse(s, grp.problem, j, ctx)
                if edit is not None and s.correct and edit.tail >= max(cfg.tau_abs, cfg.tau_rel * edit.l_think) \
                        and edit.tail > 0:
                    eligible.append(edit)
            self._add("eligible", len(eligible))
            draws = torch.rand(len(eligible), generator=rng).tolist()
            chosen = [e for e, u in zip(eligible, draws) if u < cfg.p_edit]
            if len(chosen) > cap:
                keep = torch.randperm(len(chosen), generator=rng)[:cap].sort().values.tolist()
                chosen = [chosen[k] for k in keep]
            if chosen:
                self._apply(grp, chosen, ctx)
        return groups

    def _analyse(self, s: Sample, problem: Problem, j: int, ctx: RolloutContext) -> Edit | None:
        """Detect the answer emergence of one rollout and log the tail diagnostics."""
        def is_gold(x: str) -> bool:
            return verified(ctx, problem, self.cfg.answer_template.format(x))

        self._add("n", 1)
        span = find_span(s.text, is_gold, self.cfg)
        if span is None or span.first_commit_end is None:
            return None
        ends = char_ends(s.completion_ids.tolist(), ctx.tokenizer)
        start, close = token_index(ends, span.think_start), token_index(ends, span.think_end)
        first = token_index(ends, span.first_commit_end)
        if start is None or close is None or first is None:
            return None
        l_think = close - start
        kind = "correct" if s.correct else "incorrect"
        self._add(f"tail_{kind}", close - first)
        self._add(f"ot_{kind}", (close - first) / max(l_think, 1))
        self._add(f"with_commit_{kind}", 1)
        t_star = token_index(ends, span.answer_end) if span.answer_end is not None else None
        if t_star is None:
            return None
        return Edit(j, t_star, close, l_think, close - t_star)

    def _apply(self, grp: Group, chosen: list[Edit], ctx: RolloutContext) -> None:
        edited = []
        for e in chosen:
            s = grp.samples[e.index]
            keep = torch.cat([torch.arange(e.t_star), torch.arange(e.think_end, s.length)])  # drop the tail
            n_new = s.length - e.think_end
            ids = s.completion_ids[keep]
            edited.append(Sample(
                prompt_ids=s.prompt_ids, completion_ids=ids,
                # tokens after t* were never sampled in this context: NaN, and the PPO denominator is the
                # current (= old) policy's own forward (old_logprobs None)
                rollout_logprobs=torch.cat([s.rollout_logprobs[:e.t_star], torch.full((n_new,), math.nan)]),
                loss_mask=torch.cat([s.loss_mask[:e.t_star], torch.ones(n_new, dtype=torch.bool)]),
                finish_reason=s.finish_reason, text=ctx.tokenizer.decode(ids.tolist(), skip_special_tokens=True),
                old_logprobs=None, meta={**s.meta, "dre_edited": True, "dre_removed": e.tail}))
        probe = Group(problem=grp.problem, samples=edited, step=grp.step)
        ctx.score([probe])
        for e, y in zip(chosen, edited):
            if not y.correct:
                self._add("rejected", 1)
                continue
            self._add("edited", 1)
            self._add("removed", e.tail)
            if self.cfg.mode == "replace":
                grp.samples[e.index] = y
            else:
                orig = grp.samples[e.index]
                orig.reward -= self.cfg.delta
                orig.meta["dre_margin"] = -self.cfg.delta
                grp.samples.append(y)

    def _add(self, key: str, v: float) -> None:
        self._sums[key] = self._sums.get(key, 0.0) + v

    def metrics(self) -> dict[str, float]:
        s = self._sums
        n = s.get("n", 0.0)
        if not n:
            return {}
        out = {"rollout/dre_edited_frac": s.get("edited", 0.0) / n, "rollout/dre_eligible_frac": s.get("eligible", 0.0) / n,
               "rollout/dre_rejected": s.get("rejected", 0.0), "rollout/dre_tokens_removed": s.get("removed", 0.0) / n}
        for kind in ("correct", "incorrect"):
            c = s.get(f"with_commit_{kind}", 0.0)
            if c:
                out[f"rollout/dre_tail_{kind}"] = s[f"tail_{kind}"] / c
                out[f"rollout/dre_ot_{kind}"] = s[f"ot_{kind}"] / c
        return out


@TRANSFORMS.register("dre", config=DREConfig, reports=True)
def dre(cfg: DREConfig, env) -> DRE:
    return DRE(cfg)
