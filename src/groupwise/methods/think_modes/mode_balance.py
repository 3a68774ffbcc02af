"""``mode_balance``: the load-balancing term of adaptive think modes (arXiv:2608.20256), an advantage transform.

  A_i ← A_i + g_i · β_bal · (p* − f_{m_i})
  g_i = 1[c_i] if p* − f_{m_i} > 0   (an under-used mode is pushed up only on correct rollouts)
        1[¬c_i] if p* − f_{m_i} < 0  (an over-used mode is pushed down only on incorrect rollouts)

so a correct rollout's advantage is never reduced and an incorrect one's never increased. f_m is the share
of mode m among the batch's samples with a valid mode (``meta["mode"]`` written by the ``think_modes``
builder), over the whole training batch of the step, not per group (groups are too small for shares; spec
§2 [design]); samples with an invalid first token or no mode get no term. The paper pairs it with
mean-centred advantages (``advantage: dr_grpo``, no std division), so the term is on the reward scale.
β_bal = 0 returns the input unchanged (the neutral setting). Padded entries stay 0.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from groupwise.advantages import ADVANTAGE_TRANSFORMS
from groupwise.lazy import torch
from groupwise.types import ScoredBatch

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModeBalanceConfig:
    coef: float = 0.1
    """β_bal, the balance strength (spec default 0.1; the paper's value is not reported)."""
    target_share: float = 1 / 3
    """p*, each mode's target share (1/3 for three modes)."""

    def __post_init__(self) -> None:
        if self.coef < 0 or not 0 < self.target_share <= 1:
            raise ValueError(f"coef={self.coef}, target_share={self.target_share}: need coef >= 0 and "
                             "target_share in (0, 1]")


@ADVANTAGE_TRANSFORMS.register("mode_balance", config=ModeBalanceConfig)
def mode_balance(batch: ScoredBatch, adv: Tensor, cfg: ModeBalanceConfig) -> Tensor:
    if cfg.coef == 0:
        return adv
    modes = [[s.meta.get("mode", "invalid") for s in g.samples] for g in batch.groups]
    valid = [m for row in modes for m in row if m != "invalid"]
    if not valid:
        return adv
    share = {m: valid.count(m) / len(valid) for m in set(valid)}
    term = torch.zeros_like(adv)  # [N, G]
    for i, row in enumerate(modes):
        for j, m in enumerate(row):
            if m == "invalid":
                continue
            t = cfg.coef * (cfg.target_share - share[m])
            correct = bool(batch.correct[i, j])
            if (t > 0 and correct) or (t < 0 and not correct):  # the asymmetric gate
                term[i, j] = t
    return adv + term * batch.mask
