"""The ``fgrpo`` driver: federated GRPO (spec §14, arXiv 2606.03094). The federation (clients, server
aggregation, checkpoints) is ``federated.py``; this module picks its backend: in this process, or Flower
(``flower_app.py``)."""

from __future__ import annotations

from groupwise.drivers import DRIVERS, DriverRun
from groupwise.methods.fgrpo.federated import FGRPOConfig, InProcess, start


@DRIVERS.register("fgrpo", FGRPOConfig)
def fgrpo(run: DriverRun, cfg: FGRPOConfig) -> dict[str, dict[str, float]]:
    """Federated GRPO (FedAvg / raw-reward / relative-gain aggregation): see the module docstring."""
    loop, states, model_path = start(run.cfg, run.resume, run.overwrite, cfg)
    if cfg.backend == "flower":
        from groupwise.methods.fgrpo import flower_app

        return flower_app.run(loop, states, model_path)
    fed = InProcess(run.cfg, cfg, model_path)
    if states is not None:
        fed.load_states(states)
    return loop(fed)
