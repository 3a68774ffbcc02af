"""Rollout: generators (token sampling engines) and group builders / transforms (what forms a group).

Registry signatures:
  GENERATORS  ``factory(cfg, model, tokenizer) -> Generator``
  BUILDERS    ``factory(cfg) -> callable(problems, ctx: RolloutContext) -> list[Group]`` (generate + score)
  TRANSFORMS  ``factory(cfg) -> callable(groups, ctx: RolloutContext) -> list[Group]`` (on scored groups)
"""

from groupwise.registry import Registry

GENERATORS = Registry("generator", "factory(cfg, model, tokenizer) -> Generator")
BUILDERS = Registry("group builder", "factory(cfg) -> (problems, ctx) -> list[Group]")
TRANSFORMS = Registry("group transform", "factory(cfg) -> (groups, ctx) -> list[Group]")

from groupwise.rollout import builders, dre, fake, hf, qlpo, think_modes  # noqa: E402,F401  (registration)
