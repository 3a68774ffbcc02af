"""``dre``: Dynamic Rollout Editing (arXiv:2606.17890), a group transform that cuts post-answer thinking.

Overthinking as a credit-assignment failure: GRPO gives a successful rollout one sequence-level credit, so
the useful prefix and the useless thinking after the answer emerged are reinforced together. DRE edits each
successful rollout that keeps thinking after its answer, y' = y[:t*] ⊕ c ⊕ z, and places the edit in the group.

  * Detector (text, the spec's default): t* is the end of the first commitment inside the thinking span
    (``commit_pattern``, the lab's ``so X.``) whose X the task verifies as the gold answer
    (``ctx.task.verify(problem, answer_template.format(X))``). Earlier commitments to wrong values do not
    count; a trace whose correct answer first appears at ``</think>`` has no tail.
  * Detector (``probe``, the spec's option): a step boundary is the end of each ``boundary_pattern`` match
    inside the thinking span (default ``[;.]``: the lab's steps end with ``;``, its commitment ``so X.`` with
    ``.``), rounded up to the end of the token that holds it; ``</think>`` itself is not a boundary. At each
    boundary b of a correct rollout the policy greedily decodes (T=0, ``probe_max_tokens``, stopping at the
    answer template's closing text) after prompt ⊕ y[:b] ⊕ ``probe_suffix`` (default ``</think>`` + the
    template's opening, the lab's ``</think><answer>``), and suffix ⊕ decoded text goes to the verifier. t* is
    the first boundary whose forced answer verifies together with the next ``m_stable`` − 1 boundaries'
    (default 1). All probes of a call are one generator call (``ctx.rng("dre/probe")``); only boundaries that
    could start an eligible tail (and the m_stable − 1 after them) are probed, since a later t* is ineligible
    anyway. Cost: ``rollout/dre_probes`` rows and ``rollout/dre_probe_tokens`` decoded tokens per step; they go
    through ``ctx.generator``, so the trainer's ``perf/gen_tokens`` (and ``perf/prompt_tokens``) count them.
    A policy whose forced answer turns right exactly at the verified commitment gives the text detector's
    edits (test). Scoring the gold answer's likelihood instead of decoding is not built.
  * Eligible iff correct, and L_tail = (tokens from t* to ``</think>``) ≥ max(τ_abs, τ_rel · L_think), with
    L_think the tokens between ``<think>`` and ``</think>``.
  * Edit (``copy`` answer mode): c = the original ``</think>`` token and z = the original answer section, so
    y' is y with the tail tokens y[t*:think_end] deleted. y' is scored with ``ctx.score`` (every reward
    term) and kept only if the verifier accepts it; otherwise the original stays unedited.
  * Edit (``regen`` answer mode): c = ``think_close`` (tokenized alone, forced) and z ~ π_old(· | prompt ⊕ y[:t*]
    ⊕ c), sampled at the run's temperature / top-p / stop strings, capped at ``regen_max_tokens`` and at what
    ``rollout.max_completion_tokens`` leaves; one generator call for all chosen edits (``ctx.rng("dre/regen")``),
    ``rollout/dre_regen_tokens`` per step (also in ``perf/gen_tokens``). Scored and verified as in copy mode.
  * ``replace`` (default): y' takes y's place. Its reward equals y's under a correctness reward, so every
    advantage is unchanged; the prefix keeps its credit, the early ``</think>`` earns it, the tail earns none.
  * ``append_margin``: y' is appended (the group grows to G + n_edit) and the original's reward drops by δ
    (1 → 1 − δ for 0/1 rewards, ``meta["dre_margin"] = −δ``); advantages are computed by the engine after
    transforms, over the augmented group, so A(y') > A(y) > A(failures).
  * Log-probs: the prefix keeps its ``rollout_logprobs``; the edited tokens the generator never sampled in this
    context (c, and z in copy mode) carry NaN, a regenerated z the sampler's own log-probs, and the whole row
    gets ``old_logprobs = None``. The update then
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
Not implemented (spec options): the spec's ``rethink_budget`` (regenerating a shortened thinking instead of
deleting it) and the probe's gold-answer scoring variant; stateful reward terms see the edited samples scored
as an extra call.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from typing import Literal

from groupwise.lazy import torch
from groupwise.rollout import TRANSFORMS
from groupwise.rollout.base import Request, RolloutContext, char_ends, token_index, verified
from groupwise.types import Completion, Group, Problem, Sample


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
    detector: Literal["text", "probe"] = "text"
    """How t* is found: ``text`` (first verified commitment) or ``probe`` (a forced answer at each step boundary)."""
    boundary_pattern: str = r"[;.]"
    """probe: a step boundary is the end of each match inside the thinking span (lab: ``…;`` steps, ``so X.``)."""
    m_stable: int = 1
    """probe: t* is the first boundary whose forced answer, and those of the next m_stable − 1, verify."""
    probe_max_tokens: int = 16
    """probe: the greedy answer's token cap."""
    probe_suffix: str | None = None
    """probe: the answer-forcing suffix; None means think_close + answer_template's text before '{}'."""
    answer_mode: Literal["copy", "regen"] = "copy"
    """z: the original answer section (``copy``) or a fresh sample after y[:t*] ⊕ think_close (``regen``)."""
    regen_max_tokens: int = 32
    """regen: the answer's token cap (cut further so the row stays within the run's completion cap)."""

    def __post_init__(self) -> None:
        if self.tau_abs < 0 or self.tau_rel < 0 or not 0 < self.delta < 1 or not 0 <= self.p_edit <= 1:
            raise ValueError(f"tau_abs={self.tau_abs}, tau_rel={self.tau_rel}, delta={self.delta}, p_edit="
                             f"{self.p_edit}: need tau_* >= 0, delta in (0, 1), p_edit in [0, 1]")
        if self.max_edits_per_group is not None and self.max_edits_per_group < 0:
            raise ValueError(f"max_edits_per_group={self.max_edits_per_group}: must be >= 0 (or null for G/2)")
        if re.compile(self.commit_pattern).groups < 1 or "{}" not in self.answer_template:
            raise ValueError("commit_pattern needs one capture group and answer_template one '{}'")
        try:
            re.compile(self.boundary_pattern)
        except re.error as e:
            raise ValueError(f"boundary_pattern={self.boundary_pattern!r}: allowed a regex ({e})") from None
        for name, allowed in (("detector", ("text", "probe")), ("answer_mode", ("copy", "regen"))):
            if getattr(self, name) not in allowed:  # the loader checks the Literal; this covers direct construction
                raise ValueError(f"{name}={getattr(self, name)!r}: allowed {', '.join(allowed)}")
        for name in ("m_stable", "probe_max_tokens", "regen_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: allowed >= 1")

    @property
    def suffix(self) -> str:
        """The probe's answer-forcing suffix (lab: ``</think><answer>``)."""
        return self.probe_suffix if self.probe_suffix is not None else \
            self.think_close + self.answer_template.split("{}", 1)[0]


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


