"""The default driver: one policy, the training loop of ``loop/trainer.py``."""

from __future__ import annotations

from groupwise.drivers import DRIVERS, DriverRun
from groupwise.loop.trainer import train


@DRIVERS.register("single")
def single(run: DriverRun, cfg) -> dict[str, dict[str, float]]:
    """One policy: ``loop.trainer.train`` (the default driver)."""
    return train(run.cfg, resume=run.resume, overwrite=run.overwrite)
