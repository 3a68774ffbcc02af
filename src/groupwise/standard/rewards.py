"""``correctness`` (the verifier's verdict as 0/1), ``format`` (the task's structure check as 0/1),
``step_credit`` (the task's partial credit in [0, 1], for a graded reward) and ``correct_on`` (the verdict on
the problems whose gold label a task corrupted, or on the others: a diagnostic).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from groupwise.registry import NoConfig
from groupwise.rewards import REWARDS, per_sample
from groupwise.types import Group


@REWARDS.register("correctness", config=NoConfig)
def correctness(cfg: NoConfig, env):
    return per_sample(lambda s, p: s.correct)


@REWARDS.register("format", config=NoConfig)
def format_(cfg: NoConfig, env):
    return per_sample(lambda s, p: env.task.format_ok(s.text))


@REWARDS.register("step_credit", config=NoConfig, requires=("step_credit",))
def step_credit(cfg: NoConfig, env):
    """The task's partial credit ``task.step_credit(problem, completion)`` in [0, 1] (the lab: the fraction of the
    chain's running values written at the right step). With ``correctness`` it makes a graded reward (LamPO's
    spec: more than two reward levels, so the pairwise structure carries information beyond the mean). A task
    that has the method declares the ability ``step_credit`` (the lab does), checked at load."""
    fn = env.task.step_credit
    return per_sample(lambda s, p: fn(p, s.text))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorrectOnConfig:
    labels: Literal["corrupted", "clean"] = "corrupted"
    """Which problems the term applies to: those whose gold answer the task corrupted (``Problem.meta`` has
    ``clean_answer``, the lab's ``label_noise``) or the others."""


@REWARDS.register("correct_on", config=CorrectOnConfig, label=lambda cfg: f"correct_on_{cfg.labels}")
def correct_on(cfg: CorrectOnConfig, env):
    """The verifier's verdict (0/1, against the label the task gives, corrupted or not) on the chosen problems,
    None on the others. Listed with weight 0 it only logs: ``reward/correct_on_corrupted`` rising is the policy
    fitting the label noise, and ``reward/correct_on_clean_none_frac`` is the step's share of samples on
    corrupted problems."""
    corrupted = cfg.labels == "corrupted"

    def term(groups: list[Group], step: int) -> list[list[float | None]]:
        return [[float(s.correct) if ("clean_answer" in g.problem.meta) == corrupted else None for s in g.samples]
                for g in groups]

    return term
