"""Drivers: how policies are arranged around the one RL step (``trainer.rl_step``).

  DRIVERS  ``fn(run, cfg) -> dict``: ``run`` is a ``DriverRun`` (the resolved ``RunConfig``, ``resume``,
           ``overwrite``), ``cfg`` the driver's own config; it returns the run's result (eval metrics by tag).

``single`` (the default, ``trainer.train``) is one policy; a multi-policy driver (two competing players) or a
federated one (a server and its clients) builds a pipeline per policy with ``loop.setup.build`` and calls
``loop.trainer.rl_step`` on each: the stages and the loop stay the same. A recipe selects one with
``driver: <name>``; the rest of the recipe configures every policy's pipeline. ``api.run`` runs the driver a
config selects. The loop itself (``setup``, ``trainer``, ``session``, ``distributed``, ``workers``, ``lag``,
``record``, ``stats``) is the ``groupwise.loop`` package, below the drivers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from groupwise.registry import Registry


@dataclasses.dataclass(frozen=True)
class DriverRun:
    """What every driver is given: the resolved recipe (``RunConfig``) and how to treat its run directory."""

    cfg: Any
    resume: bool = False
    overwrite: bool = False


@runtime_checkable
class Driver(Protocol):
    def __call__(self, run: DriverRun) -> dict[str, Any]: ...


DRIVERS = Registry("driver", Driver, "function", ("run", "cfg"))


