"""Where user code runs: bounded in time, and unable to hang or end the run (verifiers, reward functions, tools).

  alarm    in this process under SIGALRM (``call_with_timeout``): no overhead, but code stuck inside C (a
           catastrophic regex, sympy's big-integer arithmetic) is not interrupted until it returns, and only the
           main thread can be bounded
  process  ``Forked``: in a worker process forked from this one (the function is inherited, not pickled; its
           arguments and result are); each call waits at most ``timeout_s`` for the answer, and a worker that
           overruns is killed (SIGKILL) and a new one forked for the next call, so nothing the code does (C
           loops, ``os._exit``, a crash of the interpreter) can hang or end the run. Cost: one pipe round trip
           per call (~0.1 ms here) plus pickling the arguments.
  auto     ``process`` for user code (``user_code``: defined outside the groupwise package) where ``fork`` exists
           (Linux), ``alarm`` for groupwise's own code (bounded by construction) and elsewhere.

A worker ignores SIGINT (Ctrl-C is the trainer's) and leaves when the trainer does. It leads its own process
group, and the group is ended with it (``close``, a timeout kill, a worker that died, the trainer's exit, a trainer
killed outright: the idle worker notices within a second), so a helper process the user code started (a
``subprocess.Popen``, an ``os.fork``) cannot outlive the run or keep its stdout / stderr open. Its address space
is capped (``RLIMIT_AS``) at what it inherited at the fork plus ``memory_mb`` (``reward.worker_memory_mb``;
0: no cap): an allocation that grows without bound raises ``MemoryError`` there (or kills the worker), the call
fails with ``VerifierFailed`` naming the limit and the worker is replaced. Not covered: a child that leaves the
group itself (``setsid``, ``start_new_session=True``), and a child's own allocations beyond the cap it inherits
(each process gets the cap).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

CAN_FORK = sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
"""``process`` isolation is offered where forking a trainer is safe and cheap (Linux)."""
WORKER_MEMORY_MB = 4096
"""A worker's memory cap beyond what it inherits: ``reward.worker_memory_mb``'s default (the schema does not import
this module; ``tests/unit/test_isolation.py`` keeps the two equal), a tool's worker's cap."""


class VerifierTimeout(Exception):
    """A call overran its time bound (under ``alarm``, or a killed worker under ``process``)."""


class VerifierFailed(Exception):
    """The worker died mid-call, or the call raised something that is not a picklable ``Exception`` (the message
    is its type and first line); a picklable ``Exception`` is re-raised as itself."""


def user_code(fn: Any) -> bool:
    """True for a function (or bound method) defined outside the groupwise package (a plug-in, a user file), or a
    method of an object that declares ``runs_user_code = True`` (groupwise's adapter of a user's environment)."""
    if getattr(getattr(fn, "__self__", None), "runs_user_code", False):
        return True
    module = getattr(fn, "__module__", None) or type(fn).__module__ or ""
    return not (module == "groupwise" or module.startswith("groupwise."))


def resolve(isolation: str, fn: Any) -> str:
    """``auto`` → ``process`` for user code where fork exists, else ``alarm``; other values pass through."""
    if isolation != "auto":
        return isolation
    return "process" if CAN_FORK and user_code(fn) else "alarm"


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


def _serve(fn: Callable[..., Any], conn: Any, parent_end: Any, memory_mb: int) -> None:
    _own_group()
    # A forked worker inherits the trainer's handlers: with the session's SIGTERM handler in place the
    # parent's exit-time terminate() would be ignored and the interpreter would wait on this process forever.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    parent_end.close()  # else the trainer's death never shows here as EOF
    _cap_memory(memory_mb)
    trainer = os.getppid()
    try:
        while True:
            try:
                while not conn.poll(1.0):  # a trainer killed outright (SIGKILL) closes no pipe another worker inherited
                    if os.getppid() != trainer:
                        return
                args = conn.recv()
            except (EOFError, OSError):
                return
            try:
                conn.send((True, fn(*args)))
            except BaseException as e:  # noqa: BLE001 - reported to the parent, which counts it
                conn.send((False, portable(e)))
    finally:  # the trainer is gone: so are the processes the user code started
        if os.getpgid(0) == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)


def _own_group() -> None:
    with contextlib.suppress(OSError):  # the trainer already made it (``Forked._start`` does too: whichever is first)
        os.setpgid(0, 0)


def _cap_memory(memory_mb: int) -> None:
    """``RLIMIT_AS`` = this process's address space now (inherited from the trainer) + ``memory_mb``."""
    if memory_mb <= 0:
        return
    import resource

    with open("/proc/self/statm") as f:
        inherited = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = inherited + memory_mb * 2**20
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def end_group(pid: int) -> None:
    """SIGKILL the process group a worker leads (the worker and every process its code started in it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # no member left (or the group never formed: the worker alone)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


_LIVE: dict[int, int] = {}
"""The running workers' pids (their process groups), by the pid of the process that forked them."""


