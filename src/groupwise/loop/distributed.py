"""Several training processes (``torchrun --nproc_per_node N -m groupwise.cli train ...`` or ``accelerate
launch``): one run, its rollouts and its update split over the ranks.

- **Start**: with ``WORLD_SIZE`` > 1 in the environment, ``setup`` joins the process group (gloo on CPU,
  NCCL with ``model.device: cuda``, where each rank takes ``cuda:<LOCAL_RANK>``).
- **Rollouts**: every rank selects the same problems (the selector sees the same data everywhere), generates,
  scores and transforms its share (``shard``: every N-th problem) with its own random streams (the rank is
  part of every rollout seed), and the scored groups are all-gathered back into selection order
  (``gather``). Filtering, advantages, replay and credit then run on the whole batch on every rank, so their
  state stays identical without being sent.
- **Update**: ``update.Learner`` shards the rows and all-reduces the gradient (``update.data_parallel``), so
  the weights stay identical on every rank; with ``trainer.data_parallel: fsdp`` the weights themselves are
  sharded (``models/fsdp.py``) and the gradient is reduce-scattered.
- **I/O** is rank 0's: the run directory, metrics, rollout records, held-out evals and checkpoints; other ranks
  only read the checkpoint they resume from. A stop request (Ctrl-C / SIGTERM) on any rank stops all of them
  after the same step (``agree``).
- Per-rank numbers: ``perf/*`` (generation counters and timings) and the reward stage's failure counts are
  rank 0's own; the step's reward, rollout and update metrics cover the whole batch. The rollout records
  (``rollouts.jsonl``) hold groups of every rank, the samples a transform dropped only for rank 0's share.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from groupwise.config import RunConfig
from groupwise.parallel import data_parallel


def setup(cfg: RunConfig) -> RunConfig:
    """Join the process group when launched with several processes; returns ``cfg`` with this rank's device."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return cfg
    cuda = cfg.model.device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda and ":" not in cfg.model.device:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, device=f"cuda:{local}"))
    return cfg


def is_main() -> bool:
    return data_parallel()[0] == 0


def shard(items: list[Any]) -> list[Any]:
    """This rank's share: every world-th item, starting at its rank."""
    rank, world = data_parallel()
    return items if world == 1 else items[rank::world]


def gather(mine: list[Any]) -> list[Any]:
    """Every rank's share back in the original order (the inverse of ``shard``)."""
    rank, world = data_parallel()
    if world == 1:
        return mine
    import torch.distributed as dist

    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    parts[rank] = mine  # this rank's own objects, not copies: the rollout recorder matches samples by identity
    return [parts[i % world][i // world] for i in range(sum(len(p) for p in parts))]


def agree(flag: bool) -> bool:
    """True on every rank if it is True on any."""
    if data_parallel()[1] == 1:
        return flag
    import torch.distributed as dist

    t = torch.tensor([int(flag)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def check_in_sync(model: torch.nn.Module, step: int) -> None:
    """Every rank must hold bit-identical weights (the same summed gradient, the same optimizer step); a
    difference would be a silent fork of the run, so it stops it (checked at every checkpoint save)."""
    if data_parallel()[1] == 1:
        return
    import torch.distributed as dist

    with torch.no_grad():
        mine = float(sum(p.detach().double().abs().sum() + p.detach().double().sum() for p in model.parameters()))
    sums: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(sums, mine)
    if len(set(sums)) > 1:
        raise RuntimeError(f"step {step}: the ranks' weights differ (checksums {sums}); the processes forked "
                           "(a non-deterministic kernel, or a rank that trained on other data)")


def barrier() -> None:
    if data_parallel()[1] > 1:
        import torch.distributed as dist

        dist.barrier()


def teardown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
