"""The data contract shared by every stage.

Shape letters, used in comments and docstrings everywhere:
  N  prompts (groups) in a step          G  samples per group (padded to the largest group)
  B  sample rows in a (micro-)batch       T  completion tokens (padded)
  P  prompt tokens (left-padded)          V  vocabulary

Log-prob names (one per concept): ``rollout_logprobs`` (from the generator, at the sampling temperature),
``old_logprobs`` (the policy that produced the update's ratio denominator), ``ref_logprobs`` (frozen
reference), ``teacher.logprobs`` (``TeacherOutput``), and ``logprobs`` (the current policy, with grad).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from groupwise.lazy import torch

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True)
class Problem:
    """One task item. ``prompt`` is chat messages (``[{"role": ..., "content": ...}]``) or plain text."""

    id: str
    prompt: str | tuple[dict[str, str], ...]
    answer: str
    difficulty: int = 0
    reference: str = ""  # a reference solution (SFT target, ROUGE reference, hint text)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)


@dataclasses.dataclass
class Completion:
    """What a generator returns for one row: the sampled tokens and their log-probs.

    ``rollout_logprobs[t]`` is the sampler's own log p(completion_ids[t]), computed by the generator as it
    sampled (``hf``: its decode loop; ``vllm``: the engine's log-probs), of the distribution it drew from:
    logits / temperature over the full vocabulary. Under top-p the token was drawn from that distribution
    renormalised over the nucleus, whose log-prob is this minus log(kept mass); the kept mass is left out on
    purpose, so that the value is on the trainer's support (its ``logprobs`` are logits / temperature over the
    full vocabulary too) and ``exp(old_logprobs − rollout_logprobs)``, the importance weight of
    ``loss.importance_sampling`` and the ``mismatch/*`` metrics, measures the sampler-trainer gap and not the
    truncation (the bias of TRL #6789, where vLLM's renormalised log-probs scale every token by the kept mass).
    ``forced`` marks tokens that were prefilled, not sampled (a forced prefix, a
    tool's output). ``meta`` is copied into ``Sample.meta`` (e.g. a multi-turn rollout's turns and tool calls).
    """

    completion_ids: Tensor  # [T] long
    rollout_logprobs: Tensor  # [T] float
    finish_reason: str  # "stop" (EOS or stop string) | "length" | "turns" (a tool call in the last turn)
    forced: Tensor | None = None  # [T] bool
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Sample:
    """One scored completion inside a group."""

    prompt_ids: Tensor  # [P] long
    completion_ids: Tensor  # [T] long
    rollout_logprobs: Tensor  # [T] float; NaN where the generator did not sample the token (edited text)
    loss_mask: Tensor  # [T] bool; False for tokens that must not be trained on (prefilled mode tokens)
    finish_reason: str
    text: str = ""
    correct: bool = False
    verifier_error: bool = False
    reward: float = 0.0
    reward_terms: dict[str, float] = dataclasses.field(default_factory=dict)  # raw term values; NaN = not applicable
    scored: bool = False  # set by the reward stage; the loop refuses unscored samples before the advantage stage
    disqualified: str = ""  # a reason set by a builder: graded incorrect without calling the verifier
    # Behaviour-policy log-probs for the PPO ratio. None means on-policy: the ratio's denominator is the
    # current policy's detached log-prob, so no extra forward pass is needed.
    old_logprobs: Tensor | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.completion_ids.numel())


@dataclasses.dataclass
class Group:
    """G samples of one problem. ``step`` is the training step that generated it (replay age);
    ``policy_version`` the policy version that sampled it (updates applied: ``step`` in the synchronous loop,
    max(0, step − K) with ``rollout.max_async_level`` K; the loop logs step − version as staleness)."""

    problem: Problem
    samples: list[Sample]
    step: int = 0
    replayed: bool = False
    policy_version: int = 0
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


@dataclasses.dataclass
class ScoredBatch:
    """Groups as padded [N, G] tensors: the input of every advantage estimator.

    Groups may differ in size (an editor can append samples); ``mask`` marks real entries. Padded entries
    hold reward 0 and must get advantage 0.
    """

    groups: list[Group]
    rewards: Tensor  # [N, G] float
    correct: Tensor  # [N, G] bool
    lengths: Tensor  # [N, G] float (completion tokens)
    mask: Tensor  # [N, G] bool
    step: int = 0

    @staticmethod
    def from_groups(groups: list[Group], step: int = 0) -> ScoredBatch:
        n, g = len(groups), max((len(x.samples) for x in groups), default=0)
        rewards = torch.zeros(n, g, dtype=torch.float64)
        correct = torch.zeros(n, g, dtype=torch.bool)
        lengths = torch.zeros(n, g, dtype=torch.float64)
        mask = torch.zeros(n, g, dtype=torch.bool)
        for i, grp in enumerate(groups):
            for j, s in enumerate(grp.samples):
                rewards[i, j], correct[i, j], lengths[i, j], mask[i, j] = s.reward, s.correct, s.length, True
        return ScoredBatch(groups, rewards, correct, lengths, mask, step)

    def meta(self, key: str, default: float = 0.0) -> Tensor:
        """A per-sample ``meta[key]`` value as a padded [N, G] float tensor."""
        out = torch.full(self.rewards.shape, default, dtype=torch.float64)
        for i, grp in enumerate(self.groups):
            for j, s in enumerate(grp.samples):
                out[i, j] = float(s.meta.get(key, default))
        return out


@dataclasses.dataclass(frozen=True)
class Replayed:
    """A stored group a replay buffer returns for this step, with the sequence advantages it was trained on
    (``[G]``, the buffer's own record); its samples carry behaviour log-probs in ``old_logprobs``."""

    group: Group
    advantages: Tensor  # [G] float64


@dataclasses.dataclass(frozen=True)
class TokenBatch:
    """All training rows of a step, flattened, with token-aligned tensors: from the advantage stage to the loss.

    Row order is group-major: the fresh groups' samples, then the replayed groups'. ``advantages`` starts as
    each row's sequence advantage broadcast over its loss tokens and ``loss_weights`` as 1 on loss tokens (0
    elsewhere); credit components return a copy with either rewritten (``dataclasses.replace``), and every
    loss term's per-token loss is multiplied by ``loss_weights`` before reduction.
    """

    samples: list[Sample]
    problems: list[Problem]  # [B], the problem of each row
    group_index: Tensor  # [B] long
    replayed: Tensor  # [B] bool
    completion_ids: Tensor  # [B, T] long (pad 0)
    completion_mask: Tensor  # [B, T] bool: real tokens that carry loss
    advantages: Tensor  # [B, T] float32
    loss_weights: Tensor  # [B, T] float32

    @staticmethod
    def build(groups: list[Group], adv: Tensor, replayed: list[Replayed] = ()) -> TokenBatch:
        """Rows of ``groups`` (advantages ``adv`` [N, G]) then of ``replayed`` (their stored advantages)."""
        all_groups = [(g, adv[i]) for i, g in enumerate(groups)] + [(r.group, r.advantages) for r in replayed]
        rows = [(gi, g, s, a[j]) for gi, (g, a) in enumerate(all_groups) for j, s in enumerate(g.samples)]
        b, t = len(rows), max((s.length for _, _, s, _ in rows), default=1)
        ids = torch.zeros(b, t, dtype=torch.long)
        mask = torch.zeros(b, t, dtype=torch.bool)
        advantages = torch.zeros(b, t)
        for k, (_, _, s, a) in enumerate(rows):
            ids[k, :s.length] = s.completion_ids
            mask[k, :s.length] = s.loss_mask
            advantages[k, :s.length] = a.float() * s.loss_mask.float()
        fresh = sum(len(g.samples) for g in groups)
        return TokenBatch(samples=[s for *_, s, _ in rows], problems=[g.problem for _, g, _, _ in rows],
                          group_index=torch.tensor([gi for gi, *_ in rows], dtype=torch.long),
                          replayed=torch.arange(b) >= fresh, completion_ids=ids, completion_mask=mask,
                          advantages=advantages, loss_weights=mask.float())


@dataclasses.dataclass
class TeacherOutput:
    """A teacher's view of the student's sampled tokens, completion-aligned like the student's ``logprobs``.

    All log-probs are of the teacher's temperature-scaled distribution over the full vocabulary (logits / T,
    no top-p / top-k renormalisation), the convention of the trainer's own ``logprobs``, so a ratio or a
    divergence between the two is never biased by a truncated support. Padded positions hold 0.
    """

    logprobs: Tensor  # [B, T] teacher log-prob of each sampled token
    topk_ids: Tensor | None = None  # [B, T, K] the teacher's K most likely tokens
    topk_logprobs: Tensor | None = None  # [B, T, K] their log-probs
    tail_logprob: Tensor | None = None  # [B, T] log(1 − Σ_k p_k), the mass outside the top K
    vocab_logprobs: Tensor | None = None  # [B, T, V] the whole distribution


@dataclasses.dataclass
class LossInputs:
    """Everything a loss term may read for one micro-batch. Tensors are [B, T], completion-aligned."""

    logprobs: Tensor  # current policy, with grad
    old_logprobs: Tensor  # detached; equals logprobs.detach() for on-policy rows
    advantages: Tensor
    completion_mask: Tensor  # bool
    rollout_logprobs: Tensor  # NaN where unknown
    loss_weights: Tensor | None = None  # [B, T]; the update multiplies every term's per-token loss by it
    ref_logprobs: Tensor | None = None
    teacher: TeacherOutput | None = None  # when a term needs "teacher*"
    vocab_logprobs: Tensor | None = None  # [B, T, V] current policy, with grad, when a term needs "vocab"
    entropy: Tensor | None = None  # detached full-vocabulary entropy per token
    samples: list[Sample] = dataclasses.field(default_factory=list)
    problems: list[Problem] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class LossTerms:
    """A loss term's output: a per-token loss [B, T] (reduced by ``losses.reduce``) and detached metrics.

    Metrics are (sum over the micro-batch, count) pairs so that the update can average them over the step
    without depending on the micro-batch split.
    """

    per_token: Tensor
    metrics: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
