"""Rewards: verifier correctness, format, method-specific shaping and users' own functions, combined by weight.

Registry form: ``factory(cfg, env) -> RewardTerm`` (``env.task``). The reward stage (``rewards/stage.py``,
owned by the loop) verifies every sample, then calls each term as ``term(groups, step)``, which returns one
value per sample, group-major; ``None`` means "not applicable" (the term adds nothing to that sample's
reward and is left out of its metric). Terms with state declare ``stateful=True`` (checkpointed), terms with
metrics ``reports=True``; a term's metric name is ``reward/<label>`` (the registered name unless the entry
declares a ``label``, e.g. ``python`` uses the user function's name).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from groupwise.registry import Registry
from groupwise.types import Group


@runtime_checkable
class RewardTerm(Protocol):
    """``term(groups, step)`` -> one float (or None) per sample, in group order, after verification has set
    ``Sample.correct``. It must not change the groups; an exception is counted per term and never fatal."""

    def __call__(self, groups: list[Group], step: int) -> list[list[float | None]]: ...


REWARDS = Registry("reward", RewardTerm, "factory", ("cfg", "env"))


def per_sample(fn):
    """Turn ``fn(sample, problem) -> float`` into a stateless RewardTerm."""

    def term(groups: list[Group], step: int) -> list[list[float]]:
        return [[float(fn(s, g.problem)) for s in g.samples] for g in groups]

    return term
