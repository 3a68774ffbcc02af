"""``environment``: the task's environment's own rewards (a verifiers rubric, an OpenEnv environment's step
rewards) as a reward term, for a task that has them (``tasks.base.EnvironmentRewards``).

  reward: ""      the environment's reward: Σ w·score over its reward functions, weighted as it weighs them (a
                  verifiers rubric's weights; an OpenEnv episode's summed step rewards); metric ``reward/env``
  reward: <name>  that one reward's score, unweighted (weigh it with the term's own ``weight``; list several terms
                  to reweigh an environment); metric ``reward/env_<name>``

Every reward (and metric, weight 0) the environment reports is logged as ``reward/<label>/<name>``, the mean over
the step's samples. The step's samples are scored in one call bounded by ``timeout_s``; a sample whose scoring
raises (a reward function that failed, an environment error recorded on the episode) is that sample's failure,
counted in ``reward/<label>_errors`` and never fatal; a call over ``timeout_s`` counts every sample of it. Where the
scoring runs is ``isolation`` (``groupwise/isolation.py``): ``auto`` runs an environment's own code (a verifiers
rubric: ``runs_user_code``) in a forked worker, killed when it overruns, and groupwise's (OpenEnv rewards, already
on the episode) in this process.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from typing import Any, Literal

from groupwise.isolation import CAN_FORK, WORKER_MEMORY_MB, Forked, call_with_timeout, portable, resolve
from groupwise.registry import ConfigError
from groupwise.rewards import REWARDS
from groupwise.rewards.stage import SampleErrors
from groupwise.tasks.base import EnvironmentRewards
from groupwise.types import Group


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvironmentRewardConfig:
    reward: str = ""
    """Empty: the environment's weighted reward; a name: that reward's own score."""
    timeout_s: float = 60.0
    """Per call (the step's samples); 0 disables it (under ``alarm``: main thread only)."""
    isolation: Literal["auto", "alarm", "process"] = "auto"

    def __post_init__(self) -> None:
        if self.timeout_s < 0:
            raise ValueError(f"timeout_s={self.timeout_s}: must be >= 0 (0 disables the timeout)")
        if self.isolation == "process" and not CAN_FORK:
            raise ValueError("isolation=process: needs fork (Linux); allowed here: alarm, auto")

    def label(self) -> str:
        return f"env_{self.reward}" if self.reward else "env"


def score_rows(task: EnvironmentRewards, rows: list[tuple[Any, Any]]) -> list[tuple[bool, Any]]:
    """Each row's rewards (here or in the forked worker), a failure kept per row: (True, rewards) or (False, error)."""
    out = []
    for problem, sample in rows:
        try:
            out.append((True, task.episode_rewards(problem, sample)))
        except (Exception, SystemExit) as e:  # noqa: BLE001 - that sample's failure, counted by the reward stage
            out.append((False, portable(e)))
    return out


class EnvironmentReward:
    def __init__(self, task: EnvironmentRewards, cfg: EnvironmentRewardConfig, memory_mb: int):
        self.task, self.cfg = task, cfg
        process = resolve(cfg.isolation, task.episode_rewards) == "process"
        self.forked = Forked(functools.partial(score_rows, task), cfg.timeout_s, "environment's reward",
                             memory_mb) if process else None
        self._step: int | None = None
        self._seen: dict[str, list[float]] = {}

    def _score(self, rows: list[tuple[Any, Any]]) -> list[tuple[bool, Any]]:
        if self.forked is not None:
            return self.forked(rows)
        return call_with_timeout(lambda: score_rows(self.task, rows), self.cfg.timeout_s)

    def __call__(self, groups: list[Group], step: int) -> list[list[float | None]]:
        if step != self._step:
            self._step, self._seen = step, {}
        rows = [(g.problem, s) for g in groups for s in g.samples]
        index = [(i, j) for i, g in enumerate(groups) for j in range(len(g.samples))]
        values: list[list[float | None]] = [[None] * len(g.samples) for g in groups]
        errors: dict[tuple[int, int], BaseException] = {}
        for (i, j), (ok, scored) in zip(index, self._score(rows) if rows else []):
            if not ok:  # the sample's scoring raised: its exception
                errors[i, j] = scored
                continue
            try:
                values[i][j] = self._value(scored)
            except (KeyError, TypeError, ValueError) as e:
                errors[i, j] = e
        if errors:
            raise SampleErrors(values, errors)
        return values

    def _value(self, rewards: dict[str, tuple[float, float]]) -> float:
        """The term's value of one sample's rewards (see the module docstring); its rewards logged."""
        if not isinstance(rewards, dict):
            raise TypeError(f"episode rewards are {type(rewards).__name__}, not a dict of (score, weight)")
        for name, (score, _) in rewards.items():
            self._seen.setdefault(name, []).append(float(score))
        if not self.cfg.reward:
            return sum(float(s) * float(w) for s, w in rewards.values())
        if self.cfg.reward not in rewards:
            raise KeyError(f"no reward {self.cfg.reward!r}; the environment's: {', '.join(rewards) or 'none'}")
        return float(rewards[self.cfg.reward][0])

    def metrics(self) -> dict[str, float]:
        return {f"reward/{self.cfg.label()}/{k}": statistics.fmean(v) for k, v in self._seen.items() if v}


@REWARDS.register("environment", config=EnvironmentRewardConfig, reports=True, label=EnvironmentRewardConfig.label)
def environment(cfg: EnvironmentRewardConfig, env) -> EnvironmentReward:
    if not isinstance(env.task, EnvironmentRewards):
        raise ConfigError(f"reward environment: task '{getattr(env.task, 'name', '?')}' has no environment of its own "
                          "to score episodes; allowed: task.name=verifiers or openenv")
    run = env.run
    return EnvironmentReward(env.task, cfg, run.reward.worker_memory_mb if run else WORKER_MEMORY_MB)
