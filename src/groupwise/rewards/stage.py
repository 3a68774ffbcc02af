"""The reward stage, owned by the loop: verify every sample (never crashing the run), then combine the
weighted reward terms into ``Sample.reward``.

  verify    ``task.verify(problem, text)`` per sample under ``verifier_timeout_s``; an exception (``sys.exit``
            included), a timeout or a verdict that is not True / False marks ``verifier_error=True`` and
            ``correct=False`` (counted in ``reward/verifier_error_frac``). A
            sample a builder disqualified (``Sample.disqualified``, e.g. over its mode's cap) is graded
            incorrect without a verifier call.
  terms     ``reward = Σ_k w_k · v_k`` over the terms whose value is not None; ``reward_terms[label]`` keeps
            each raw value (NaN for None = "not applicable"; a NaN value counts as None, as in TRL). A value
            that would make the reward non-finite (±inf, or w·v overflowing the sum) is a failure of that term
            on that sample (below), so ``Sample.reward`` is always finite.
  failures  a term that raises or runs past ``term_timeout_s`` is counted, never fatal: its values for that
            call are None, the step's count is ``reward/<label>_errors``, and the first failure of each term
            is printed once with the term's
            name, the sample and the exception's first line. A term that scores most samples but fails on
            some raises ``SampleErrors`` with its partial values (the ``python`` term does). A term that
            failed on every sample it scored in a step stops the run after that step's rollout stage
            (``check_terms``: one line naming it, with its first error), unless ``reward.fail_fast`` is false.
The timeout uses SIGALRM and is enforced only in the main thread (elsewhere verifiers run unbounded).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any

import numpy as np

from groupwise.registry import ConfigError, Entry
from groupwise.rewards.verifier import (  # noqa: F401
    WORKER_MEMORY_MB,
    VerifierTimeout,
    call_with_timeout,
    make_verifier,
)
from groupwise.types import Group, Sample


class SampleErrors(Exception):
    """A reward term's partial result: ``values`` (None where it failed) and ``errors[(group, sample)]``."""

    def __init__(self, values: list[list[float | None]], errors: dict[tuple[int, int], BaseException]):
        super().__init__(f"{len(errors)} sample(s) failed")
        self.values, self.errors = values, errors


class TermFailedEverywhere(ConfigError):
    """A reward term failed on every sample of a step (``reward.fail_fast``): a broken term, not bad data."""


