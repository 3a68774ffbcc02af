"""A deadline that holds while a thread of this process holds the GIL (``rollout.async_timeout_s``).

A thread stuck in C code that keeps the GIL (an extension that does not release it, a ``ctypes.PyDLL`` call)
stops every other thread of the interpreter: ``Thread.join(timeout)`` never returns, and no timer, signal
handler or ``atexit`` hook of ours can run Python to say why. ``faulthandler.dump_traceback_later(exit=True)``
needs no GIL either, but it prints every thread's traceback, not one line. So the watchdog is another process
(``python -I -S -c WATCH``, started at the first ``arm``, one per process): it reads ``arm`` / ``disarm`` lines
on a pipe, and when an armed deadline passes it writes the armed line to this process's stderr (inherited) and
SIGKILLs this process, the one way to end a process none of whose threads can run Python (exit status -9, 137
in a shell). The kill cannot cut a checkpoint: saves are atomic (``checkpoint.save``: a temporary directory
renamed into place; a stale temporary is removed at the next start), and a torn last line of ``metrics.jsonl``
is skipped by ``--resume``. The pipe closing (this process ended) or a new parent (this process died and a
forked child still holds the pipe) ends the watchdog quietly; it runs in its own session, so a Ctrl-C at the
terminal does not reach it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

WATCH = """
import os, select, signal, sys, time
parent, deadline, line, buf = int(sys.argv[1]), None, b"", b""
while os.getppid() == parent:
    wait = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
    if select.select([0], [], [], wait)[0]:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        *lines, buf = (buf + chunk).split(b"\\n")
        for m in lines:
            seconds, _, text = m.partition(b" ")
            deadline, line = (time.monotonic() + float(seconds), text + b"\\n") if text else (None, b"")
    elif deadline is not None and time.monotonic() >= deadline:
        os.write(2, line)
        os.kill(parent, signal.SIGKILL)
        break
"""
"""The watchdog process: ``<seconds> <line>`` arms, an empty line disarms."""


class Watchdog:
    """``arm(seconds, line)``: unless ``disarm`` comes first, this process is ended after ``seconds`` with
    ``line`` on stderr, whatever its threads are doing. Thread-safe."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.owner = 0  # the pid that started ``proc`` (a forked child starts its own)
        self.lock = threading.Lock()

    def arm(self, seconds: float, line: str) -> None:
        self._send(f"{seconds!r} {' '.join(line.split())}")  # one line, whatever ``line`` holds

    def disarm(self) -> None:
        self._send("")

    def _send(self, msg: str) -> None:
        with self.lock:
            if self.proc is None or self.owner != os.getpid() or self.proc.poll() is not None:
                if not msg:  # nothing is armed
                    return
                self.owner = os.getpid()
                self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", WATCH, str(os.getpid())],
                                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                             start_new_session=True)
            self.proc.stdin.write(msg.encode() + b"\n")
            self.proc.stdin.flush()


WATCHDOG = Watchdog()
"""This process's watchdog (its process starts at the first ``arm``)."""