def token_ceil(ends: list[int], char: int) -> int:
    """The number of tokens up to and including the one that holds character ``char − 1`` (rounds a boundary
    inside a token up to that token's end)."""
    return bisect.bisect_left(ends, char) + 1


@dataclasses.dataclass
class Edit:
    index: int  # sample index in the group
    think_end: int  # token index of the closing tag
    l_think: int
    t_star: int | None = None  # tokens kept before the closing cue (None: no answer emerged)
    boundaries: list[int] = dataclasses.field(default_factory=list)  # probe: token counts at step boundaries

    @property
    def tail(self) -> int:
        return self.think_end - self.t_star


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
        found = [[self._analyse(s, grp.problem, j, ctx) for j, s in enumerate(grp.samples)] for grp in groups]
        if cfg.detector == "probe":
            self._probe(groups, found, ctx)
        picks = []
        for grp, edits in zip(groups, found):
            eligible = [e for e in edits if e is not None and e.t_star is not None and grp.samples[e.index].correct
                        and e.tail >= self._min_tail(e) and e.tail > 0]
            self._add("eligible", len(eligible))
            draws = torch.rand(len(eligible), generator=rng).tolist()
            chosen = [e for e, u in zip(eligible, draws) if u < cfg.p_edit]
            if len(chosen) > cap:
                keep = torch.randperm(len(chosen), generator=rng)[:cap].sort().values.tolist()
                chosen = [chosen[k] for k in keep]
            picks.append(chosen)
        answers = self._regen(groups, picks, ctx) if cfg.answer_mode == "regen" else None
        for k, (grp, chosen) in enumerate(zip(groups, picks)):
            if chosen:
                self._apply(grp, chosen, answers[k] if answers else None, ctx)
        return groups

    def _min_tail(self, e: Edit) -> float:
        return max(self.cfg.tau_abs, self.cfg.tau_rel * e.l_think)

    def _analyse(self, s: Sample, problem: Problem, j: int, ctx: RolloutContext) -> Edit | None:
        """Locate the thinking span of one rollout, log the tail diagnostics, and (text detector) find t*."""
        cfg, probe = self.cfg, self.cfg.detector == "probe"

        def is_gold(x: str) -> bool:  # the probe detector needs no verified commitment: spare the verifier
            return not probe and verified(ctx, problem, cfg.answer_template.format(x))

        self._add("n", 1)
        span = find_span(s.text, is_gold, cfg)
        if span is None or (span.first_commit_end is None and not (probe and s.correct)):
            return None
        ends = char_ends(s.completion_ids.tolist(), ctx.tokenizer)
        start, close = token_index(ends, span.think_start), token_index(ends, span.think_end)
        first = token_index(ends, span.first_commit_end) if span.first_commit_end is not None else None
        if start is None or close is None or (first is None and not probe):
            return None
        l_think = close - start
        if first is not None:
            kind = "correct" if s.correct else "incorrect"
            self._add(f"tail_{kind}", close - first)
            self._add(f"ot_{kind}", (close - first) / max(l_think, 1))
            self._add(f"with_commit_{kind}", 1)
        if probe:
            if not s.correct:  # only successful rollouts are edited
                return None
            inner = s.text[span.think_start:span.think_end]
            cuts = {token_ceil(ends, span.think_start + m.end()) for m in re.finditer(cfg.boundary_pattern, inner)}
            return Edit(j, close, l_think, boundaries=sorted(b for b in cuts if start < b < close))
        t_star = token_index(ends, span.answer_end) if span.answer_end is not None else None
        if t_star is None:
            return None
        return Edit(j, close, l_think, t_star)

    def _probe(self, groups: list[Group], found: list[list[Edit | None]], ctx: RolloutContext) -> None:
        """The probe detector, one greedy generator call for the whole batch: at step boundary b of a correct
        rollout, decode an answer after y[:b] ⊕ suffix; t* = the first b whose forced answer verifies, with the
        next m_stable − 1 boundaries' too. Only boundaries that could give an eligible edit (and the
        m_stable − 1 after them) are probed: a later t* would leave too short a tail."""
        cfg = self.cfg
        suffix = torch.tensor(ctx.tokenizer.encode(cfg.suffix, add_special_tokens=False), dtype=torch.long)
        rows = []  # (group, edit, boundary position)
        for grp, edits in zip(groups, found):
            for e in edits:
                if e is not None and grp.samples[e.index].correct:
                    n_ok = sum(e.think_end - b >= self._min_tail(e) for b in e.boundaries)  # a prefix: tail falls
                    if n_ok:
                        rows += [(grp, e, k) for k in range(min(len(e.boundaries), n_ok + cfg.m_stable - 1))]
        if not rows:
            return
        reqs = [Request(torch.cat([grp.samples[e.index].prompt_ids,
                                   grp.samples[e.index].completion_ids[:e.boundaries[k]], suffix]),
                        max_tokens=cfg.probe_max_tokens) for grp, e, k in rows]
        close = cfg.answer_template.split("{}", 1)[1]  # a probe ends with the answer's closing text
        params = dataclasses.replace(ctx.params, max_tokens=cfg.probe_max_tokens, temperature=0.0,
                                     stop=(*ctx.params.stop, close) if close else ctx.params.stop)
        outs = ctx.generator.generate(reqs, params, ctx.rng("dre/probe"))
        ok: dict[int, list[bool]] = {}
        for (grp, e, _), c in zip(rows, outs):
            forced = cfg.suffix + ctx.tokenizer.decode(c.completion_ids.tolist(), skip_special_tokens=True)
            ok.setdefault(id(e), []).append(verified(ctx, grp.problem, forced))
        self._add("probes", len(rows))
        self._add("probe_tokens", sum(int(c.completion_ids.numel()) for c in outs))
        for _, e, k in rows:
            if k == 0:
                v = ok[id(e)]
                e.t_star = next((e.boundaries[i] for i in range(len(v) - cfg.m_stable + 1)
                                 if all(v[i:i + cfg.m_stable])), None)

    def _regen(self, groups: list[Group], picks: list[list[Edit]], ctx: RolloutContext) -> list[list[Completion]]:
        """``regen`` answers, one generator call for the batch: z ~ π_old(· | prompt ⊕ y[:t*] ⊕ think_close) at
        the run's sampling settings, capped at regen_max_tokens and at what the run's completion cap leaves."""
        close = ctx.tokenizer.encode(self.cfg.think_close, add_special_tokens=False)
        reqs = [Request(torch.cat([grp.samples[e.index].prompt_ids, grp.samples[e.index].completion_ids[:e.t_star],
                                   torch.tensor(close, dtype=torch.long)]),
                        max_tokens=max(1, min(self.cfg.regen_max_tokens,
                                              ctx.params.max_tokens - e.t_star - len(close))))
                for grp, chosen in zip(groups, picks) for e in chosen]
        if not reqs:
            return [[] for _ in groups]
        params = dataclasses.replace(ctx.params, max_tokens=self.cfg.regen_max_tokens)
        outs = iter(ctx.generator.generate(reqs, params, ctx.rng("dre/regen")))
        answers = [[next(outs) for _ in chosen] for chosen in picks]
        self._add("regen_tokens", sum(int(c.completion_ids.numel()) for a in answers for c in a))
        return answers

    def _edit(self, s: Sample, e: Edit, z: Completion | None, ctx: RolloutContext) -> Sample:
        """y' = y[:t*] ⊕ c ⊕ z. ``copy``: c ⊕ z = y[think_end:], never sampled in this context: NaN. ``regen``:
        c = the closing tag, forced (NaN), and z carries the sampler's log-probs."""
        if z is None:
            tail = s.completion_ids[e.think_end:]
            new_ids, new_lps = tail, torch.full((tail.numel(),), math.nan)
            finish, meta = s.finish_reason, {}
        else:
            close = torch.tensor(ctx.tokenizer.encode(self.cfg.think_close, add_special_tokens=False), dtype=torch.long)
            new_ids = torch.cat([close, z.completion_ids])
            new_lps = torch.cat([torch.full((close.numel(),), math.nan), z.rollout_logprobs.float()])
            finish, meta = z.finish_reason, {"dre_regen": True}
        ids = torch.cat([s.completion_ids[:e.t_star], new_ids])
        return Sample(
            prompt_ids=s.prompt_ids, completion_ids=ids,
            # the PPO denominator is the current (= old) policy's own forward (old_logprobs None) on every token
            rollout_logprobs=torch.cat([s.rollout_logprobs[:e.t_star], new_lps.to(s.rollout_logprobs.dtype)]),
            loss_mask=torch.cat([s.loss_mask[:e.t_star], torch.ones(new_ids.numel(), dtype=torch.bool)]),
            finish_reason=finish, text=ctx.tokenizer.decode(ids.tolist(), skip_special_tokens=True),
            old_logprobs=None, meta={**s.meta, "dre_edited": True, "dre_removed": e.tail, **meta})

    def _apply(self, grp: Group, chosen: list[Edit], answers: list[Completion] | None, ctx: RolloutContext) -> None:
        edited = [self._edit(grp.samples[e.index], e, answers[k] if answers else None, ctx)
                  for k, e in enumerate(chosen)]
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
        out = {"rollout/dre_edited_frac": s.get("edited", 0.0) / n,
               "rollout/dre_eligible_frac": s.get("eligible", 0.0) / n,
               "rollout/dre_rejected": s.get("rejected", 0.0), "rollout/dre_tokens_removed": s.get("removed", 0.0) / n}
        if self.cfg.detector == "probe":
            out["rollout/dre_probes"] = s.get("probes", 0.0)
            out["rollout/dre_probe_tokens"] = s.get("probe_tokens", 0.0)
        if self.cfg.answer_mode == "regen":
            out["rollout/dre_regen_tokens"] = s.get("regen_tokens", 0.0)
        for kind in ("correct", "incorrect"):
            c = s.get(f"with_commit_{kind}", 0.0)
            if c:
                out[f"rollout/dre_tail_{kind}"] = s[f"tail_{kind}"] / c
                out[f"rollout/dre_ot_{kind}"] = s[f"ot_{kind}"] / c
        return out


@TRANSFORMS.register("dre", config=DREConfig, reports=True)
def dre(cfg: DREConfig, env) -> DRE:
    return DRE(cfg)
