"""Token-level credit assignment: rewrite the per-token advantages and loss weights of a step's rows.

Registry form (pure functions): ``fn(batch: TokenBatch, cfg) -> TokenBatch``, a copy with ``advantages``
and/or ``loss_weights`` rewritten (``dataclasses.replace``). Components run in the order listed in
``credit:``; with none, each row's sequence advantage is broadcast over its loss tokens and every loss token
weighs 1 (plain GRPO). Drift shaping, reward redistribution, graph-edge advantages and per-token loss
weights (``mode_token_weight``) register here.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from groupwise.registry import Registry, import_members
from groupwise.types import TokenBatch


@runtime_checkable
class Credit(Protocol):
    def __call__(self, batch: TokenBatch) -> TokenBatch: ...


CREDIT = Registry("credit", Credit, "function", ("batch", "cfg"))

import_members(__name__, __path__)
