"""Problem selection: which training problems each step uses.

Registry signature: ``factory(cfg, task, seed) -> Selector``. A Selector implements
``next(step, n, ctx) -> list[Problem]`` (``ctx`` gives the policy for selectors that probe it),
``state_dict()`` and ``load_state_dict(state)`` (the data cursor; checkpointed).
"""

from groupwise.registry import Registry

SELECTORS = Registry("selector", "factory(cfg, task, seed) -> Selector")

from groupwise.select import pivottrace, random  # noqa: E402,F401  (registration)
