"""Masked per-group statistics over [N, G] tensors (padded groups)."""

from __future__ import annotations

import torch
from torch import Tensor


def group_count(mask: Tensor) -> Tensor:
    return mask.sum(-1, keepdim=True).to(torch.float64)  # [N, 1]


def group_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum(-1, keepdim=True) / group_count(mask).clamp(min=1)  # [N, 1]


def group_std(x: Tensor, mask: Tensor, ddof: int = 1) -> Tensor:
    """Masked std per group; groups with ``count <= ddof`` get 0 (no spread can be measured)."""
    n = group_count(mask)
    dev = (x - group_mean(x, mask)) * mask
    var = (dev**2).sum(-1, keepdim=True) / (n - ddof).clamp(min=1)
    return torch.where(n > ddof, var.sqrt(), torch.zeros_like(var))  # [N, 1]
