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
The ``function`` is ``path/to/file.py:name`` (relative to the working directory), ``package.module:name``, or
a callable (Python API); it is imported when the config loads, so a typo fails at once.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

from groupwise import plugins
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
    """Per call (the batch, or one sample in a retry); 0 disables it (SIGALRM, main thread only)."""

    def __post_init__(self) -> None:
        if self.function is None or self.function == "":
            raise ValueError("function: required, e.g. my_rewards.py:score or my_pkg.rewards:score")
        if isinstance(self.function, str):
            object.__setattr__(self, "function", plugins.absolute(self.function))
        plugins.load_callable(self.function)  # fails at load, naming the reference
        if self.timeout_s < 0:
            raise ValueError(f"timeout_s={self.timeout_s}: must be >= 0 (0 disables the timeout)")

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


class PythonReward:
    def __init__(self, fn: Callable[..., Any], cfg: PythonRewardConfig, max_steps: int):
        self.fn, self.cfg, self.max_steps = fn, cfg, max_steps
        self._step: int | None = None
        self._logged: dict[str, list[float]] = {}

    def _call(self, rows: list[tuple[Problem, Sample]], step: int) -> list[Any]:
        cols = [columns(p) for p, _ in rows]
        keys = sorted({k for c in cols for k in c})
        kwargs = {k: [c.get(k) for c in cols] for k in keys}
        out = call_with_timeout(lambda: self.fn(
            prompts=[prompt_value(p) for p, _ in rows], completions=[completion_value(p, s) for p, s in rows],
            completion_ids=[s.completion_ids.tolist() for _, s in rows],
            trainer_state=types.SimpleNamespace(global_step=step, max_steps=self.max_steps),
            log_metric=self._log_metric, log_extra=lambda column, values: None, **kwargs), self.cfg.timeout_s)
        out = list(out)
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

    def _log_metric(self, name: str, value: float) -> None:
        self._logged.setdefault(name, []).append(float(value))

    def metrics(self) -> dict[str, float]:
        label = self.cfg.name()
        return {f"reward/{label}/{k}": sum(v) / len(v) for k, v in self._logged.items() if v}


@REWARDS.register("python", config=PythonRewardConfig, reports=True, label=PythonRewardConfig.name)
def python(cfg: PythonRewardConfig, env) -> PythonReward:
    return PythonReward(plugins.load_callable(cfg.function), cfg, env.run.trainer.steps if env.run else 0)
