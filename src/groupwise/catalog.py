"""The catalogue of component kinds: every stage package, imported explicitly, and its registry.

Reading this file tells which stages exist; ``groupwise list`` prints them. Members of a stage are the
modules of its package (``registry.import_members``), plus users' plugins (``plugins.py``: recipe
``plugins:`` and the ``groupwise.plugins`` entry-point group), which register exactly like built-ins.
"""

from __future__ import annotations

from typing import Any

from groupwise import (
    advantages,
    credit,
    filter,
    losses,
    plugins,
    replay,
    rewards,
    rollout,
    select,
    tasks,
    teachers,
)
from groupwise.registry import Registry

KINDS: dict[str, Registry[Any]] = {r.kind: r for r in (
    tasks.TASKS, select.SELECTORS, rollout.GENERATORS, rollout.BUILDERS, rollout.TRANSFORMS, rewards.REWARDS,
    filter.FILTERS, replay.BUFFERS, advantages.ADVANTAGES, advantages.ADVANTAGE_TRANSFORMS, credit.CREDIT,
    teachers.TEACHERS, losses.LOSSES)}
"""kind -> registry, in pipeline order."""


def registry(kind: str) -> Registry[Any]:
    plugins.load_entry_points()
    return KINDS[kind]


def build(spec: Any, env: Any = None) -> Any:
    """A config ``Spec`` -> the bound component (``Entry.build``), the one way every component is made."""
    return registry(spec.kind).get(spec.name).build(spec.cfg, env)
