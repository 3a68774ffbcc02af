"""Token-level credit assignment: rewrite the per-token advantages and loss weights of a step's rows.

Registry form (pure functions): ``fn(batch: TokenBatch, cfg) -> TokenBatch``, a copy with ``advantages``
and/or ``loss_weights`` rewritten (``dataclasses.replace``). Components run in the order listed in
``credit:``; with none, each row's sequence advantage is broadcast over its loss tokens and every loss token
weighs 1 (plain GRPO). Drift shaping, reward redistribution, graph-edge advantages and per-token loss
weights (``mode_token_weight``) register here.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from groupwise.registry import Registry
from groupwise.types import TokenBatch


@runtime_checkable
class Credit(Protocol):
    def __call__(self, batch: TokenBatch) -> TokenBatch: ...


def contract(out: object, batch: TokenBatch, *_: object) -> str:
    """What is wrong with a credit output ("" when nothing): its [B, T] tensors keep their shape."""
    want = tuple(batch.completion_mask.shape)
    if isinstance(out, TokenBatch) and tuple(out.advantages.shape) == want == tuple(out.loss_weights.shape):
        return ""
    got = (f"advantages {tuple(out.advantages.shape)}, loss_weights {tuple(out.loss_weights.shape)}"
           if isinstance(out, TokenBatch) else f"a {type(out).__name__}")
    return (f"returned {got} for {want[0]} rows x {want[1]} tokens; the contract is a TokenBatch whose "
            "advantages and loss_weights keep the (rows, tokens) shape")


CREDIT = Registry("credit", Credit, "function", ("batch", "cfg"), contract=contract)

