"""Sharded data parallelism (``trainer.data_parallel: fsdp``, under ``torchrun`` / ``accelerate launch``): every
rank holds 1/N of each weight, gradient and optimizer moment (PyTorch's FSDP2, ``fully_shard``) instead of a
full replica (``replicate``, the default: ``update.all_reduce_grads``).

- **What is sharded**: every block the model names in ``_no_split_modules`` (a transformers model's decoder
  layer, the unit accelerate and TRL wrap), then the root. Sharding is in place, so every component holding
  the policy (generator, privileged teacher) holds the sharded module.
- **Rollouts, evals, teacher updates** run on the whole weights (``full_weights``): the rollout stage
  decodes a different number of tokens on each rank, and a sharded forward is a collective every rank must
  join, so the stage gathers the weights once (one all-gather per block) and frees them after.
- **Update**: gradients are reduce-scattered with SUM, as the replicated path all-reduces them (the loss has
  step-global denominators, ``losses/reduce.py``), so the update equals one process's on the same batch
  (``tests/unit/update/test_fsdp.py``). Every rank runs the same number of micro-batch passes (each pass is a
  collective): a rank with fewer repeats one of its rows with zero loss (``update.Learner.step``).
- **Checkpoints** hold the full weights and optimizer state (gathered to rank 0), the format of a 1-process
  run, so a run resumes on any number of processes, sharded or not.
- **Not built**: LoRA and Ray rollout workers under FSDP (refused at load); the reference model and a frozen
  teacher are full replicas on every rank; no CPU offload, no mixed-precision policy (the model's dtype is
  used throughout), no hybrid sharding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` over the process group, block by block, in place; returns it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # the mesh on the model's own device type (a CPU run on a machine with CUDA stays on gloo)
    mesh = init_device_mesh(next(model.parameters()).device.type, (dist.get_world_size(),))
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in _units(model):
        module.set_gradient_divide_factor(1.0)  # sum, not mean, over ranks: the replicated path's all-reduce
        module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _units(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def full_weights(model: torch.nn.Module) -> Iterator[None]:
    """Inside, ``model`` has its whole weights on every rank and a forward is local (no collective), so ranks
    may run different numbers of forwards; every rank must enter (the gather is a collective). A no-op for an
    unsharded model, and inside another ``full_weights`` of the same model (the outer one reshards: a nested
    exit must not, or the ranks' later forwards would become collectives)."""
    if getattr(model, "_groupwise_full_weights", False):
        yield
        return
    units = _units(model) if is_sharded(model) else []
    for u in units:
        u.unshard()
        u.set_reshard_after_forward(False)
    model._groupwise_full_weights = True
    try:
        yield
    finally:
        model._groupwise_full_weights = False
        for u in units:
            u.reshard()
            u.set_reshard_after_forward(True)


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model state dict, optimizer state dict), whole, on rank 0 (other ranks: empty); every rank calls it.
    The optimizer's state is in ``optimizer.state_dict()``'s own layout (parameters by index), so a sharded
    run's checkpoint is a replicated or 1-process run's."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, named = get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, optimizer, options=opts)
    if dist.get_rank() != 0:  # the whole state exists on rank 0 only
        return {}, {}
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    weights = {k: v for k, v in weights.items() if k not in tied}  # a tied head is saved once, as unsharded
    index = {n: i for i, n in enumerate(_trainable(model))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]]
    return weights, {"state": {index[n]: v for n, v in named["state"].items()}, "param_groups": groups}


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a whole optimizer state (``optimizer.state_dict()``'s layout, from a run on any number of
    processes) into the sharded optimizer; every rank calls it with the same state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _trainable(model)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    named = {"state": {names[i]: v for i, v in state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))


def _trainable(model: torch.nn.Module) -> list[str]:
    """The optimizer's parameters by name, in its order (``update.build_optimizer``: trainable, in
    ``parameters()`` order)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor (the tensor itself otherwise)."""
    return t.to_local() if hasattr(t, "to_local") else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole value of a sharded or replicated distributed tensor (the tensor itself otherwise)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def on_all_ranks(value: int, op: str) -> int:
    """``value`` reduced over the ranks with ``op`` (``max`` / ``min``)."""
    t = torch.tensor([int(value)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN)
    return int(t.item())
