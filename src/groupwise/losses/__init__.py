"""Losses: per-token terms, weighted and summed; ``reduce.py`` is the only place denominators live.

Registry form (pure functions): ``fn(inp: LossInputs, cfg) -> LossTerms`` (a [B, T] per-token loss +
metrics). What a term reads beyond the policy's log-probs is declared at registration: ``needs`` (``ref``,
``teacher``, ``teacher_topk``, ``teacher_vocab``, ``vocab``; the update computes those, and only for terms
with non-zero weight) and ``advantage_only`` (the loss and its gradient vanish where A = 0, so the update
skips rows whose advantages are all zero when every active term says so).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from groupwise.registry import Registry, import_members
from groupwise.types import LossInputs, LossTerms


@runtime_checkable
class LossTerm(Protocol):
    def __call__(self, inp: LossInputs) -> LossTerms: ...


LOSSES = Registry("loss", LossTerm, "function", ("inp", "cfg"))

import_members(__name__, __path__)
