"""Masked per-group statistics over [N, G] tensors (padded groups)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from groupwise.lazy import torch

if TYPE_CHECKING:
    from torch import Tensor


def group_count(mask: Tensor) -> Tensor:
    return mask.sum(-1, keepdim=True).to(torch.float64)  # [N, 1]


def group_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum(-1, keepdim=True) / group_count(mask).clamp(min=1)  # [N, 1]


def group_constant(x: Tensor, mask: Tensor) -> Tensor:
    """[N, 1] True where a group's real entries are all equal (or it has fewer than two): no spread at all.

    Decided on the values themselves, not on a computed std: six rewards of 0.1 have a float mean that is not
    exactly 0.1, so their std is ~1e-17, not 0, and would pass a ``std > 0`` test."""
    hi = torch.where(mask, x, torch.full_like(x, -torch.inf)).amax(-1, keepdim=True)
    lo = torch.where(mask, x, torch.full_like(x, torch.inf)).amin(-1, keepdim=True)
    return (hi <= lo) | (group_count(mask) < 2)


def group_centred(x: Tensor, mask: Tensor) -> Tensor:
    """x − mean per group on real entries; exactly 0 in constant groups and on padding. [N, G]"""
    return torch.where(group_constant(x, mask), torch.zeros_like(x), (x - group_mean(x, mask)) * mask)


def group_scale(x: Tensor, mask: Tensor) -> Tensor:
    """[N, 1] exactly 1 for ordinary groups; for a group whose squared deviations could overflow (max |x|
    above sqrt(float max) / 2^16, ~1e150 in float64), a power of two within a factor 2 of its max |x|
    (|x / scale| < 2). Dividing by a power of two is exact, so the statistics of x / scale are those of x,
    scaled, without the overflow."""
    big = torch.where(mask, x.abs(), torch.zeros_like(x)).amax(-1, keepdim=True)  # [N, 1]
    limit = torch.finfo(x.dtype).max ** 0.5 / 2**16
    _, exponent = torch.frexp(big)  # big = mantissa · 2^exponent, mantissa in [0.5, 1)
    power = torch.ldexp(torch.ones_like(big), exponent - 1)  # 2^(exponent-1) <= big < 2^exponent; finite
    return torch.where(big > limit, power, torch.ones_like(big))


def group_std(x: Tensor, mask: Tensor, ddof: int = 1) -> Tensor:
    """Masked std per group; groups with ``count <= ddof`` get 0 (no spread can be measured)."""
    n = group_count(mask)
    dev = (x - group_mean(x, mask)) * mask
    var = (dev**2).sum(-1, keepdim=True) / (n - ddof).clamp(min=1)
    return torch.where(n > ddof, var.sqrt(), torch.zeros_like(var))  # [N, 1]
