"""The update: micro-batching by token budget, step-global normalisation, backward, clip, optimizer step.

One RL step = ``ppo_epochs`` optimizer steps over all its rows. Rows are sorted by length and packed into
micro-batches under ``micro_batch_tokens`` (padded prompt + completion tokens), each padded only to its
own widths. Rows whose advantages are all zero are skipped when every active loss term is
``advantage_only`` (its loss and gradient vanish where A = 0, as for ``ppo_clip``): they still count in
the step's denominators, so the update is identical, minus their forward and backward passes (GRPO's
zero-variance groups are often half the batch). ``old_logprobs`` cost no forward pass: on-policy rows use the current policy's detached
log-probs from the first epoch's forward (the weights have not moved yet, so ρ = 1 exactly); rows that
carry stored behaviour log-probs (replay) use those. The reference model runs only when a ``needs=("ref",)``
term has non-zero weight, the teacher only when a ``needs=("teacher",)`` term does.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from groupwise.config import LossConfig, OptimConfig
from groupwise.losses.reduce import Normalizer, reduce
from groupwise.models.forward import completion_logprobs, pack
from groupwise.types import LossInputs, Sample


def plan_micro_batches(samples: list[Sample], token_budget: int) -> list[list[int]]:
    """Row indices per micro-batch: longest first, greedily filled while rows × (P + T) fits the budget."""
    size = lambda i: (samples[i].prompt_ids.numel(), samples[i].completion_ids.numel())  # noqa: E731
    order = sorted(range(len(samples)), key=lambda i: sum(size(i)), reverse=True)
    out: list[list[int]] = []
    cur: list[int] = []
    width = (0, 0)
    for i in order:
        p, t = size(i)
        new = (max(width[0], p), max(width[1], t))
        if cur and (len(cur) + 1) * sum(new) > token_budget:
            out.append(cur)
            cur, new = [], (p, t)
        cur.append(i)
        width = new
    if cur:
        out.append(cur)
    return out


def pad_rows(rows: list[Tensor], width: int, fill: float) -> Tensor:
    out = torch.full((len(rows), width), fill, dtype=rows[0].dtype if rows else torch.float32)
    for i, r in enumerate(rows):
        out[i, :r.numel()] = r
    return out


@dataclasses.dataclass
class Learner:
    """The trainable policy with its optimizer; ``step`` performs one RL step's update."""

    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loss_cfg: LossConfig
    optim_cfg: OptimConfig
    pad_id: int
    temperature: float
    max_completion_tokens: int
    ref: torch.nn.Module | None = None
    teacher: object | None = None

    def terms(self) -> list:
        return [s for s in self.loss_cfg.terms if s.weight != 0]

    def needs(self, what: str) -> bool:
        return any(what in getattr(s.cfg, "needs", ()) for s in self.terms())

    def step(self, samples: list[Sample], advantages: list[Tensor], problems: list | None = None) -> dict[str, float]:
        dev = next(self.policy.parameters()).device
        masks = [s.loss_mask for s in samples]
        norm = Normalizer.from_masks(masks, float(self.max_completion_tokens))
        inert = all(getattr(s.cfg, "advantage_only", False) for s in self.terms())
        active = [i for i, a in enumerate(advantages) if not (inert and not bool(a.any()))]
        plan = [[active[j] for j in mb] for mb in
                plan_micro_batches([samples[i] for i in active], self.optim_cfg.micro_batch_tokens)]
        sums: dict[str, list[float]] = {}  # metric -> [sum, count] over the whole step
        losses: dict[str, float] = {}  # micro-batch values are exact shares of the step's loss: they add up
        first_epoch_old: dict[int, Tensor] = {}
        skipped = 0.0
        self.policy.train()
        for epoch in range(self.optim_cfg.ppo_epochs):
            for mb in plan:
                rows = [samples[i] for i in mb]
                packed = pack([s.prompt_ids for s in rows], [s.completion_ids for s in rows], self.pad_id, dev)
                t = packed.completion_ids.shape[1]
                logprobs, entropy, _ = completion_logprobs(self.policy, packed, self.temperature, with_entropy=True)
                mask = pad_rows([s.loss_mask for s in rows], t, False).to(dev) & packed.completion_mask
                old = torch.empty_like(logprobs)
                for k, (i, s) in enumerate(zip(mb, rows)):
                    if s.old_logprobs is not None:
                        old[k, :s.length] = s.old_logprobs.to(dev)
                        old[k, s.length:] = 0.0
                    else:
                        if epoch == 0:
                            first_epoch_old[i] = logprobs[k].detach()
                        old[k] = first_epoch_old[i]
                inp = LossInputs(
                    logprobs=logprobs, old_logprobs=old.detach(),
                    advantages=pad_rows([advantages[i] for i in mb], t, 0.0).to(dev).float(),
                    completion_mask=mask, rollout_logprobs=pad_rows([s.rollout_logprobs for s in rows], t, math.nan).to(dev),
                    ref_logprobs=self._ref(packed) if self.needs("ref") else None,
                    teacher_logprobs=(self.teacher.logprobs(rows, [problems[i] for i in mb])
                                      if self.needs("teacher") and self.teacher is not None else None),
                    entropy=entropy, samples=rows)
                total = logprobs.new_zeros(())
                for spec in self.terms():
                    out = spec.entry()(inp, spec.cfg)
                    value = reduce(out.per_token, mask, norm, self.loss_cfg.reduction)
                    total = total + spec.weight * value
                    losses[f"loss/{spec.name}"] = losses.get(f"loss/{spec.name}", 0.0) + value.item()
                    for k, (s_, c_) in out.metrics.items():
                        _add(sums, k, s_, c_)
                losses["loss/total"] = losses.get("loss/total", 0.0) + total.item()
                _add(sums, "policy/entropy", float((entropy * mask).sum()), float(mask.sum()))
                total.backward()
            for p in self.policy.parameters():  # a step with no trained rows is a zero-gradient step
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.policy.parameters(), self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf"))
            if torch.isfinite(grad_norm):
                self.optimizer.step()
            else:
                skipped += 1
            self.optimizer.zero_grad(set_to_none=True)
            _add(sums, "update/grad_norm", float(grad_norm), 1.0)
        self.scheduler.step()
        out = {k: (s / c if c else 0.0) for k, (s, c) in sums.items()}
        out.update({k: v / self.optim_cfg.ppo_epochs for k, v in losses.items()})
        out.update({"update/micro_batches": float(len(plan)), "update/skipped_rows": float(len(samples) - len(active)), "update/nonfinite_skipped": skipped,
                    "optim/lr": float(self.scheduler.get_last_lr()[0]), "update/loss_tokens": norm.tokens})
        return out

    @torch.no_grad()
    def _ref(self, packed) -> Tensor:
        assert self.ref is not None, "a loss term needs the reference model but none was loaded"
        lp, _, _ = completion_logprobs(self.ref, packed, self.temperature)
        return lp


def _add(sums: dict[str, list[float]], key: str, s: float, c: float) -> None:
    acc = sums.setdefault(key, [0.0, 0.0])
    acc[0] += s
    acc[1] += c


def build_optimizer(policy: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas,
                            eps=cfg.eps, weight_decay=cfg.weight_decay)

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        frac = (step - cfg.warmup_steps) / max(total_steps - cfg.warmup_steps, 1)
        if cfg.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        if cfg.schedule == "linear":
            return max(1.0 - frac, 0.0)
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
