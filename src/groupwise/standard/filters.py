"""The built-in filters: ``none`` (every group) and ``zero_variance`` (dynamic sampling: drop groups whose rewards
are all equal, refill)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from groupwise.filter import FILTERS, has_variance
from groupwise.registry import NoConfig
from groupwise.types import Group


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
