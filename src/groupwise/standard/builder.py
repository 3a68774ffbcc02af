"""The ``standard`` group builder: G independent samples per problem (the loop then scores them)."""

from __future__ import annotations

from groupwise.registry import NoConfig
from groupwise.rollout import BUILDERS
from groupwise.rollout.base import RolloutContext
from groupwise.types import Group, Problem


def standard_build(problems: list[Problem], ctx: RolloutContext) -> list[Group]:
    return ctx.sample_groups(problems)


@BUILDERS.register("standard", config=NoConfig)
def standard(cfg: NoConfig, env):
    return standard_build
