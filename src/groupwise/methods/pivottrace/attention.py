"""Attention maps of a packed batch, for components that read model internals (PivotTrace).

Fused attention kernels (``sdpa``, flash) do not return attention weights, so ``eager_attention`` switches
a transformers model to the ``eager`` implementation for the duration of a probe and restores the previous
one afterwards (transformers 5: ``PreTrainedModel.set_attn_implementation``; models without it fall back
to setting ``config._attn_implementation``). Both implementations compute the same function, so the
log-probs of the probe pass equal the training pass to float tolerance (``tests/unit/select``).

``attention_maps`` runs one teacher-forced forward over a ``Packed`` batch (``models.forward.pack``) and
returns the completion log-probs, the full-vocabulary token entropy and the attention weights of every
layer and head, stacked as ``[L, B, H, S, S]`` with ``S = P + T`` (query rows × key columns, left-padded
prompts as in ``pack``). Rows of padded query positions carry no meaning; keys at padded positions get 0.
Memory is ``L·B·H·S²`` floats, so callers chunk the batch (``selector.py`` does, 64 rows at a time)
and, for a large LLM, should probe with a small batch or a subset of layers (``layers``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from groupwise.lazy import no_grad, torch
from groupwise.models.forward import Packed, completion_logprobs

if TYPE_CHECKING:
    from torch import Tensor


def _get_impl(model) -> str | None:
    return getattr(model.config, "_attn_implementation", None)


def _set_impl(model, impl: str | None) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
    else:
        model.config._attn_implementation = impl


@contextlib.contextmanager
def eager_attention(model) -> Iterator[None]:
    """Run the body with ``eager`` attention (which returns weights); restore the previous implementation."""
    previous = _get_impl(model)
    if previous == "eager":
        yield
        return
    _set_impl(model, "eager")
    try:
        yield
    finally:
        _set_impl(model, previous)


@no_grad
def attention_maps(model, packed: Packed, layers: Sequence[int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(logprobs [B, T], entropy [B, T], attentions [L, B, H, S, S]) of one packed batch, no grad, eval mode.

    ``layers`` selects layer indices (negative counts from the end); ``None`` keeps all of them.
    """
    was = model.training
    model.eval()
    try:
        with eager_attention(model):
            fwd = completion_logprobs(model, packed, with_entropy=True, output_attentions=True)
    finally:
        model.train(was)
    att = fwd.output.attentions
    if not att:
        raise RuntimeError(f"{type(model).__name__} returned no attention weights under eager attention")
    n = len(att)
    keep = range(n) if layers is None else [i % n for i in layers]
    return fwd.logprobs, fwd.entropy, torch.stack([att[i].float() for i in keep])
