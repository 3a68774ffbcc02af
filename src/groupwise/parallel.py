"""Where this process stands among the training processes (torchrun ranks)."""

from __future__ import annotations


def data_parallel() -> tuple[int, int]:
    """(rank, world size) of the torch.distributed group this process is in; (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
