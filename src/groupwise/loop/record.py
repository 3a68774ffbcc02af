"""Rollout recording for ``groupwise inspect``: a bounded sample of every step's groups, one JSON line per step
in ``<run_dir>/rollouts.jsonl`` (docs/inspect.md).

Two hooks in ``trainer.rl_step``: ``seen(groups)`` after the reward stage and before the group transforms
(which samples existed), and ``record(step, rollouts, tokens, replayed)`` after the update. Per step at most
``trainer.record_groups`` groups of each kind are kept, those with a learning signal (a non-zero advantage)
picked first, in generation order: ``trained`` (fresh groups that reached the update), ``filtered`` (dropped
by the filter stage), ``dropped`` (removed whole by a transform) and ``replayed`` (the groups behind the
``TokenBatch`` rows with ``replayed`` True). Each sample carries its
reward terms, correct / format flags and ``edited`` (``meta["dre_edited"]``); a sample that existed after the
reward stage but not after the transforms (QLPO's over-generated ones, or the original of a DRE ``replace``
edit) is kept next to its group with ``dropped`` True.

Per-token signals, on the rows the update saw: ``advantage`` (after credit), ``loss_weight``, ``teacher_gap`` (log
π_T − log π_θ, only with a teacher: one policy pass and one teacher pass over the recorded rows, after the update,
through the teacher's inner object so that ``teacher/forwards`` counts training passes only) and ``mode`` (1 on
the tokens of a sample's mode tag, ``meta["mode_len"]`` of them; all 0 if its tag is invalid) and, when the
generator's log-probs are its sampling distribution's (not ``fake``), ``sampler_dlogp`` = log q − log π_old (the
sampler's log-prob minus the trainer's, the δ of ``mismatch/*`` with the sign flipped; from the update's own
forward, no extra pass; null on rows the update skipped and on tokens the sampler reports no log-prob for), with
each sample's ``sampler_logprobs`` (log q per token, null for forced tokens). Cost per step: ``perf/record_s`` (and
``perf/record_teacher_s``). Lines carry the metrics' step number (``step + 1``); a recorder created with a
resume step drops the lines after it, as ``log.Logger`` drops metric lines.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor

from groupwise.log import read_lines, write_atomic
from groupwise.teachers import TeacherWant
from groupwise.types import Group, Problem, Replayed, Sample, TokenBatch

KINDS = ("trained", "filtered", "dropped", "replayed")
Row = tuple[Sample, int | None, str]  # a sample, its TokenBatch row (None: not trained), its flag


def _num(x: float, digits: int = 4) -> float | None:
    """A JSON-safe float (NaN and inf become null), rounded to keep the file small."""
    x = float(x)
    return round(x, digits) if math.isfinite(x) else None


def _sig(x: float, digits: int = 4) -> float | None:
    """A JSON-safe float kept to ``digits`` significant digits (a sampler-trainer gap of 1e-7 stays visible)."""
    x = float(x)
    return float(f"{x:.{digits}g}") if math.isfinite(x) else None


def prompt_text(problem: Problem) -> str:
    if isinstance(problem.prompt, str):
        return problem.prompt
    return "\n".join(f"{m['role']}: {m['content']}" for m in problem.prompt)


def pick(seen: list[tuple[Group, list[Sample]]], rollouts: list[Group], tokens: TokenBatch,
         replayed: list[Replayed], n: int) -> list[tuple[str, Group, list[Row]]]:
    """The groups to record, ``n`` per kind at most: (kind, group, rows); a group's rows are its samples, then
    the ones a transform removed from it (``seen`` holds each group as it was after the reward stage). Groups
    with a learning signal (a non-zero advantage on a loss token of one of their rows) are picked before those
    without (a step of mostly all-correct or all-wrong groups still shows what it learned from); the picked
    ones keep generation order."""
    alive = {id(s) for g in rollouts for s in g.samples}
    origin = {id(s): i for i, (_, ss) in enumerate(seen) for s in ss}
    removed = {i: [s for s in ss if id(s) not in alive] for i, (_, ss) in enumerate(seen)}
    fresh = tokens.replayed.logical_not().tolist()
    row_of = {id(s): b for b, s in enumerate(tokens.samples) if fresh[b]}
    signal = (tokens.advantages != 0).logical_and(tokens.completion_mask).any(dim=1).tolist()
    candidates: list[tuple[str, Group, list[Row]]] = []

    def take(kind: str, g: Group, rows: list[Row]) -> None:
        candidates.append((kind, g, rows))

    for g in rollouts:
        i = next((origin[id(s)] for s in g.samples if id(s) in origin), None)
        extra = [(s, None, "dropped") for s in removed.pop(i, [])] if i is not None else []
        trained = any(id(s) in row_of for s in g.samples)
        rows: list[Row] = [(s, row_of.get(id(s)), "" if trained else "filtered") for s in g.samples]
        take("trained" if trained else "filtered", g, rows + extra)
    for i, ss in removed.items():  # left over: groups none of whose samples survived the transforms
        if ss:
            take("dropped", seen[i][0], [(s, None, "dropped") for s in ss])
    offset = sum(fresh)
    for r in replayed:
        take("replayed", r.group, [(s, offset + j, "replayed") for j, s in enumerate(r.group.samples)])
        offset += len(r.group.samples)
    learns = [any(b is not None and signal[b] for _, b, _ in rows) for _, _, rows in candidates]
    chosen: set[int] = set()
    for kind in KINDS:
        of_kind = [i for i, c in enumerate(candidates) if c[0] == kind]
        chosen.update(sorted(of_kind, key=lambda i: not learns[i])[:n])  # stable: signal first, then in order
    return [c for i, c in enumerate(candidates) if i in chosen]


class Recorder:
    """Writes a bounded sample of each step's rollouts (``n_groups`` per kind; 0 records nothing)."""

    def __init__(self, run_dir: str | Path | None, n_groups: int, tokenizer: Any, task: Any,
                 resume_step: int | None = None, teacher: Any = None,
                 policy_logprobs: Callable[[list[Sample]], list[Tensor]] | None = None,
                 trainer_logprobs: Callable[[int], Tensor | None] | None = None):
        """``trainer_logprobs(row)``: π_old of a TokenBatch row from the last update (``Learner.old_logprobs``);
        given, the samples carry ``sampler_logprobs`` and the ``sampler_dlogp`` signal."""
        self.path = Path(run_dir) / "rollouts.jsonl" if run_dir is not None else None  # None: writes nothing
        self.n, self.tokenizer, self.task = n_groups, tokenizer, task
        self.teacher, self.policy_logprobs, self.trainer_logprobs = teacher, policy_logprobs, trainer_logprobs
        # a fresh run's first step replaces the file; building touches nothing
        self._fresh = resume_step is None and self.path is not None
        if resume_step is not None and self.path is not None and self.path.exists():  # torn last line skipped
            keep = [raw for raw, row in read_lines(self.path) if row.get("step", 0) <= resume_step]
            write_atomic(self.path, "".join(ln + "\n" for ln in keep))

    def seen(self, groups: list[Group]) -> list[tuple[Group, list[Sample]]]:
        """After the reward stage, before the transforms: the samples that exist (each list copied, since a
        transform may edit a group in place), for ``record``. The caller keeps them with its step (a lagged
        loop rolls out step t + 1 before it records step t)."""
        return [(g, list(g.samples)) for g in groups] if self.n else []

    def record(self, step: int, rollouts: list[Group], tokens: TokenBatch, replayed: list[Replayed],
               seen: list[tuple[Group, list[Sample]]]) -> dict[str, float]:
        """Append step ``step``'s line (``rollouts``: every group after the transforms, refills included;
        ``seen``: what ``seen`` returned during its rollout stage); returns the recording cost as metrics."""
        if self._fresh:
            self.path.unlink(missing_ok=True)
            self._fresh = False
        if not self.n:
            return {}
        t0 = time.perf_counter()
        picked = pick(seen, rollouts, tokens, replayed, self.n)
        rows = [(s, b, g.problem) for _, g, rs in picked for s, b, _ in rs if b is not None]
        gaps, t_teacher = self._teacher_gap([s for s, _, _ in rows], [p for *_, p in rows])
        gap_of = {(id(s), b): gap for (s, b, _), gap in zip(rows, gaps)}
        groups = [{"kind": kind, "from_step": g.step + 1, "problem": {
            "id": g.problem.id, "prompt": prompt_text(g.problem), "answer": g.problem.answer,
            "difficulty": g.problem.difficulty},
            "samples": [self._sample(s, b, flag, tokens, gap_of.get((id(s), b))) for s, b, flag in rs]}
            for kind, g, rs in picked]
        signals = ["advantage", "loss_weight", *(["teacher_gap"] if self.teacher is not None else []), "mode",
                   *(["sampler_dlogp"] if self.trainer_logprobs is not None else [])]
        out = {"perf/record_s": time.perf_counter() - t0}
        if self.teacher is not None:
            out["perf/record_teacher_s"] = t_teacher
        line = {"step": step + 1, "signals": signals, "groups": groups,
                "cost": {"record_s": _num(out["perf/record_s"]), "teacher_s": _num(t_teacher),
                         "teacher_rows": len(gaps)}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(line, allow_nan=False) + "\n")
        return out

    def _teacher_gap(self, samples: list[Sample], problems: list[Problem]) -> tuple[list[Tensor], float]:
        """log π_T − log π_θ of every sampled token of ``samples`` (empty without a teacher), and its seconds."""
        if self.teacher is None or not samples or self.policy_logprobs is None:
            return [], 0.0
        t0 = time.perf_counter()
        student = self.policy_logprobs(samples)
        teacher = self.teacher.score(samples, problems, TeacherWant()).logprobs.float().cpu()  # [B, T]
        gaps = [teacher[k, :s.length] - student[k].float() for k, s in enumerate(samples)]
        return gaps, time.perf_counter() - t0

    def _sample(self, s: Sample, row: int | None, flag: str, tokens: TokenBatch, gap: Tensor | None) -> dict:
        n = s.length
        out: dict[str, Any] = {
            "text": s.text, "reward": _num(s.reward), "reward_terms": {k: _num(v) for k, v in s.reward_terms.items()},
            "correct": bool(s.correct), "format_ok": bool(self.task.format_ok(s.text)), "length": n,
            "finish_reason": s.finish_reason, "edited": bool(s.meta.get("dre_edited")), "mode": s.meta.get("mode"),
            "mode_forced": s.meta.get("mode_forced"), "disqualified": s.disqualified,
            "verifier_error": bool(s.verifier_error), "filtered": flag == "filtered", "dropped": flag == "dropped",
            "replayed": flag == "replayed", "advantage": None,
            "tokens": self.tokenizer.batch_decode([[i] for i in s.completion_ids.tolist()]), "signals": {}}
        sig = out["signals"]
        if row is not None:
            adv, mask = tokens.advantages[row, :n].float(), tokens.completion_mask[row, :n]
            sig["advantage"] = [_num(v) for v in adv.tolist()]
            sig["loss_weight"] = [_num(v) for v in tokens.loss_weights[row, :n].tolist()]
            out["advantage"] = _num(adv[mask].mean()) if bool(mask.any()) else 0.0
        if gap is not None:
            sig["teacher_gap"] = [_num(v) for v in gap.tolist()]
        if self.trainer_logprobs is not None:
            self._sampler(s, row, out)
        if s.meta.get("mode") is not None and n:
            tag = min(int(s.meta.get("mode_len", 1)), n)
            sig["mode"] = [1.0] * tag + [0.0] * (n - tag)
        return out

    def _sampler(self, s: Sample, row: int | None, out: dict) -> None:
        """``sampler_logprobs`` (log q) and, on a row the update ran, the ``sampler_dlogp`` signal log q − log π_old."""
        q = s.rollout_logprobs.float()
        out["sampler_logprobs"] = [_sig(v) for v in q.tolist()]
        old = self.trainer_logprobs(row) if row is not None else None
        if old is not None:
            out["signals"]["sampler_dlogp"] = [_sig(v, 3) for v in (q - old[:s.length].float().cpu()).tolist()]
