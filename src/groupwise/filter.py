"""Filters: which scored groups reach the update.

Registry form: ``factory(cfg, env) -> Filter``, called as ``filter(groups, target, refill) -> (groups,
metrics)`` where ``refill(n)`` builds and scores ``n`` fresh groups (new problems) for dynamic sampling.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from groupwise.registry import NoConfig, Registry, described, list_of
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


@FILTERS.register("none", config=NoConfig)
def none(cfg: NoConfig, env):
    def apply(groups: list[Group], target: int, refill: Callable[[int], list[Group]]):
        return groups, {}

    return apply


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZeroVarianceConfig:
    max_refill_rounds: int = 0
    """Dynamic sampling (DAPO): after dropping groups whose rewards are all equal, generate replacement
    groups for new problems, up to this many extra rounds, until ``prompts_per_step`` groups remain."""
    oversample: float = 1.0
    """Each refill round asks for ``ceil(missing * oversample)`` groups."""

    def __post_init__(self) -> None:
        if self.max_refill_rounds < 0 or self.oversample < 1.0:
            raise ValueError("max_refill_rounds must be >= 0 and oversample >= 1")


@FILTERS.register("zero_variance", config=ZeroVarianceConfig, provides=("drops_groups",))
def zero_variance(cfg: ZeroVarianceConfig, env):
    """Drop groups with identical rewards (their GRPO advantages are all 0) and refill up to a cap.

    Logged: ``filter/zero_variance_frac`` (share of first-round groups dropped), ``filter/refill_rounds``,
    ``filter/groups_kept``. If the cap is reached with fewer than ``target`` groups, the step trains on
    what it has (possibly nothing).
    """

    def apply(groups: list[Group], target: int, refill: Callable[[int], list[Group]]):
        kept = [g for g in groups if has_variance(g)]
        dropped_frac = 1.0 - len(kept) / max(len(groups), 1)
        rounds = 0
        while len(kept) < target and rounds < cfg.max_refill_rounds:
            rounds += 1
            missing = target - len(kept)
            kept += [g for g in refill(math.ceil(missing * cfg.oversample)) if has_variance(g)]
        kept = kept[:target]
        return kept, {"filter/zero_variance_frac": dropped_frac, "filter/refill_rounds": float(rounds),
                      "filter/groups_kept": float(len(kept))}

    return apply
