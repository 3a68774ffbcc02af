"""Rollout: generators (token sampling engines) and group builders / transforms (what forms a group).

Registry forms (protocols in ``rollout/base.py``):
  GENERATORS  ``factory(cfg, env) -> Generator``       (``env.policy``, ``env.tokenizer``)
  BUILDERS    ``factory(cfg, env) -> GroupBuilder``    ``(problems, ctx) -> list[Group]``, unscored: the loop
              scores every group the builder returns
  TRANSFORMS  ``factory(cfg, env) -> GroupTransform``  ``(groups, ctx) -> list[Group]`` on scored groups; a
              transform that creates or edits samples scores them with ``ctx.score`` (the reward stage)
A plug-in builder's or transform's output is checked against ``groups_contract``, a generator's ``generate``
against ``generate_contract``.
"""

from groupwise.registry import Registry, anything, described, list_of
from groupwise.rollout.base import Generator, GroupBuilder, GroupTransform
from groupwise.types import Completion, Group, Sample


def groups_contract(out: object, *_: object) -> str:
    """What is wrong with a builder's or transform's output ("" when nothing)."""
    if isinstance(out, list) and all(isinstance(g, Group) and isinstance(g.samples, list)
                                     and all(isinstance(s, Sample) for s in g.samples) for g in out):
        return ""
    inner = {type(x).__name__ for x in out} if isinstance(out, (list, tuple)) else set()
    got = f"a {type(out).__name__}" + (f" of {', '.join(sorted(inner))}" if inner else "")
    return f"returned {got}; the contract is a list of Groups, each holding a list of Samples"


def generate_contract(out: object, requests: list, *_: object) -> str:
    """What is wrong with a generator's ``generate`` output ("" when nothing)."""
    if list_of(out, Completion, len(requests)):
        return ""
    return f"returned {described(out)} for {len(requests)} requests; the contract is a list of one Completion each"


GENERATORS = Registry("generator", Generator, "factory", ("cfg", "env"),
                        contract={"generate": generate_contract, "sync_weights": anything})
BUILDERS = Registry("group builder", GroupBuilder, "factory", ("cfg", "env"), contract=groups_contract)
TRANSFORMS = Registry("group transform", GroupTransform, "factory", ("cfg", "env"), contract=groups_contract)

