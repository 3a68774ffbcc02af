"""How the reward stage and the evaluation call ``task.verify``, bounded in time (``reward.verifier_isolation``).

  alarm    in this process under SIGALRM (``verifier_timeout_s``): no overhead, but a verifier stuck inside C
           code (a catastrophic regex, sympy's big-integer arithmetic) is not interrupted until it returns
  process  in a worker process forked from this one (the task is inherited, not pickled); each call waits at
           most ``verifier_timeout_s`` for the answer, and a worker that overruns is killed (SIGKILL) and a
           new one is forked for the next call, so nothing a verifier does (C code, ``os._exit``, a crash of
           the interpreter) can hang or end the run. Cost: one pipe round trip per sample (~0.1 ms here).
Either way a failure raises here and the caller counts it (``reward/verifier_error_frac``); the worker
ignores SIGINT, so Ctrl-C reaches the trainer and stops the run as usual.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from groupwise.types import Problem


class VerifierTimeout(Exception):
    pass


def call_with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()``, raising ``VerifierTimeout`` after ``seconds`` (SIGALRM; main thread only, else unbounded).

    Nests: an outer timer already running is paused, bounds the inner one, and is re-armed with its remaining
    time afterwards (a reward term's timeout around a user function's own)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        return fn()

    def on_alarm(signum, frame):
        raise VerifierTimeout(f"exceeded {seconds}s")

    start = time.monotonic()
    outer, _ = signal.setitimer(signal.ITIMER_REAL, 0)  # the enclosing call's remaining time, if any
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer) if outer else seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-6))


class VerifierFailed(Exception):
    """The verifier raised in the worker process; the message is its exception's first line."""


def alarm_verifier(task: Any, timeout_s: float) -> Callable[[Problem, str], Any]:
    return lambda problem, text: call_with_timeout(lambda: task.verify(problem, text), timeout_s)


def _serve(task: Any, conn: Any, parent_end: Any) -> None:
    # A forked worker inherits the trainer's handlers: with the session's SIGTERM handler in place the
    # parent's exit-time terminate() would be ignored and the interpreter would wait on this process forever.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    parent_end.close()  # else the trainer's death never shows here as EOF
    trainer = os.getppid()
    while True:
        try:
            while not conn.poll(1.0):  # a trainer killed outright (SIGKILL) closes no pipe another worker inherited
                if os.getppid() != trainer:
                    return
            problem, text = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send((True, task.verify(problem, text)))
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which counts it
            conn.send((False, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"))


class ProcessVerifier:
    """``task.verify`` in a forked worker, killed and replaced when a call overruns (see the module docstring)."""

    def __init__(self, task: Any, timeout_s: float):
        self.task, self.timeout_s = task, timeout_s
        self._proc: Any = None
        self._conn: Any = None
        self.restarts = 0

    def _start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(self.task, child, parent), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            self._conn.close()
            self._proc = self._conn = None

    def __call__(self, problem: Problem, text: str) -> Any:
        if self._proc is None or not self._proc.is_alive():
            self.close()
            self._start()
        self._conn.send((problem, text))
        if not self._conn.poll(self.timeout_s if self.timeout_s > 0 else None):
            self.close()
            self.restarts += 1
            raise VerifierTimeout(f"exceeded {self.timeout_s}s (the verifier's process was killed)")
        try:
            ok, value = self._conn.recv()
        except EOFError:  # the worker died mid-call (os._exit, a crash)
            self.close()
            self.restarts += 1
            raise VerifierFailed("the verifier's process died") from None
        if not ok:
            raise VerifierFailed(value)
        return value


def make_verifier(task: Any, timeout_s: float, isolation: str) -> Callable[[Problem, str], Any]:
    return ProcessVerifier(task, timeout_s) if isolation == "process" else alarm_verifier(task, timeout_s)
