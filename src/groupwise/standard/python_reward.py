"""``python``: a reward term that calls a user function with TRL's reward-function signature.

  f(prompts, completions, completion_ids, **kwargs) -> list[float | None]      (one value per completion)

so a function written for TRL's ``GRPOTrainer`` runs unchanged. As in TRL (``GRPOTrainer._calculate_rewards``):
``prompts`` are the problems' prompts as given (a string, or a list of ``{"role", "content"}`` messages for
chat prompts), ``completions`` the decoded completions (strings, or ``[{"role": "assistant", "content": ...}]``
when the prompt is a chat), ``completion_ids`` the token ids; every dataset column except the prompt is a
keyword argument with one value per completion (the ``jsonl`` task keeps its rows' columns; other tasks give
``answer``, ``reference``, ``difficulty`` and ``problem_id``); ``trainer_state`` has ``global_step`` and
``max_steps``; ``log_metric(name, value)`` adds ``reward/<label>/<name>`` to the step's metrics (mean over the
step's calls); ``log_extra`` is accepted and ignored. ``None`` (or NaN) means "not applicable": the term adds
nothing to that sample's reward; ±inf (or a value whose weighted sum overflows) is a failure on that sample,
counted like an exception (the reward stage keeps every reward finite). The metric name is the function's
name (``reward/score``) unless ``label`` is set.

Failures never kill the run: if the batch call raises, each sample is retried alone and the ones that still
raise get None and are counted (``reward/<label>_errors``, first one printed with the sample); a call over
``timeout_s`` counts every sample of the call (no per-sample retry, so a hanging function costs one timeout).
On Linux a function named by reference runs in a forked worker process by default (``isolation: auto``;
``groupwise/isolation.py``; a callable passed from Python stays in this process):
a call stuck in C code is killed at ``timeout_s`` and ``os._exit`` ends only the worker (a new one is forked),
a process the function starts ends with its worker, and its memory is capped (``reward.worker_memory_mb``);
the arguments and values cross a pipe (pickled), and ``log_metric`` calls come back with the values.
The ``function`` is ``path/to/file.py:name`` (relative to the working directory), ``package.module:name``, or
a callable (Python API); it is imported when the config loads, so a typo fails at once.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from collections.abc import Callable
from typing import Any, Literal

from groupwise import plugins
from groupwise.isolation import CAN_FORK, WORKER_MEMORY_MB, Forked
from groupwise.rewards import REWARDS
from groupwise.rewards.stage import SampleErrors, VerifierTimeout, call_with_timeout
from groupwise.types import Group, Problem, Sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class PythonRewardConfig:
    function: Any = None
    """``path/to/file.py:function``, ``package.module:function``, or (Python API) the callable itself."""
    label: str = ""
    """The metric name (``reward/<label>``); empty: the function's ``__name__``."""
    timeout_s: float = 60.0
    """Per call (the batch, or one sample in a retry); 0 disables it (under ``alarm``: main thread only)."""
    isolation: Literal["auto", "alarm", "process"] = "auto"
    """Where the function runs (``groupwise/isolation.py``): ``alarm`` in this process under SIGALRM (C code is not
    interrupted); ``process`` in a forked worker, killed and replaced when a call overruns (state the function
    keeps lives in the worker); ``auto``: ``process`` for a function named by reference (``file.py:f``,
    ``module:f``) on Linux, ``alarm`` for a callable passed from Python (the API, a notebook: its side effects
    stay visible) and elsewhere."""

    def __post_init__(self) -> None:
        if self.function is None or self.function == "":
            raise ValueError("function: required, e.g. my_rewards.py:score or my_pkg.rewards:score")
        if isinstance(self.function, str):
            object.__setattr__(self, "function", plugins.absolute(self.function))
        plugins.load_callable(self.function)  # fails at load, naming the reference
        if self.timeout_s < 0:
            raise ValueError(f"timeout_s={self.timeout_s}: must be >= 0 (0 disables the timeout)")
        if self.isolation == "process" and not CAN_FORK:
            raise ValueError(f"isolation=process: needs fork (Linux), this is {sys.platform}; "
                             "allowed here: alarm, auto")

    def name(self) -> str:
        if self.label:
            return self.label
        fn = self.function
        return fn.rpartition(":")[2].rpartition(".")[2] if isinstance(fn, str) else getattr(fn, "__name__", "python")


