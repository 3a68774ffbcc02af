"""Problem selection: which training problems each step uses.

Registry form: ``factory(cfg, env) -> Selector`` (``env.task``, ``env.seed``). Every selector is stateful
(its data cursor is checkpointed), so it is registered with ``stateful=True``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from groupwise.registry import Registry, described, list_of
from groupwise.types import Problem


@runtime_checkable
class Selector(Protocol):
    """``next(step, n, ctx)`` returns the n problems to roll out next (also called for dynamic-sampling
    refills within a step); ``ctx`` is the step's RolloutContext, for selectors that probe the policy. Every
    draw derives from the run seed and the checkpointed cursor, so a resumed run sees the same problems. A selector
    may also define ``observe(groups)``: the rollout stage then passes it every scored group of the run (built,
    scored, transformed and gathered across ranks, refills included), e.g. to learn which problems pay
    (``standard/informative_selector.py``)."""

    def next(self, step: int, n: int, ctx: Any = None) -> list[Problem]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def next_contract(out: object, step: int, n: int, *_: object) -> str:
    """What is wrong with a selector's ``next`` output ("" when nothing)."""
    return ("" if list_of(out, Problem, n)
            else f"returned {described(out)} for n={n}; the contract is a list of n Problems")


SELECTORS = Registry("selector", Selector, "factory", ("cfg", "env"), contract={"next": next_contract})

