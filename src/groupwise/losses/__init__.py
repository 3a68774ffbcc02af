"""Losses: per-token terms, weighted and summed; ``reduce.py`` is the only place denominators live.

Registry form (pure functions): ``fn(inp: LossInputs, cfg) -> LossTerms`` (a [B, T] per-token loss +
metrics). What a term reads beyond the policy's log-probs is declared at registration: ``needs`` (``ref``,
``teacher``, ``teacher_topk``, ``teacher_vocab``, ``vocab``; the update computes those, and only for terms
with non-zero weight) and ``advantage_only`` (the loss and its gradient vanish where A = 0, so the update
skips rows whose advantages are all zero when every active term says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from groupwise.lazy import torch
from groupwise.registry import Registry, described
from groupwise.types import LossInputs, LossTerms

if TYPE_CHECKING:
    from torch import Tensor


@runtime_checkable
class LossTerm(Protocol):
    def __call__(self, inp: LossInputs) -> LossTerms: ...


def contract(out: object, inp: LossInputs, *_: object) -> str:
    """What is wrong with a loss term's output ("" when nothing): LossTerms with a [B, T] per-token loss."""
    want = tuple(inp.logprobs.shape)
    if isinstance(out, LossTerms) and isinstance(out.per_token, torch.Tensor) and tuple(out.per_token.shape) == want:
        return ""
    got = (f"LossTerms with per_token of shape {tuple(out.per_token.shape)}" if isinstance(out, LossTerms)
           and isinstance(out.per_token, torch.Tensor) else described(out))
    return f"returned {got} for {want[0]} rows x {want[1]} tokens; the contract is LossTerms with a [B, T] per_token"


LOSSES = Registry("loss", LossTerm, "function", ("inp", "cfg"), contract=contract)


def student_on_support(vocab_logprobs: Tensor, topk_ids: Tensor) -> tuple[Tensor, Tensor]:
    """The student's log-probs on the teacher's top-k ids and its own tail mass outside them (with grad)."""
    values = vocab_logprobs.gather(-1, topk_ids)
    kept = torch.logsumexp(values, dim=-1)
    return values, torch.log(-torch.expm1(kept.clamp(max=-1e-12)))


def support_logprobs(inp: LossInputs, support: str) -> tuple[Tensor, Tensor]:
    """(student, teacher) log-probs over the term's support, [B, T, S]: the vocabulary, or top-k + tail."""
    assert inp.teacher is not None and inp.vocab_logprobs is not None, "opsd: the update did not give its inputs"
    if support == "vocab":
        return inp.vocab_logprobs, inp.teacher.vocab_logprobs
    t = inp.teacher
    student, tail = student_on_support(inp.vocab_logprobs, t.topk_ids)
    return torch.cat([student, tail.unsqueeze(-1)], -1), torch.cat([t.topk_logprobs, t.tail_logprob.unsqueeze(-1)], -1)
