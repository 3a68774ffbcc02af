"""The scorer: verify every sample (never crashing the run), then combine the weighted reward terms.

A verifier that raises or exceeds ``verifier_timeout_s`` marks the sample ``verifier_error=True`` and
``correct=False`` (so its correctness reward is 0); the share is logged as ``reward/verifier_error_frac``.
The timeout uses SIGALRM and is enforced only in the main thread (elsewhere verifiers run unbounded).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from groupwise.config import Spec
from groupwise.types import Group


class VerifierTimeout(Exception):
    pass


def call_with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        return fn()

    def on_alarm(signum, frame):
        raise VerifierTimeout(f"verifier exceeded {seconds}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Scorer:
    def __init__(self, task, terms: tuple[Spec, ...], timeout_s: float):
        self.task = task
        self.timeout_s = timeout_s
        self.terms = [(spec.name, spec.weight, spec.entry()(spec.cfg, task)) for spec in terms]

    def verify(self, groups: list[Group]) -> None:
        for g in groups:
            for s in g.samples:
                try:
                    s.correct = bool(call_with_timeout(lambda s=s, p=g.problem: self.task.verify(p, s.text), self.timeout_s))
                    s.verifier_error = False
                except Exception:  # noqa: BLE001 - any verifier failure is counted, never fatal
                    s.correct, s.verifier_error = False, True

    def __call__(self, groups: list[Group], step: int) -> None:
        self.verify(groups)
        totals = [[0.0] * len(g.samples) for g in groups]
        for name, weight, term in self.terms:
            values = term(groups, step)
            for g, vals, tot in zip(groups, values, totals):
                for j, (s, v) in enumerate(zip(g.samples, vals)):
                    s.reward_terms[name] = float(v)
                    tot[j] += weight * float(v)
        for g, tot in zip(groups, totals):
            for s, r in zip(g.samples, tot):
                s.reward = r