@atexit.register
def _end_all() -> None:
    """At the trainer's exit, before multiprocessing joins its daemonic workers: end every worker's group (a
    child the user code left running would hold the run's stdout / stderr open after it exits)."""
    for pid, owner in list(_LIVE.items()):
        if owner == os.getpid():
            end_group(pid)


def portable(e: BaseException) -> Exception:
    """The exception to raise in the trainer: ``e`` itself when it is an ``Exception`` that pickles (so messages
    read as they would in-process), else ``VerifierFailed`` with its type and first line (``sys.exit`` in user
    code must not end the trainer)."""
    if isinstance(e, Exception):
        try:
            pickle.loads(pickle.dumps(e))
            return e
        except Exception:  # noqa: BLE001 - an exception that does not pickle is described instead
            pass
    text = str(e).strip()
    failed = VerifierFailed(f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}")
    failed.type_name = type(e).__name__  # what a caller shows as the type (a tool's ``error: SystemExit``)
    return failed


class Forked:
    """``fn(*args)`` in a forked worker, killed and replaced when a call overruns (``process`` above). ``what``
    names the code in errors ("the verifier's process died"). ``submit`` / ``result`` split a call, so several
    workers can run at once (tool calls).

    The worker is forked here, when the component is built, not at its first call: a forked worker keeps the
    trainer's pages as they were at the fork, and every page the trainer writes or frees afterwards becomes the
    worker's own copy. Forked at the first call, inside the real-model lab's step-0 eval (a 1,000-row generation
    just done), a verifier worker held 4.7 GB of the trainer's freed eval buffers for the rest of the run; forked
    at build, it shares the loaded model and holds what the trainer changes after it (LoRA: ~nothing; full
    fine-tuning: the weights as loaded, which the optimizer rewrites). A replacement worker (after a kill) is forked
    when it is needed."""

    def __init__(self, fn: Callable[..., Any], timeout_s: float, what: str = "verifier",
                 memory_mb: int = WORKER_MEMORY_MB):
        self.fn, self.timeout_s, self.what, self.memory_mb = fn, timeout_s, what, memory_mb
        self._proc: Any = None
        self._conn: Any = None
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(self.fn, child, parent, self.memory_mb), daemon=True)
        self._proc.start()
        with contextlib.suppress(OSError):  # the worker does the same: its group exists before either side goes on
            os.setpgid(self._proc.pid, self._proc.pid)
        _LIVE[self._proc.pid] = os.getpid()
        child.close()
        self._conn = parent

    def close(self) -> None:
        if self._proc is not None:
            end_group(self._proc.pid)  # before the join: the pid cannot be reused until it is reaped
            self._proc.join()
            _LIVE.pop(self._proc.pid, None)
            self._conn.close()
            self._proc = self._conn = None

    @property
    def connection(self) -> Any:
        """The pipe the submitted call's answer arrives on (for ``multiprocessing.connection.wait``)."""
        return self._conn

    def submit(self, *args: Any) -> None:
        if self._proc is None or not self._proc.is_alive():
            self.close()
            self._start()
        self._conn.send(args)

    def result(self, timeout_s: float | None) -> Any:
        """The submitted call's value; waits at most ``timeout_s`` (None or <= 0: no bound)."""
        if not self._conn.poll(timeout_s if timeout_s is not None and timeout_s > 0 else None):
            self.close()
            self.restarts += 1
            raise VerifierTimeout(f"exceeded {self.timeout_s}s (the {self.what}'s process was killed)")
        try:
            ok, value = self._conn.recv()
        except EOFError:  # the worker died mid-call (os._exit, a crash)
            self.close()
            self.restarts += 1
            raise VerifierFailed(f"the {self.what}'s process died") from None
        if not ok:
            if isinstance(value, MemoryError):  # its memory is still held (a leak): a fresh worker next call
                self.close()
                self.restarts += 1
                cap = (f"went over its memory limit (reward.worker_memory_mb={self.memory_mb}: {self.memory_mb} MB "
                       "beyond what it inherited)" if self.memory_mb > 0 else "ran out of memory")
                raise VerifierFailed(f"MemoryError: the {self.what}'s process {cap} and was ended") from None
            raise value
        return value

    def __call__(self, *args: Any) -> Any:
        self.submit(*args)
        return self.result(self.timeout_s)
