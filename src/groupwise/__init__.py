"""groupwise: GRPO-family RL with verifiable rewards, every method a registered, composable component.

The Python API (the CLI calls the same functions)::

    import groupwise

    result = groupwise.train("recipes/grpo_lab.yaml", ["trainer.steps=20"])          # a recipe + overrides
    result = groupwise.train({"task": {"name": "lab"}, "trainer": {"steps": 5}})      # or a config dict
    result = groupwise.train("recipes/grpo_lab.yaml", reward_funcs=[my_trl_reward])  # TRL reward functions
    cfg = groupwise.load_config("recipes/grpo_lab.yaml", ["rollout.group_size=4"])    # a validated RunConfig

``train`` returns ``{"before": eval metrics, "after": eval metrics, "last": last step's metrics}``.
Registries (to register your own components without a plugin file) are in ``groupwise.catalog.KINDS``; the
functions are ``groupwise.api``'s.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_config", "train"]


def __getattr__(name: str) -> Any:
    """``groupwise.train`` / ``groupwise.load_config`` are ``groupwise.api``'s, imported on first use (so that
    importing any ``groupwise.*`` module does not import the whole library)."""
    if name in __all__:
        from groupwise import api

        return getattr(api, name)
    raise AttributeError(f"module 'groupwise' has no attribute {name!r}")
