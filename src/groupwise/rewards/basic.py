"""``correctness`` (the verifier's verdict as 0/1) and ``format`` (the task's structure check as 0/1)."""

from __future__ import annotations

from groupwise.registry import NoConfig
from groupwise.rewards import REWARDS
from groupwise.types import Group


def per_sample(fn):
    """Turn ``fn(sample, problem) -> float`` into a stateless RewardTerm."""

    def term(groups: list[Group], step: int) -> list[list[float]]:
        return [[float(fn(s, g.problem)) for s in g.samples] for g in groups]

    return term


@REWARDS.register("correctness", config=NoConfig)
def correctness(cfg: NoConfig, env):
    return per_sample(lambda s, p: s.correct)


@REWARDS.register("format", config=NoConfig)
def format_(cfg: NoConfig, env):
    return per_sample(lambda s, p: env.task.format_ok(s.text))
