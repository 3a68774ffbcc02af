"""How the reward stage and the evaluation call ``task.verify``, bounded in time (``reward.verifier_isolation``:
``alarm``, ``process`` or ``auto``, as ``groupwise/isolation.py`` describes; ``auto``, the default, isolates a
plug-in task's verifier in a process, capped at ``reward.worker_memory_mb``, and runs groupwise's own under
``alarm``). Either way a failure raises here
and the caller counts it (``reward/verifier_error_frac``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from groupwise.isolation import (  # noqa: F401  (re-exported: the reward stage's names)
    WORKER_MEMORY_MB,
    Forked,
    VerifierFailed,
    VerifierTimeout,
    call_with_timeout,
    resolve,
)
from groupwise.types import Problem


def alarm_verifier(task: Any, timeout_s: float) -> Callable[[Problem, str], Any]:
    return lambda problem, text: call_with_timeout(lambda: task.verify(problem, text), timeout_s)


def make_verifier(task: Any, timeout_s: float, isolation: str,
                  memory_mb: int = WORKER_MEMORY_MB) -> Callable[[Problem, str], Any]:
    if resolve(isolation, task.verify) == "process":
        return Forked(task.verify, timeout_s, "verifier", memory_mb)
    return alarm_verifier(task, timeout_s)
