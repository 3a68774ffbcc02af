"""The data contract shared by every stage.

Shape letters, used in comments and docstrings everywhere:
  N  prompts (groups) in a step          G  samples per group (padded to the largest group)
  B  sample rows in a (micro-)batch       T  completion tokens (padded)
  P  prompt tokens (left-padded)          V  vocabulary

Log-prob names (one per concept): ``rollout_logprobs`` (from the generator, at the sampling temperature),
``old_logprobs`` (the policy that produced the update's ratio denominator), ``ref_logprobs`` (frozen
reference), ``teacher_logprobs``, and ``logprobs`` (the current policy, with grad).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
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

    ``rollout_logprobs[t]`` is log p(completion_ids[t]) under the sampling distribution (logits / temperature,
    before top-p truncation). ``forced`` marks tokens that were prefilled, not sampled.
    """

    completion_ids: Tensor  # [T] long
    rollout_logprobs: Tensor  # [T] float
    finish_reason: str  # "stop" (EOS or stop string) | "length"
    forced: Tensor | None = None  # [T] bool


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
    reward_terms: dict[str, float] = dataclasses.field(default_factory=dict)
    advantage: float = 0.0
    # Behaviour-policy log-probs for the PPO ratio. None means on-policy: the ratio's denominator is the
    # current policy's detached log-prob, so no extra forward pass is needed.
    old_logprobs: Tensor | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.completion_ids.numel())


@dataclasses.dataclass
class Group:
    """G samples of one problem. ``step`` is the training step that generated it (replay age)."""

    problem: Problem
    samples: list[Sample]
    step: int = 0
    replayed: bool = False
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


@dataclasses.dataclass
class TokenBatch:
    """All training rows of a step, flattened, with token-aligned tensors: the input of credit assignment.

    Row order is group-major (group 0's samples, then group 1's, ...). ``advantages`` starts as each
    row's sequence advantage broadcast over its tokens; credit components rewrite it.
    """

    samples: list[Sample]
    group_index: Tensor  # [B] long
    completion_ids: Tensor  # [B, T] long (pad 0)
    completion_mask: Tensor  # [B, T] bool: real tokens that carry loss
    advantages: Tensor  # [B, T] float


@dataclasses.dataclass
class LossInputs:
    """Everything a loss term may read for one micro-batch. Tensors are [B, T], completion-aligned."""

    logprobs: Tensor  # current policy, with grad
    old_logprobs: Tensor  # detached; equals logprobs.detach() for on-policy rows
    advantages: Tensor
    completion_mask: Tensor  # bool
    rollout_logprobs: Tensor  # NaN where unknown
    ref_logprobs: Tensor | None = None
    teacher_logprobs: Tensor | None = None
    entropy: Tensor | None = None  # detached full-vocabulary entropy per token
    samples: list[Sample] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class LossTerms:
    """A loss term's output: a per-token loss [B, T] (reduced by ``losses.reduce``) and detached metrics.

    Metrics are (sum over the micro-batch, count) pairs so that the update can average them over the step
    without depending on the micro-batch split.
    """

    per_token: Tensor
    metrics: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
