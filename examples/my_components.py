"""An out-of-tree component: a new advantage estimator registered exactly like a built-in.

    # in a recipe
    plugins: [examples/my_components.py]
    advantage: maxrl

MaxRL (arXiv:2602.02710): A_i = (r_i − mean_g r) / mean_g r, for rewards >= 0; a group whose mean is 0 gets 0.
"""

import dataclasses

import torch

from groupwise.advantages import ADVANTAGES
from groupwise.advantages.stats import group_centred, group_mean


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaxRLConfig:
    pass


@ADVANTAGES.register("maxrl", config=MaxRLConfig)
def maxrl(batch, cfg):
    mean = group_mean(batch.rewards, batch.mask)  # [N, 1]
    safe = torch.where(mean > 0, mean, torch.ones_like(mean))
    return torch.where(mean > 0, group_centred(batch.rewards, batch.mask) / safe, torch.zeros_like(batch.rewards))
