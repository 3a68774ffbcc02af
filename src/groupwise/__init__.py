"""groupwise: GRPO-family RL with verifiable rewards, every method a registered, composable component.

The Python API (the CLI calls the same functions)::

    import groupwise

    result = groupwise.train("recipes/grpo_lab.yaml", ["trainer.steps=20"])          # a recipe + overrides
    result = groupwise.train({"task": {"name": "lab"}, "trainer": {"steps": 5}})      # or a config dict
    result = groupwise.train("recipes/grpo_lab.yaml", reward_funcs=[my_trl_reward])  # TRL reward functions
    cfg = groupwise.load_config("recipes/grpo_lab.yaml", ["rollout.group_size=4"])    # a validated RunConfig

``train`` returns ``{"before": eval metrics, "after": eval metrics, "last": last step's metrics}``.
Registries (to register your own components without a plugin file) are in ``groupwise.catalog.KINDS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from groupwise.config import RunConfig

__all__ = ["load_config", "train"]


def load_config(recipe: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = (),
                reward_funcs: Sequence[Callable[..., Any]] = (),
                reward_weights: Sequence[float] | None = None) -> RunConfig:
    """A validated ``RunConfig`` from a recipe path or a config dict, dotted overrides, and optionally reward
    functions with TRL's signature (they replace ``reward.terms``, one ``python`` term each, as
    ``GRPOTrainer(reward_funcs=..., args=GRPOConfig(reward_weights=...))`` does)."""
    from groupwise.config import load

    base, path = (dict(recipe), None) if isinstance(recipe, Mapping) else ({}, recipe)
    final = None
    if reward_funcs:
        weights = list(reward_weights) if reward_weights is not None else [1.0] * len(reward_funcs)
        if len(weights) != len(reward_funcs):
            raise ValueError(f"reward_weights has {len(weights)} entries for {len(reward_funcs)} reward_funcs")
        final = {"reward": {"terms": [{"name": "python", "function": f, "weight": w}
                                      for f, w in zip(reward_funcs, weights)]}}
    return load(path, overrides, base=base, final=final)


def train(recipe: str | Path | Mapping[str, Any] | RunConfig | None = None, overrides: Sequence[str] = (), *,
          resume: bool = False, overwrite: bool = False, reward_funcs: Sequence[Callable[..., Any]] = (),
          reward_weights: Sequence[float] | None = None) -> dict[str, dict[str, float]]:
    """Train (or ``resume``) a run from a recipe path, a config dict or a ``RunConfig``, plus overrides."""
    from groupwise.config import RunConfig
    from groupwise.drivers import run

    if isinstance(recipe, RunConfig):
        if overrides or reward_funcs:
            raise ValueError("pass overrides / reward_funcs with a recipe or dict, not with a built RunConfig")
        cfg = recipe
    else:
        cfg = load_config(recipe, overrides, reward_funcs, reward_weights)
    return run(cfg, resume=resume, overwrite=overwrite)