def prompt_value(p: Problem) -> Any:
    return [dict(m) for m in p.prompt] if isinstance(p.prompt, tuple | list) else p.prompt


def completion_value(p: Problem, s: Sample) -> Any:
    return [{"role": "assistant", "content": s.text}] if isinstance(p.prompt, tuple | list) else s.text


def columns(p: Problem) -> dict[str, Any]:
    base = {"answer": p.answer, "reference": p.reference, "difficulty": p.difficulty, "problem_id": p.id}
    return {**base, **p.meta.get("columns", {})}


def invoke(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, list[float]]]:
    """One call of the user function (here, or in the forked worker): its values and the metrics it logged."""
    logged: dict[str, list[float]] = {}
    out = fn(**kwargs, log_metric=lambda name, value: logged.setdefault(name, []).append(float(value)),
             log_extra=lambda column, values: None)
    return list(out), logged


class PythonReward:
    def __init__(self, fn: Callable[..., Any], cfg: PythonRewardConfig, max_steps: int, memory_mb: int):
        self.fn, self.cfg, self.max_steps = fn, cfg, max_steps
        self._step: int | None = None
        self._logged: dict[str, list[float]] = {}
        # auto: a function named by reference runs forked; a callable passed from Python stays here (its side effects,
        # a closure's list, a logger, stay visible to the caller)
        process = cfg.isolation == "process" or (cfg.isolation == "auto" and CAN_FORK and isinstance(cfg.function, str))
        self.forked = Forked(functools.partial(invoke, fn), cfg.timeout_s, "reward function",
                             memory_mb) if process else None

    def _call(self, rows: list[tuple[Problem, Sample]], step: int) -> list[Any]:
        cols = [columns(p) for p, _ in rows]
        keys = sorted({k for c in cols for k in c})
        kwargs = {k: [c.get(k) for c in cols] for k in keys}
        kwargs.update(prompts=[prompt_value(p) for p, _ in rows], completions=[completion_value(p, s) for p, s in rows],
                      completion_ids=[s.completion_ids.tolist() for _, s in rows],
                      trainer_state=types.SimpleNamespace(global_step=step, max_steps=self.max_steps))
        if self.forked is not None:
            out, logged = self.forked(kwargs)
        else:
            out, logged = call_with_timeout(lambda: invoke(self.fn, kwargs), self.cfg.timeout_s)
        for name, values in logged.items():
            self._logged.setdefault(name, []).extend(values)
        if len(out) != len(rows):
            raise ValueError(f"returned {len(out)} rewards for {len(rows)} completions (one per completion)")
        return out

    def __call__(self, groups: list[Group], step: int) -> list[list[Any]]:
        if step != self._step:
            self._step, self._logged = step, {}
        rows = [(g.problem, s) for g in groups for s in g.samples]
        index = [(i, j) for i, g in enumerate(groups) for j in range(len(g.samples))]
        errors: dict[tuple[int, int], BaseException] = {}
        try:
            flat = self._call(rows, step) if rows else []
        except VerifierTimeout:
            raise
        except (Exception, SystemExit):  # noqa: BLE001 - isolate the failing samples
            flat = []
            for ij, row in zip(index, rows):
                try:
                    flat.append(self._call([row], step)[0])
                except (Exception, SystemExit) as e:  # noqa: BLE001 - counted by the reward stage
                    flat.append(None)
                    errors[ij] = e
        it = iter(flat)
        values = [[next(it) for _ in g.samples] for g in groups]
        if errors:
            raise SampleErrors(values, errors)
        return values

    def metrics(self) -> dict[str, float]:
        label = self.cfg.name()
        return {f"reward/{label}/{k}": sum(v) / len(v) for k, v in self._logged.items() if v}


@REWARDS.register("python", config=PythonRewardConfig, reports=True, label=PythonRewardConfig.name)
def python(cfg: PythonRewardConfig, env) -> PythonReward:
    run = env.run
    return PythonReward(plugins.load_callable(cfg.function), cfg, run.trainer.steps if run else 0,
                        run.reward.worker_memory_mb if run else WORKER_MEMORY_MB)
