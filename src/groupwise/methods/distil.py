"""``distil``: DistIL, distributional DAgger: forward cross-entropy to a feedback-conditioned teacher on the
student's own states, with a score-function term that carries future disagreement back to earlier tokens.

Agrawal, Fein-Ashley, Rashidinejad, "Reinforcement Learning from Rich Feedback with Distributional DAgger",
arXiv:2606.05152 (ICML 2026; no public code; spec §12). The teacher π_T is the model (or another) shown rich
feedback f (here the problem's verified solution or gold answer through the teacher's ``context``); the
student π_θ rolls out with no feedback. Per state s_t of a student rollout:

  ℓ_t(θ) = H×(π_T(·|x, f, y_<t), π_θ(·|x, y_<t)) = −Σ_a π_T(a|…) log π_θ(a|…)       (≥ H(π_T), = iff equal)
  L(θ)   = E_{y~π_θ}[Σ_t ℓ_t(θ)]
  ∇L     = E[Σ_t ∇ℓ_t] + c_seq · E[Σ_t ∇log π_θ(y_t|s_t) · (C_t − b_t)],   C_t = Σ_{t<t'≤t+H} sg(ℓ_{t'})

Three registered parts, one method:

  loss ``distil``        the local term ℓ_t with grad (``support: vocab`` exact, or ``topk``: the teacher's top-k
                         plus one tail bucket, the teacher's ``top_k``). Its gradient in the logits is
                         softmax(z) − π_T. Not advantage-only.
  transform ``distil``   after scoring: sg(ℓ_t) for every rollout from one no-grad teacher pass and one no-grad
                         student pass (both at the step's start, i.e. θ_old), stored per sample. ``cost: kl``
                         uses ℓ_t − H(π_T) instead (states where the teacher is unsure cost nothing), an option
                         the spec flags as a choice; default ``ce`` (faithful to "forward cross-entropy").
  credit ``distil``      the score-function term as token advantages for the run's policy-gradient term
                         (``ppo_clip``: on-policy its gradient is −A_t ∇log π): A_t = β_RL·A^GRPO_t − c_seq·(C_t − b_t).
                         b_t (``baseline``): ``position`` (default) the leave-one-out mean over the group of the
                         siblings' cost-to-go at the same normalised position (sibling j at index ⌊(t + ½)/L_i·L_j⌋);
                         ``total`` the leave-one-out mean total cost × the remaining fraction (L_i − t − 1)/L_i.
                         A group of one has b = 0. ``horizon`` H > 0 truncates the cost-to-go (0: to the end).

Design choices (the paper's estimator and constants are unknown): c_seq = 1 (the faithful gradient; 0 is the
local-only ablation), β_RL = 0 (DistIL replaces the scalar reward; > 0 is a hybrid). Both terms are reduced by
the run's reduction (``token_mean``: a mean over the step's loss tokens instead of the per-sequence sum, which
scales local and sequence terms alike). The cost-to-go comes from a separate pass at θ_old (one teacher pass
and one student pass more than the local term needs, counted in ``teacher/forwards``) because its baseline
reads the whole group, which a micro-batch does not hold. The black-box Monte-Carlo estimator (teacher samples
only) is not built: every teacher here exposes its distribution. c_seq = β_RL = 0 with the ``distil`` loss
alone is forward-CE distillation; c_seq = 0 and β_RL = 1 with the distil loss at weight 0 is GRPO bit for bit.
Metrics: ``loss/distil_ce``, ``loss/distil_kl`` (ℓ_t − H(π_T)), ``rollout/distil_cost`` (mean Σ_t sg(ℓ_t)),
its no-grad student passes (one call per ``chunk`` rows, each run in the update's micro-batches) in the loop's
``rollout/policy_forwards``, its teacher passes in ``teacher/*``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from groupwise.credit import CREDIT
from groupwise.lazy import no_grad, torch
from groupwise.losses import LOSSES, support_logprobs
from groupwise.losses.reduce import masked_sum_count
from groupwise.rollout import TRANSFORMS
from groupwise.rollout.base import RolloutContext
from groupwise.teachers import TeacherWant
from groupwise.types import Group, LossInputs, LossTerms, TokenBatch

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistILLossConfig:
    support: Literal["vocab", "topk"] = "vocab"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistILCostConfig:
    cost: Literal["ce", "kl"] = "ce"
    chunk: int = 16
    """Rows per teacher / student pass (each holds [rows, T, V] log-probs)."""

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"chunk={self.chunk}: must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistILConfig:
    c_seq: float = 1.0
    """Weight of the score-function (sequence) term; 0 = the local-only ablation."""
    beta_rl: float = 0.0
    """Weight of the incoming (GRPO) advantages; 0 = DistIL replaces the scalar reward."""
    baseline: Literal["position", "total"] = "position"
    horizon: int = 0
    """Tokens of future disagreement in C_t (0: to the end of the rollout)."""

    def __post_init__(self) -> None:
        if self.c_seq < 0 or self.beta_rl < 0 or self.horizon < 0:
            raise ValueError(f"c_seq={self.c_seq}, beta_rl={self.beta_rl}, horizon={self.horizon}: must be >= 0")

    def requires(self) -> tuple[str, ...]:
        """c_seq > 0: the 'distil' transform's ℓ_t; a sequence or RL term: a policy-gradient loss on the token
        advantages (ppo_clip)."""
        return (("distil_costs",) if self.c_seq > 0 else ()) + (("policy_gradient",) if self.c_seq or self.beta_rl
                                                                 else ())


def local_ce(lp: Tensor, lq: Tensor) -> Tensor:
    """ℓ_t = −Σ_v q_v log p_v from student / teacher log-probs over one support ([..., V] → [...])."""
    return -(lq.exp() * lp).sum(-1)


def teacher_entropy(lq: Tensor) -> Tensor:
    return -(lq.exp() * lq).sum(-1)


def needs(cfg: DistILLossConfig) -> tuple[str, ...]:
    return ("teacher_vocab", "vocab") if cfg.support == "vocab" else ("teacher_topk", "vocab")


@LOSSES.register("distil", config=DistILLossConfig, needs=needs)
def distil(inp: LossInputs, cfg: DistILLossConfig) -> LossTerms:
    lp, lq = support_logprobs(inp, cfg.support)
    ce = local_ce(lp, lq)
    m = inp.completion_mask
    kl = ce.detach() - teacher_entropy(lq)
    return LossTerms(ce, {"loss/distil_ce": masked_sum_count(ce.detach(), m),
                          "loss/distil_kl": masked_sum_count(kl, m)})


class DistILCost:
    def __init__(self, cfg: DistILCostConfig):
        self.cfg, self._m = cfg, {}

    @no_grad
    def __call__(self, groups: list[Group], ctx: RolloutContext) -> list[Group]:
        if ctx.teacher is None:  # built only when an active loss term reads it
            raise ValueError("the 'distil' transform needs the run's teacher: add the 'distil' loss with a weight > 0")
        rows = [(s, g.problem) for g in groups for s in g.samples]
        total = 0.0
        for i in range(0, len(rows), self.cfg.chunk):
            chunk = rows[i:i + self.cfg.chunk]
            samples, problems = [s for s, _ in chunk], [p for _, p in chunk]
            lq = ctx.teacher.score(samples, problems, TeacherWant(vocab=True)).vocab_logprobs
            for k, (s, lp) in enumerate(zip(samples, ctx.policy_logprobs(samples, vocab=True))):
                q = lq[k, :s.length].to(lp)
                cost = local_ce(lp, q) - (teacher_entropy(q) if self.cfg.cost == "kl" else 0.0)
                s.meta["distil_cost"] = cost * s.loss_mask
                total += float(s.meta["distil_cost"].sum())
        self._m = {"rollout/distil_cost": total / max(len(rows), 1)}
        return groups

    def metrics(self) -> dict[str, float]:
        return dict(self._m)


@TRANSFORMS.register("distil", config=DistILCostConfig, reports=True, provides=("distil_costs",), requires=("teacher",))
def distil_cost(cfg: DistILCostConfig, env) -> DistILCost:
    return DistILCost(cfg)


def cost_to_go(cost: Tensor, horizon: int = 0) -> Tensor:
    """C_t = Σ_{t<t'≤t+H} cost_{t'} (strictly future; H = 0: to the end) for a [T] cost."""
    n = len(cost)
    suffix = torch.cat([cost.flip(0).cumsum(0).flip(0), cost.new_zeros(1)])  # suffix[t] = Σ_{t' ≥ t}, suffix[T] = 0
    t = torch.arange(n)
    end = (t + horizon + 1).clamp(max=n) if horizon else torch.full((n,), n)
    return suffix[t + 1] - suffix[end]


def baselines(costs: list[Tensor], mode: str, horizon: int = 0) -> list[Tensor]:
    """b_t for each row of one group: the leave-one-out mean of the siblings' cost-to-go (see the docstring)."""
    ctg = [cost_to_go(c, horizon) for c in costs]
    out = []
    for i, c in enumerate(costs):
        others = [j for j in range(len(costs)) if j != i and len(costs[j])]
        n = len(c)
        if not others or not n:
            out.append(torch.zeros_like(c))
            continue
        if mode == "total":
            mean_total = sum(float(costs[j].sum()) for j in others) / len(others)
            out.append(mean_total * (n - 1 - torch.arange(n, dtype=c.dtype)) / n)
            continue
        u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
        out.append(torch.stack([ctg[j][(u * len(costs[j])).long().clamp(max=len(costs[j]) - 1)] for j in others])
                   .mean(0).to(c.dtype))
    return out


@CREDIT.register("distil", config=DistILConfig, requires=DistILConfig.requires)
def distil_credit(batch: TokenBatch, cfg: DistILConfig) -> TokenBatch:
    adv, m = batch.advantages * cfg.beta_rl, batch.completion_mask
    if cfg.c_seq > 0:
        for gi in batch.group_index.unique().tolist():
            members = (batch.group_index == gi).nonzero().flatten().tolist()
            costs = [batch.samples[b].meta["distil_cost"].double() for b in members]
            for b, c, base in zip(members, costs, baselines(costs, cfg.baseline, cfg.horizon)):
                t = min(len(c), adv.shape[1])
                adv[b, :t] -= (cfg.c_seq * (cost_to_go(c, cfg.horizon) - base))[:t].to(adv.dtype)
    return dataclasses.replace(batch, advantages=adv * m)
