"""``rlcsd``: RLCSD, contrastive on-policy self-distillation that modulates the GRPO advantage per token.

Pan, Tao, Zhai, Zhang, Liu, Ding, Liu, Wen, "Reinforcement Learning with Contrastive on-policy
Self-Distillation", arXiv:2606.11709 (official code THU-BPM/RLCSD, ``compute_policy_loss_rlcsd``; spec §10).
A hinted teacher's log-prob gap is dominated by style tokens that any hint induces; contrasting a correct hint
with wrong hints in the same template cancels the style shift. Two registered parts, one method:

Transform (after scoring; the teacher is the policy at π_old, i.e. a snapshot synced every step):
  per group with both correct (G+) and wrong (G−) rollouts, per target rollout i: the positive hint is a correct
  sibling ≠ i drawn uniformly (``positive: self_rollout``) or the problem's reference (``reference``); the
  negatives are wrong siblings ≠ i whose answer can be extracted, K = min(k_max, pool) of them (the first at
  random, then the others in shuffled order, as the code); a target with no positive or no negative is skipped.
  e_t = log π_T(y_t | x, h_c, y_<t) − log((1/K) Σ_k π_T(y_t | x, h_w,k, y_<t))   (one batched teacher-forced pass)
Credit (no grad), with A the row's GRPO advantage:
  s_t = tanh(e_t / τ),  r_t = clip(β·λ·s_t, [c_lo, c_hi]),  sel_t = |r_t| > δ,  Ã_t = A + sel_t·r_t,
  sign-preserving: Ã_t = max(Ã_t, 0) if A > 0, min(Ã_t, 0) if A < 0, 0 if A = 0
  two-path loss L = mean_{t∉sel} PPO_t(A) + η · mean_{t∈sel} PPO_t(Ã_t): written as loss weights under the
  ``token_mean`` reduction, N/N_off on unselected and η·N/N_sel on selected loss tokens of the step (N = all)
  Rows without a contrast (no e_t: a uniform group, a lone correct rollout, no wrong sibling with an answer)
  are dropped from the update, weight 0 and in neither mean (``drop_uncontrasted``, the official code); with
  ``drop_uncontrasted: false`` they stay in the off-path mean as plain GRPO rows.
One-sided ablation (``negatives: none``, the spec's RLSD arm): e_t = log π_T(y_t | x, h_c) − log π_T(y_t | x), the
same hint against the plain prompt, for every target with a positive (the same credit stage, so the only change
is what the hint is contrasted with).
Defaults are the official configs: τ = 0.02, β = 1, λ = 0.5, δ = 0.02, η = 1, clip ±2, k_max = 4.
Deviations: the two means are step-global (micro-batch invariant); the official code normalises within each
micro-batch. The snapshot teacher is re-synced every step (the code: every 10). β = 0 with
``drop_uncontrasted: false`` is plain GRPO bit for bit. Metrics: ``rollout/rlcsd_targets`` (share of
rollouts with a contrastive signal), ``rollout/rlcsd_sel_frac``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from groupwise.credit import CREDIT
from groupwise.lazy import torch
from groupwise.rollout import TRANSFORMS
from groupwise.rollout.base import RolloutContext
from groupwise.teachers import check_template
from groupwise.types import Group, Sample, TokenBatch


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLCSDHintsConfig:
    context: str = "{prompt}\n<ref>{hint}</ref>"
    """The teacher's prompt for a hint (the same template for the positive and the negative hints)."""
    positive: Literal["self_rollout", "reference"] = "self_rollout"
    negatives: Literal["wrong_hints", "none"] = "wrong_hints"
    """``none``: the one-sided ablation (RLSD-style self-distillation), e_t = log π_T(y_t | x, h_c) − log π(y_t | x),
    the hinted log-prob against the plain prompt's; no wrong sibling is needed."""
    k_max: int = 4

    def __post_init__(self) -> None:
        check_template(self.context.replace("{hint}", "{reference}"))
        if "{hint}" not in self.context or self.k_max < 1:
            raise ValueError(f"context={self.context!r} needs {{hint}} and k_max={self.k_max} must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLCSDConfig:
    tau: float = 0.02
    beta: float = 1.0
    lam: float = 0.5
    delta: float = 0.02
    eta: float = 1.0
    clip_low: float = -2.0
    clip_high: float = 2.0
    drop_uncontrasted: bool = True
    """Rows without a contrast get loss weight 0 and count in neither mean (the official code); false: they
    are kept as plain GRPO rows in the unselected path (this library before; the RLCSD experiment's runs)."""

    def __post_init__(self) -> None:
        if not self.tau > 0 or self.beta < 0 or self.lam < 0 or self.delta < 0 or self.eta < 0:
            raise ValueError("tau must be > 0 and beta, lam, delta, eta >= 0")
        if not self.clip_low <= 0 <= self.clip_high:
            raise ValueError(f"clip [{self.clip_low}, {self.clip_high}] must contain 0")

    def check(self, run) -> None:
        if run.loss.reduction != "token_mean":
            raise ValueError(f"the two-path loss is written as token_mean weights; loss.reduction is "
                             f"'{run.loss.reduction}'")


def contrast(lp_c: torch.Tensor, lp_w: torch.Tensor) -> torch.Tensor:
    """e_t = lp_c − (logsumexp_k lp_w,k − log K): ``lp_c`` [T], ``lp_w`` [K, T]."""
    return lp_c - (torch.logsumexp(lp_w, dim=0) - math.log(lp_w.shape[0]))


class RLCSDHints:
    def __init__(self, cfg: RLCSDHintsConfig):
        self.cfg, self._m = cfg, {}

    def hints(self, g: Group, i: int, ctx: RolloutContext, gen: torch.Generator) -> tuple[str, list[str]] | None:
        """(positive hint, negative hints) for target i of group g, or None if it gets no contrast."""
        good = [j for j, s in enumerate(g.samples) if s.correct and j != i]
        bad = [j for j, s in enumerate(g.samples) if not s.correct and j != i and ctx.task.extract_answer(s.text)]
        one_sided = self.cfg.negatives == "none"
        if (not bad and not one_sided) or (self.cfg.positive == "self_rollout" and not good):
            return None
        pos = g.problem.reference if self.cfg.positive == "reference" else \
            g.samples[good[int(torch.randint(len(good), (1,), generator=gen))]].text
        if one_sided:
            return pos, []
        order = torch.randperm(len(bad), generator=gen).tolist()  # the first at random, the rest shuffled
        return pos, [g.samples[bad[k]].text for k in order[:self.cfg.k_max]]

    def __call__(self, groups: list[Group], ctx: RolloutContext) -> list[Group]:
        gen, queries, slots = ctx.rng("rlcsd"), [], []
        for g in groups:
            mixed = any(s.correct for s in g.samples) and not all(s.correct for s in g.samples)
            for i, s in enumerate(g.samples):
                s.meta.pop("rlcsd_e", None)
                got = self.hints(g, i, ctx, gen) if mixed or self.cfg.negatives == "none" else None
                if got is None:
                    continue
                others = got[1] or [None]  # one-sided: the sample itself, on its plain prompt
                queries += ([self._query(g, s, got[0], ctx)]
                            + [s if h is None else self._query(g, s, h, ctx) for h in others])
                slots.append((s, 1 + len(others)))
        lps, at = (ctx.policy_logprobs(queries) if queries else []), 0
        for s, n in slots:
            rows = torch.stack([lp.float() for lp in lps[at:at + n]])  # [1 + K, T]
            at += n
            s.meta["rlcsd_e"] = contrast(rows[0], rows[1:])
        total = sum(len(g.samples) for g in groups)
        self._m = {"rollout/rlcsd_targets": len(slots) / max(total, 1),
                   "rollout/rlcsd_teacher_rows": float(len(queries))}
        return groups

    def _query(self, g: Group, s: Sample, hint: str, ctx: RolloutContext) -> Sample:
        user = g.problem.prompt if isinstance(g.problem.prompt, str) else g.problem.prompt[-1]["content"]
        text = self.cfg.context.replace("{hint}", hint).replace("{prompt}", user)
        prompt = (text if isinstance(g.problem.prompt, str)
                  else (*g.problem.prompt[:-1], {"role": "user", "content": text}))
        ids = ctx.encode(dataclasses.replace(g.problem, prompt=prompt))
        return Sample(prompt_ids=ids, completion_ids=s.completion_ids, rollout_logprobs=s.rollout_logprobs,
                      loss_mask=s.loss_mask, finish_reason=s.finish_reason)

    def metrics(self) -> dict[str, float]:
        return dict(self._m)


@TRANSFORMS.register("rlcsd", config=RLCSDHintsConfig, provides=("rlcsd_contrast",), reports=True)
def rlcsd_hints(cfg: RLCSDHintsConfig, env) -> RLCSDHints:
    return RLCSDHints(cfg)


def modulate(a: torch.Tensor, e: torch.Tensor, cfg: RLCSDConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(Ã_t, sel_t) for one row's advantages ``a`` [T] and contrast ``e`` [T] (see the module docstring)."""
    r = torch.clamp(cfg.beta * cfg.lam * torch.tanh(e / cfg.tau), cfg.clip_low, cfg.clip_high)
    sel = r.abs() > cfg.delta
    mod = a + sel * r
    mod = torch.where(a > 0, mod.clamp(min=0), torch.where(a < 0, mod.clamp(max=0), torch.zeros_like(mod)))
    return mod, sel


@CREDIT.register("rlcsd", config=RLCSDConfig, requires=("rlcsd_contrast",))
def rlcsd(batch: TokenBatch, cfg: RLCSDConfig) -> TokenBatch:
    adv, m = batch.advantages.clone(), batch.completion_mask
    sel, kept = torch.zeros_like(m), torch.ones(m.shape[0], 1, dtype=torch.bool, device=m.device)
    for b, s in enumerate(batch.samples):
        e = s.meta.get("rlcsd_e")
        if e is None:
            kept[b] = not cfg.drop_uncontrasted
            continue
        t = min(len(e), adv.shape[1])
        adv[b, :t], sel[b, :t] = modulate(adv[b, :t], e[:t].to(adv.dtype), cfg)
    sel &= m
    n, n_sel, n_off = float(m.sum()), float(sel.sum()), float((m & kept & ~sel).sum())
    if n_sel == 0 and bool(kept.all()):  # nothing selected, nothing dropped: every A as it was (β = 0: GRPO)
        return batch
    w = torch.where(sel, cfg.eta * n / max(n_sel, 1.0), n / max(n_off, 1.0)) * kept
    w = w.to(batch.loss_weights.dtype)
    return dataclasses.replace(batch, advantages=adv * m, loss_weights=batch.loss_weights * w * m)
