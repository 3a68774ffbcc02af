"""Rollout: generators (token sampling engines) and group builders / transforms (what forms a group).

Registry forms (protocols in ``rollout/base.py``):
  GENERATORS  ``factory(cfg, env) -> Generator``       (``env.policy``, ``env.tokenizer``)
  BUILDERS    ``factory(cfg, env) -> GroupBuilder``    ``(problems, ctx) -> list[Group]``, unscored: the loop
              scores every group the builder returns
  TRANSFORMS  ``factory(cfg, env) -> GroupTransform``  ``(groups, ctx) -> list[Group]`` on scored groups; a
              transform that creates or edits samples scores them with ``ctx.score`` (the reward stage)
"""

from groupwise.registry import Registry, import_members
from groupwise.rollout.base import Generator, GroupBuilder, GroupTransform

GENERATORS = Registry("generator", Generator, "factory", ("cfg", "env"))
BUILDERS = Registry("group builder", GroupBuilder, "factory", ("cfg", "env"))
TRANSFORMS = Registry("group transform", GroupTransform, "factory", ("cfg", "env"))

import_members(__name__, __path__)
