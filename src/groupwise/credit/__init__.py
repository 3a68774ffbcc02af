"""Token-level credit assignment: rewrite the per-token advantages of a step's rows.

Registry signature: ``fn(batch: TokenBatch, cfg) -> Tensor[B, T]`` (the new ``batch.advantages``).
Components run in the order listed in ``credit:``; with none, each row's sequence advantage is broadcast
over its tokens (plain GRPO). Method components (drift shaping, reward redistribution, graph edges,
distillation gates) register here.
"""

from groupwise.registry import Registry

CREDIT = Registry("credit", "fn(batch: TokenBatch, cfg) -> Tensor[B, T]")
