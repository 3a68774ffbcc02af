"""The ``standard`` group builder: G independent samples per problem, then scoring."""

from __future__ import annotations

from groupwise.registry import NoConfig
from groupwise.rollout import BUILDERS
from groupwise.rollout.base import RolloutContext
from groupwise.types import Group, Problem


@BUILDERS.register("standard", config=NoConfig)
def standard(cfg: NoConfig):
    def build(problems: list[Problem], ctx: RolloutContext) -> list[Group]:
        groups = ctx.sample_groups(problems)
        ctx.score(groups)
        return groups

    return build
