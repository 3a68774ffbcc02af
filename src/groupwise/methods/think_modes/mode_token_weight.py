"""``mode_token_weight``: the per-token loss weight of adaptive think modes' mode token (arXiv:2608.20256).

Under a token-mean reduction the one mode token of a rollout weighs as little as any of its hundreds of
content tokens, so the routing decision learns slowly (spec §2; Thinkless decouples the two). This credit
component multiplies the loss weight of a *sampled* mode token by w = ``mode_token_loss_weight``:

  loss_weights[b, t] ← w · loss_weights[b, t]   for each token t of row b's mode tag, if the policy chose it
                                                 (``meta["mode"]`` valid and ``meta["mode_forced"]`` False;
                                                 a tag is ``meta["mode_len"]`` tokens, 1 in the embedded model)

Forced (prefilled) mode tokens carry no loss at all, and rows whose first token is not a mode (format
failures) keep weight 1. Advantages are untouched. w = 1 (the default: the spec wants the knob off unless
asked for) returns the batch itself, so the run is plain think modes bit for bit. Pair with the ``think_modes``
builder (checked at load). Design choice: the weight scales the mode token's term in every loss term (the
update applies ``loss_weights`` uniformly); the denominators of the reduction do not change.
"""

from __future__ import annotations

import dataclasses

from groupwise.credit import CREDIT
from groupwise.methods.think_modes.builder import MODES
from groupwise.types import TokenBatch


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModeTokenWeightConfig:
    mode_token_loss_weight: float = 1.0
    """w, the factor on each sampled mode token's loss (1: unchanged)."""

    def __post_init__(self) -> None:
        if not self.mode_token_loss_weight >= 0:
            raise ValueError(f"mode_token_loss_weight={self.mode_token_loss_weight}: must be >= 0")


@CREDIT.register("mode_token_weight", config=ModeTokenWeightConfig, requires=("think_modes",))
def mode_token_weight(batch: TokenBatch, cfg: ModeTokenWeightConfig) -> TokenBatch:
    if cfg.mode_token_loss_weight == 1.0:
        return batch
    weights = batch.loss_weights.clone()  # [B, T]
    for b, s in enumerate(batch.samples):
        if s.meta.get("mode") in MODES and not s.meta.get("mode_forced", True) and bool(s.loss_mask[0]):
            weights[b, :int(s.meta.get("mode_len", 1))] *= cfg.mode_token_loss_weight
    return dataclasses.replace(batch, loss_weights=weights)
