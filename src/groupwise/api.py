"""The Python API (the top layer: the CLI calls the same functions; ``groupwise.train`` etc. are these).

``load_config`` validates a recipe, ``train`` trains it with the driver it selects (``run``).
"""


from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from groupwise.config import RunConfig

__all__ = ["load_config", "run", "train"]


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

    if isinstance(recipe, RunConfig):
        if overrides or reward_funcs:
            raise ValueError("pass overrides / reward_funcs with a recipe or dict, not with a built RunConfig")
        cfg = recipe
    else:
        cfg = load_config(recipe, overrides, reward_funcs, reward_weights)
    return run(cfg, resume=resume, overwrite=overwrite)


def run(cfg: RunConfig, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train ``cfg`` with the driver it selects (``driver:``, default ``single``)."""
    import os

    from groupwise.config.check import processes
    from groupwise.drivers import DriverRun

    processes(cfg, int(os.environ.get("WORLD_SIZE", "1")))  # known when the run starts, before anything is built
    return cfg.driver.build()(DriverRun(cfg, resume, overwrite))
