"""The default driver: one policy, the training loop of ``loop/trainer.py``."""

from __future__ import annotations

from groupwise.drivers import DRIVERS, DriverRun


@DRIVERS.register("single")
def single(run: DriverRun, cfg) -> dict[str, dict[str, float]]:
    """One policy: ``loop.trainer.train`` (the default driver; imported when it runs, so that validating a
    recipe imports this module and not the loop's machinery)."""
    from groupwise.loop.trainer import train

    return train(run.cfg, resume=run.resume, overwrite=run.overwrite)