def first_line(exc: BaseException) -> str:
    one = len(exc.args) == 1 and isinstance(exc.args[0], str)  # KeyError's str() is a repr: use the message
    text = (exc.args[0] if one else str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@dataclasses.dataclass
class BoundTerm:
    """A built reward term with its weight, metric label and registry entry (declared abilities)."""

    label: str
    weight: float
    term: Any
    entry: Entry | None = None


class RewardStage:
    def __init__(self, task, terms: list[BoundTerm], timeout_s: float, term_timeout_s: float = 300.0,
                 isolation: str = "alarm", fail_fast: bool = True, worker_memory_mb: int = WORKER_MEMORY_MB):
        labels = [t.label for t in terms]
        if len(set(labels)) != len(labels):
            raise ValueError(f"reward.terms: two terms share a metric name ({', '.join(labels)}); each needs its own")
        self.task, self.terms, self.timeout_s, self.term_timeout_s = task, terms, timeout_s, term_timeout_s
        self.verifier = make_verifier(task, timeout_s, isolation, worker_memory_mb)  # rewards/verifier.py
        self._step: int | None = None
        self._errors: dict[str, float] = {}
        self._scored: dict[str, float] = {}  # this step's samples each term was called on, by label
        self._first: dict[str, tuple[Group, Sample, BaseException]] = {}  # this step's first failures
        self.fail_fast = fail_fast
        self._seconds = 0.0  # this step's time in verifiers and terms (perf/reward_s)
        self._reported: set[str] = set()

    def verify(self, groups: list[Group]) -> None:
        for g in groups:
            for s in g.samples:
                if s.disqualified:
                    s.correct, s.verifier_error = False, False
                    continue
                try:
                    s.correct, s.verifier_error = self.check(g.problem, s.text), False
                except (Exception, SystemExit) as e:  # noqa: BLE001 - any verifier failure is counted, never fatal
                    s.correct, s.verifier_error = False, True
                    self._report("verifier", g, s, e, "reward/verifier_error_frac")

    def check(self, problem, text: str) -> bool:
        """The verifier's verdict on one completion (raises on any failure; callers count it)."""
        return verdict(self.verifier(problem, text))

    def __call__(self, groups: list[Group], step: int) -> None:
        if step != self._step:
            self._new_step(step)
        t0 = time.perf_counter()
        self._score(groups, step)
        self._seconds += time.perf_counter() - t0

    def _score(self, groups: list[Group], step: int) -> None:
        self.verify(groups)
        totals = [[0.0] * len(g.samples) for g in groups]
        for t in self.terms:
            values = self._values(t, groups, step)
            for g, vals, tot in zip(groups, values, totals):
                for j, (s, v) in enumerate(zip(g.samples, vals)):
                    if v is not None and not math.isfinite(tot[j] + t.weight * v):
                        self._count(t, g, s, ValueError(f"value {v!r} (weight {t.weight}) makes the reward "
                                                        "non-finite"))
                        v = None
                    s.reward_terms[t.label] = math.nan if v is None else v
                    if v is not None:
                        tot[j] += t.weight * v
        for g, tot in zip(groups, totals):
            for s, r in zip(g.samples, tot):
                s.reward, s.scored = r, True

    def _new_step(self, step: int) -> None:
        self._step, self._errors, self._scored, self._first, self._seconds = step, {}, {}, {}, 0.0

    def check_terms(self, step: int) -> None:
        """After step ``step``'s rollout stage: with ``fail_fast``, a term that failed on every sample it was
        called on this step (it raised, timed out or returned no usable number each time) stops the run in one
        line naming it, with its first error (a conversational reward function on plain-text prompts)."""
        if not self.fail_fast or step != self._step:
            return
        for t in self.terms:
            n, first = self._scored.get(t.label, 0.0), self._first.get(t.label)
            if n and self._errors.get(t.label, 0.0) >= n:
                what = (f"first: {first_line(first[2])} (problem {first[0].problem.id!r}, completion "
                        f"{first[1].text[:60]!r})" if first else "its first error is printed above by a "
                        "rollout worker")
                raise TermFailedEverywhere(f"reward {t.label!r} failed on all {n:.0f} samples of step "
                                           f"{step + 1}; {what}; reward.fail_fast=false keeps the run going, "
                                           "the term adding nothing")

    def _values(self, t: BoundTerm, groups: list[Group], step: int) -> list[list[float | None]]:
        """The term's values as floats / None; failures are counted and logged, never raised."""
        self._scored[t.label] = self._scored.get(t.label, 0.0) + sum(len(g.samples) for g in groups)
        try:
            raw, failed = call_with_timeout(lambda: t.term(groups, step), self.term_timeout_s), {}
        except SampleErrors as e:
            raw, failed = e.values, e.errors
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a crashing reward term is counted, never fatal
            raw = [[None] * len(g.samples) for g in groups]
            failed = {(i, j): e for i, g in enumerate(groups) for j in range(len(g.samples))}
        try:
            values = [[_number(v) for v in row] for row in raw]
            if [len(r) for r in values] != [len(g.samples) for g in groups]:
                raise ValueError(f"returned {[len(r) for r in values]} values per group for group sizes "
                                 f"{[len(g.samples) for g in groups]}")
        except (TypeError, ValueError) as e:
            values = [[None] * len(g.samples) for g in groups]
            failed = {(i, j): e for i, g in enumerate(groups) for j in range(len(g.samples))}
        for (i, j), e in failed.items():
            values[i][j] = None
            self._count(t, groups[i], groups[i].samples[j], e)
        return values

    def _count(self, t: BoundTerm, group: Group, sample: Sample, exc: BaseException) -> None:
        """One failure of ``t`` on ``sample``: counted in ``reward/<label>_errors``, the first printed."""
        self._errors[t.label] = self._errors.get(t.label, 0.0) + 1
        self._first.setdefault(t.label, (group, sample, exc))
        self._report(t.label, group, sample, exc, f"reward/{t.label}_errors")

    def _report(self, name: str, group: Group, sample: Sample, exc: BaseException, metric: str) -> None:
        if name in self._reported:
            return
        self._reported.add(name)
        print(f"groupwise: {'the verifier' if name == 'verifier' else f'reward {name!r}'} failed on problem "
              f"{group.problem.id!r}, completion {sample.text[:80]!r}: {first_line(exc)} (counted in {metric}; "
              "later failures are counted without a message)", file=sys.stderr, flush=True)

    def metrics(self) -> dict[str, float]:
        return {f"reward/{t.label}_errors": self._errors.get(t.label, 0.0) for t in self.terms}

    @property
    def seconds(self) -> float:
        """This step's time in the verifiers and terms so far (the loop logs it as ``perf/reward_s``)."""
        return self._seconds

    def take_errors(self) -> dict[str, float]:
        """This step's failure counts so far, by term label, cleared (a rollout worker sends them per shard)."""
        out, self._errors, self._scored, self._first = self._errors, {}, {}, {}
        return out

    def add_errors(self, step: int, errors: dict[str, float], samples: int = 0) -> None:
        """Add failure counts a rollout worker's reward stage took (``loop/workers.py``) to this step's;
        ``samples``: how many samples the worker scored (every term was called on each)."""
        if step != self._step:
            self._new_step(step)
        for label, n in errors.items():
            self._errors[label] = self._errors.get(label, 0.0) + n
        for t in self.terms:
            self._scored[t.label] = self._scored.get(t.label, 0.0) + samples


def verdict(v: Any) -> bool:
    """A verifier's answer as a bool; anything but True / False (or 0 / 1) is a broken verifier, not a verdict
    (``bool("False")`` and ``bool(nan)`` would both be True)."""
    if isinstance(v, bool | np.bool_):
        return bool(v)
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise TypeError(f"verify returned {v!r}; expected True or False")


def _number(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return float(v)
    try:
        f = float(v)  # raises TypeError / ValueError for a non-number
    except OverflowError:  # an int beyond float range: non-finite, a failure on that sample (see __call__)
        return math.inf
    return None if math.isnan(f) else f
