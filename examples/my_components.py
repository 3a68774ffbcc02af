"""An out-of-tree component: a new advantage estimator registered exactly like a built-in.

    # in a recipe
    plugins: [examples/my_components.py]
    advantage: median_baseline

A_i = r_i − median_g r (the lower of the two middle rewards for an even group), a baseline a few lucky or unlucky
samples cannot move; padded entries get 0.
"""

import dataclasses

import torch

from groupwise.advantages import ADVANTAGES


@dataclasses.dataclass(frozen=True, kw_only=True)
class MedianBaselineConfig:
    pass


@ADVANTAGES.register("median_baseline", config=MedianBaselineConfig)
def median_baseline(batch, cfg):
    rewards = batch.rewards.masked_fill(~batch.mask, float("nan"))  # padding takes no part in the median
    median = rewards.nanmedian(dim=1, keepdim=True).values  # [N, 1]
    return torch.where(batch.mask, batch.rewards - median, torch.zeros_like(batch.rewards))
