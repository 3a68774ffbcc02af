"""Filters: which scored groups reach the update.

Registry form: ``factory(cfg, env) -> Filter``, called as ``filter(groups, target, refill) -> (groups,
metrics)`` where ``refill(n)`` builds and scores ``n`` fresh groups (new problems) for dynamic sampling. The
members are ``standard/filters.py``'s (``none``, ``zero_variance``); ``has_variance`` is the test they share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from groupwise.registry import Registry, described, list_of
from groupwise.types import Group


@runtime_checkable
class Filter(Protocol):
    """Keeps (and may refill up to ``target``) the groups that reach the advantage stage; returns its metrics."""

    def __call__(self, groups: list[Group], target: int,
                 refill: Callable[[int], list[Group]]) -> tuple[list[Group], dict[str, float]]: ...


def filter_contract(out: object, *_: object) -> str:
    """What is wrong with a filter's output ("" when nothing)."""
    if isinstance(out, tuple) and len(out) == 2 and list_of(out[0], Group) and isinstance(out[1], dict):
        return ""
    return f"returned {described(out)}; the contract is (a list of Groups, a dict of metrics)"


FILTERS = Registry("filter", Filter, "factory", ("cfg", "env"), contract=filter_contract)


def has_variance(group: Group) -> bool:
    rewards = group.rewards
    return len(rewards) > 1 and max(rewards) != min(rewards)
