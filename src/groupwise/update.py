"""The update: micro-batching by token budget, step-global normalisation, backward, clip, optimizer step.

One RL step = ``ppo_epochs`` optimizer steps over all rows of the step's ``TokenBatch``. Rows are sorted by
length and packed into micro-batches under ``micro_batch_tokens`` (padded prompt + completion tokens), each
padded only to its own widths. A row is skipped (no forward, no backward) when it can carry no loss: all its
loss weights are 0, or every active loss term is ``advantage_only`` and its advantages are all 0 (GRPO's
zero-variance groups are often half the batch). Skipped rows still count in the step's denominators, so the
update is identical, minus their passes (``optim.skip_inert_rows: false`` runs them anyway, to measure that).
``old_logprobs`` cost no forward pass: on-policy rows use the current policy's detached log-probs from the
first epoch's forward (the weights have not moved yet, so ρ = 1 exactly); rows that carry stored behaviour log-probs
(replay) use those. The reference model runs only when a ``needs=("ref",)`` term has non-zero weight, the teacher only
when a ``needs=("teacher*",)`` term does (its outputs are computed in the first epoch and reused by later ones: the
teacher's weights at the step's start). Every term's per-token loss is multiplied by ``TokenBatch.loss_weights`` before
reduction, and, with ``loss.importance_sampling``, by the sampler-trainer importance weight (``losses/mismatch.py``:
from the ``old_logprobs`` above and the generator's ``rollout_logprobs``, no extra pass); the mismatch metrics
(``mismatch/*``) are logged whenever the rows carry the generator's log-probs.

``optim.autocast: bf16`` runs every model pass made here (``_forward``: the policy's forward, the reference's, the
behaviour and stored-sample log-probs) under ``torch.autocast`` to bfloat16; the backward, the loss terms and the
optimizer step run outside it, on fp32 weights, gradients and moments, and the log-softmax on the upcast logits.
PPO's ρ stays exactly 1 at the first epoch under it (π_old is that forward's own detached log-probs), and
``behaviour_logprobs`` runs under it too, so it still gives the update's own log-probs bit for bit; the sampler's
fp32 log-probs differ from them by the bf16 rounding (``mismatch/*``; ``loss.importance_sampling`` corrects it).
With ``none`` the passes run in a ``nullcontext``: the update is the fp32 one, unchanged.

Non-finite values never reach the weights: a non-finite gradient norm skips the optimizer step, and a step
that leaves any parameter NaN or ±inf (an overflowing update) is undone: the pre-step parameters, kept as a
copy of the trainable parameters (one extra copy of them in memory), are put back, and optimizer state that
became non-finite is dropped (AdamW restarts those moments). Both count in ``update/nonfinite_skipped``; the
undone steps also in ``update/nonfinite_restored``, and the first one is printed once. ``optim.nonfinite:
stop`` keeps no copy (for models where a second copy of the weights does not fit) and stops the run instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from groupwise.config import ImportanceSamplingConfig, OptimConfig, RunConfig
from groupwise.losses.mismatch import effective_sample_size, mismatch
from groupwise.losses.reduce import Normalizer, reduce
from groupwise.models import fsdp
from groupwise.models.forward import (
    Forward,
    Packed,
    completion_logprobs,
    dropout_in_training,
    pack,
    shared_prefix_logprobs,
)
from groupwise.parallel import data_parallel
from groupwise.registry import ConfigError, Entry, RunStopped
from groupwise.teachers import TeacherWant
from groupwise.types import LossInputs, LossTerms, Sample, TeacherOutput, TokenBatch


class NonFiniteWeights(RunStopped):
    """An optimizer step produced NaN/inf weights under ``optim.nonfinite: stop`` (one line, for the CLI)."""


def plan_micro_batches(samples: list[Sample], token_budget: int, shared_prefix: bool = False) -> list[list[int]]:
    """Row indices per micro-batch: longest first, greedily filled while rows × (P + T) fits the budget. With
    ``shared_prefix`` (each distinct prompt runs once, ``forward.shared_prefix_logprobs``) a micro-batch costs
    prompts × P + rows × T, and the rows of one prompt are kept together so that its forward is shared by all."""
    size = lambda i: (samples[i].prompt_ids.numel(), samples[i].completion_ids.numel())  # noqa: E731
    order = sorted(range(len(samples)), key=lambda i: sum(size(i)), reverse=True)
    key = lambda i: tuple(samples[i].prompt_ids.tolist()) if shared_prefix else i  # noqa: E731
    if shared_prefix:  # prompt by prompt (longest row first), each prompt's rows longest first
        rank: dict = {}
        for i in order:
            rank.setdefault(key(i), len(rank))
        order.sort(key=lambda i: rank[key(i)])
    out: list[list[int]] = []
    cur: list[int] = []
    width, prompts = (0, 0), set()
    for i in order:
        p, t = size(i)
        new = (max(width[0], p), max(width[1], t))
        n_p = len(prompts | {key(i)}) if shared_prefix else len(cur) + 1
        if cur and n_p * new[0] + (len(cur) + 1) * new[1] > token_budget:
            out.append(cur)
            cur, new, prompts = [], (p, t), set()
        cur.append(i)
        prompts.add(key(i))
        width = new
    if cur:
        out.append(cur)
    return out


def shard_rows(rows: list[int], samples: list[Sample], rank: int, world: int) -> list[int]:
    """This rank's share of ``rows``: sorted by length (prompt + completion), every ``world``-th, so the ranks'
    token loads differ by at most one row's."""
    order = sorted(rows, key=lambda i: (-(samples[i].prompt_ids.numel() + samples[i].completion_ids.numel()), i))
    return sorted(order[rank::world])


def all_reduce_grads(params: list[Tensor]) -> None:
    """Sum the gradients over the ranks, in one flat buffer. Each rank's loss already uses the whole batch's
    denominators, so the sum is the gradient of the whole batch, as one process would compute it."""
    import torch.distributed as dist

    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def gather_sums(sums: Sums, n_plan: float) -> tuple[Sums, float]:
    """Every rank's metric sums (and micro-batch count) added together."""
    import torch.distributed as dist

    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (sums.pairs, sums.losses, n_plan, sums.peaks))
    out = Sums()
    for pairs, losses, _, peaks in parts:
        for k, (s, c) in pairs.items():
            out.add(k, s, c)
        for k, v in losses.items():
            out.loss(k, v)
        for k, v in peaks.items():
            out.peak(k, v)
    return out, float(sum(p[2] for p in parts))


def pad_rows(rows: list[Tensor], width: int, fill: float) -> Tensor:
    out = torch.full((len(rows), width), fill, dtype=rows[0].dtype if rows else torch.float32)
    for i, r in enumerate(rows):
        out[i, :r.numel()] = r
    return out


@dataclasses.dataclass(frozen=True)
class BoundLoss:
    """A built loss term with its weight, what it reads (its entry's declared needs for its config) and its
    entry (``advantage_only``)."""

    name: str
    weight: float
    fn: Callable[[LossInputs], LossTerms]
    entry: Entry
    needs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
    reduction: str
    optim: OptimConfig
    temperature: float
    max_completion_tokens: int
    pad_id: int
    importance: ImportanceSamplingConfig = ImportanceSamplingConfig()


class Sums:
    """Step metrics as (sum, count) pairs, summed loss shares and maxima: exact whatever the micro-batch
    split."""

    def __init__(self) -> None:
        self.pairs: dict[str, list[float]] = {}
        self.losses: dict[str, float] = {}
        self.peaks: dict[str, float] = {}

    def add(self, key: str, s: float, c: float) -> None:
        acc = self.pairs.setdefault(key, [0.0, 0.0])
        acc[0] += s
        acc[1] += c

    def loss(self, key: str, value: float) -> None:
        self.losses[key] = self.losses.get(key, 0.0) + value

    def peak(self, key: str, value: float) -> None:
        self.peaks[key] = max(self.peaks.get(key, value), value)

    def metrics(self, epochs: int) -> dict[str, float]:
        out = {k: (s / c if c else 0.0) for k, (s, c) in self.pairs.items()}
        out.update({k: v / epochs for k, v in self.losses.items()})
        out.update(self.peaks)
        return out


class Learner:
    """The trainable policy with its optimizer; ``step(batch)`` performs one RL step's update."""

    def __init__(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                 terms: list[BoundLoss], settings: UpdateSettings, ref: torch.nn.Module | None = None,
                 teacher: Any = None):
        self.policy, self.optimizer, self.scheduler = policy, optimizer, scheduler
        self.terms = [t for t in terms if t.weight != 0]  # a zero-weight term costs nothing and loads nothing
        self.settings, self.ref, self.teacher = settings, ref, teacher
        self.needs = {n for t in self.terms for n in t.needs}
        self.want = TeacherWant(topk="teacher_topk" in self.needs,
                                vocab="teacher_vocab" in self.needs)
        self.inert = all(t.entry.advantage_only for t in self.terms)
        self.sharded = fsdp.is_sharded(policy)  # FSDP (models/fsdp.py): passes are collectives, grads reduce-scattered
        self._warned = False
        self.last_old: dict[int, Tensor | None] = {}  # the last step's π_old per row (``old_logprobs``)
        self.stored_passes = 0  # micro-batch passes of ``logprobs`` so far (the loop reads them per stage)

    @staticmethod
    def from_config(policy: torch.nn.Module, cfg: RunConfig, pad_id: int, terms: list[BoundLoss],
                    ref: torch.nn.Module | None = None, teacher: Any = None) -> Learner:
        """A learner for the built loss ``terms`` (``setup.loss_terms``) with ``cfg``'s optimizer and rollout
        settings."""
        asked = cfg.optim.shared_prefix  # None: on where it is exact (the default); True: on, or refused
        site = dropout_in_training(policy) if asked is not False else None
        if site is not None and asked:
            raise ConfigError(f"optim.shared_prefix=true with a policy that drops out in training ({site}): the rows "
                              "of a prompt would share one dropout mask over it, not the unshared update; allowed: "
                              "optim.shared_prefix=null (the default: off for such a policy) or false, or no dropout")
        optim = dataclasses.replace(cfg.optim, shared_prefix=asked is not False and site is None)
        optimizer, scheduler = build_optimizer(policy, optim, cfg.trainer.steps)
        settings = UpdateSettings(cfg.loss.reduction, optim, cfg.rollout.temperature,
                                  cfg.rollout.max_completion_tokens, pad_id, cfg.loss.importance_sampling)
        return Learner(policy, optimizer, scheduler, terms, settings, ref, teacher)

    def active_rows(self, batch: TokenBatch) -> list[int]:
        """Rows that can carry loss (see the module docstring)."""
        if not self.settings.optim.skip_inert_rows:
            return list(range(len(batch.samples)))
        weighted = (batch.loss_weights * batch.completion_mask).ne(0).any(-1)  # [B]
        if self.inert:
            weighted &= batch.advantages.ne(0).any(-1)
        return torch.nonzero(weighted).flatten().tolist()

    def plan(self, batch: TokenBatch) -> tuple[list[int], list[int], list[list[int]]]:
        """(the active rows, this rank's share of them, its micro-batches of row indices)."""
        active = self.active_rows(batch)
        world = data_parallel()
        mine = shard_rows(active, batch.samples, *world) if world[1] > 1 else active
        o = self.settings.optim
        return active, mine, [[mine[j] for j in mb] for mb in plan_micro_batches(
            [batch.samples[i] for i in mine], o.micro_batch_tokens, o.shared_prefix)]

    @torch.no_grad()
    def behaviour_logprobs(self, model: torch.nn.Module, batch: TokenBatch) -> None:
        """Sets ``old_logprobs`` (π_old) of the rows this step's update will run and that carry none (a
        replayed row brings its own), from ``model``: an asynchronous run's snapshot of the weights that sampled
        them (``loop/lag.py``). The same rows, micro-batches and forward as the update's first epoch, so the
        pass costs what the update's forward does (inert rows skipped, each prompt once with
        ``optim.shared_prefix``), and with ``model`` holding the policy's weights it gives the update's own
        log-probs, bit for bit (ρ = 1 as in the synchronous loop)."""
        was = model.training
        model.eval()
        dev = next(model.parameters()).device
        for mb in self.plan(batch)[2]:
            rows = [batch.samples[i] for i in mb]
            if all(s.old_logprobs is not None for s in rows):
                continue
            packed = pack([s.prompt_ids for s in rows], [s.completion_ids for s in rows], self.settings.pad_id, dev)
            lp = self._forward(model, packed, rows).logprobs
            for j, s in enumerate(rows):
                if s.old_logprobs is None:
                    s.old_logprobs = lp[j, :s.length].clone()
        model.train(was)

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, samples: list[Sample], vocab: bool = False) -> list[Tensor]:
        """Teacher-forced log-probs of stored samples under ``model`` (no grad, eval mode), in the update's
        micro-batches (``optim.micro_batch_tokens``, each prompt once with ``optim.shared_prefix``): each
        sample's sampled-token log-probs [T] in the order given, or with ``vocab`` its log-softmax [T, V].
        Each micro-batch adds 1 to ``stored_passes``."""
        was = model.training
        model.eval()
        dev = next(model.parameters()).device
        out: list[Tensor] = [torch.empty(0)] * len(samples)
        o = self.settings.optim
        for mb in plan_micro_batches(samples, o.micro_batch_tokens, o.shared_prefix):
            rows = [samples[i] for i in mb]
            packed = pack([s.prompt_ids for s in rows], [s.completion_ids for s in rows], self.settings.pad_id, dev)
            fwd = self._forward(model, packed, rows, with_vocab=vocab)
            self.stored_passes += 1
            lp = fwd.vocab_logprobs if vocab else fwd.logprobs
            for j, i in enumerate(mb):
                out[i] = lp[j, :samples[i].length].cpu()
        model.train(was)
        return out

    def step(self, batch: TokenBatch) -> dict[str, float]:
        o = self.settings.optim
        norm = Normalizer.from_masks(list(batch.completion_mask), float(self.settings.max_completion_tokens))
        active, mine, plan = self.plan(batch)
        world = data_parallel()
        sums, first_old, teacher_cache = Sums(), {}, {}
        skipped = restored = 0.0
        idle = fsdp.on_all_ranks(len(plan), "max") - len(plan) if self.sharded else 0
        self.policy.train()
        for _ in range(o.ppo_epochs):
            for k, mb in enumerate(plan + [[mine[-1] if mine else 0]] * idle):
                inp = self.inputs(batch, mb, first_old, teacher_cache if o.ppo_epochs > 1 else {}, k)
                if k < len(plan):
                    self.loss(inp, norm, sums).backward()
                else:  # FSDP: a pass with zero loss, so that this rank joins the others' collectives
                    (0.0 * self.loss(inp, norm, Sums())).backward()
            outcome = self.optimizer_step(sums)
            skipped, restored = skipped + (outcome != "stepped"), restored + (outcome == "restored")
        self.last_old = {i: first_old.get(i) if batch.samples[i].old_logprobs is None else batch.samples[i].old_logprobs
                         for i in mine}
        self.scheduler.step()
        n_plan = float(len(plan))
        if world[1] > 1:  # every rank's terms and passes, so the logged step is the whole batch's
            sums, n_plan = gather_sums(sums, n_plan)
        out = sums.metrics(o.ppo_epochs)
        effective_sample_size(out)  # from the step's sums of w and w², whatever the micro-batches
        out.update({"update/micro_batches": n_plan, "update/skipped_rows": float(len(batch.samples) - len(active)),
                    "update/nonfinite_skipped": skipped, "update/nonfinite_restored": restored,
                    "optim/lr": float(self.scheduler.get_last_lr()[0]),
                    "update/loss_tokens": norm.tokens, "update/policy_forwards": n_plan * o.ppo_epochs,
                    "update/ref_forwards": n_plan * o.ppo_epochs if "ref" in self.needs else 0.0})
        return out

    def old_logprobs(self, row: int) -> Tensor | None:
        """π_old of the last step's row ``row`` (the log-probs ``mismatch/*`` compares with the sampler's): the
        first epoch's forward of a fresh row, the stored ones of a replayed row; None for a row this process's
        update did not run (skipped as inert, or another rank's). Padded past the row's length."""
        return self.last_old.get(row)

    def full_state(self) -> tuple[dict[str, Tensor] | None, dict[str, Any]]:
        """(the policy's whole weights, or None to save the module's own; the optimizer's state dict) for a
        checkpoint. Every rank calls it (under FSDP, gathering is a collective; rank 0 gets the state)."""
        if self.sharded:
            return fsdp.full_state(self.policy, self.optimizer)
        return None, self.optimizer.state_dict()

    def load_optimizer(self, state: dict[str, Any]) -> None:
        """A checkpoint's optimizer state (the same layout whether it was saved sharded or not)."""
        if self.sharded:
            fsdp.load_optimizer(self.policy, self.optimizer, state)
        else:
            self.optimizer.load_state_dict(state)

    def inputs(self, batch: TokenBatch, mb: list[int], first_old: dict[int, Tensor],
               teacher_cache: dict[int, TeacherOutput], k: int) -> LossInputs:
        """Everything the loss terms of micro-batch ``mb`` read (one policy forward, plus ref / teacher)."""
        dev = next(self.policy.parameters()).device
        rows = [batch.samples[i] for i in mb]
        packed = pack([s.prompt_ids for s in rows], [s.completion_ids for s in rows], self.settings.pad_id, dev)
        t = packed.completion_ids.shape[1]
        fwd = self._forward(self.policy, packed, rows, with_entropy=True, with_vocab="vocab" in self.needs)
        old = torch.empty_like(fwd.logprobs)
        for j, (i, s) in enumerate(zip(mb, rows)):
            if s.old_logprobs is not None:
                old[j, :s.length] = s.old_logprobs.to(dev)
                old[j, s.length:] = 0.0
            else:
                old[j] = first_old.setdefault(i, fwd.logprobs[j].detach())
        problems = [batch.problems[i] for i in mb]
        return LossInputs(
            logprobs=fwd.logprobs, old_logprobs=old.detach(), advantages=batch.advantages[mb, :t].to(dev).float(),
            completion_mask=batch.completion_mask[mb, :t].to(dev) & packed.completion_mask,
            rollout_logprobs=pad_rows([s.rollout_logprobs for s in rows], t, math.nan).to(dev),
            loss_weights=batch.loss_weights[mb, :t].to(dev), ref_logprobs=self._ref(packed, rows),
            teacher=self._teacher(rows, problems, teacher_cache, k), vocab_logprobs=fwd.vocab_logprobs,
            entropy=fwd.entropy, samples=rows, problems=problems)

    def loss(self, inp: LossInputs, norm: Normalizer, sums: Sums) -> Tensor:
        """Σ_k w_k · reduce(loss_weights · is_weight · per_token_k); records each term's share and metrics,
        and the sampler-trainer mismatch (``losses/mismatch.py``; is_weight only with
        ``loss.importance_sampling``)."""
        total = inp.logprobs.new_zeros(())
        imp = self.settings.importance
        mis = mismatch(inp.old_logprobs, inp.rollout_logprobs, inp.completion_mask, imp.mode, imp.cap, imp.clip_min)
        weights = inp.loss_weights if mis.weight is None else inp.loss_weights * mis.weight
        for key, (s, c) in mis.metrics.items():
            sums.add(key, s, c)
        if mis.max_abs_dlogp is not None:
            sums.peak("mismatch/max_abs_dlogp", mis.max_abs_dlogp)
        for term in self.terms:
            out = term.fn(inp)
            value = reduce(out.per_token * weights, inp.completion_mask, norm, self.settings.reduction)
            total = total + term.weight * value
            sums.loss(f"loss/{term.name}", value.item())
            for key, (s, c) in out.metrics.items():
                sums.add(key, s, c)
        sums.loss("loss/total", total.item())
        mask = inp.completion_mask
        sums.add("policy/entropy", float((inp.entropy * mask).sum()), float(mask.sum()))
        return total

    def optimizer_step(self, sums: Sums) -> str:
        """Clip and step: ``"stepped"``, ``"skipped"`` (non-finite gradient) or ``"restored"`` (the step made
        a parameter non-finite and was undone; see the module docstring)."""
        for p in self.policy.parameters():  # a step with no trained rows is a zero-gradient step
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        if data_parallel()[1] > 1 and not self.sharded:  # FSDP has reduce-scattered them in the backward
            all_reduce_grads([p for p in self.policy.parameters() if p.requires_grad])
        clip = self.settings.optim.grad_clip
        grad_norm = fsdp.full(torch.nn.utils.clip_grad_norm_(self.policy.parameters(),
                                                             clip if clip > 0 else float("inf")))
        outcome = "skipped"
        if bool(torch.isfinite(grad_norm)):
            outcome = "restored" if self._guarded_step() else "stepped"
        self.optimizer.zero_grad(set_to_none=True)
        sums.add("update/grad_norm", float(grad_norm), 1.0)
        return outcome

    @torch.no_grad()
    def _guarded_step(self) -> bool:
        """``optimizer.step()``, undone if it leaves a non-finite parameter; True if it was undone. With
        ``optim.nonfinite: stop`` no copy is kept and such a step raises ``NonFiniteWeights`` instead."""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        keep = self.settings.optim.nonfinite == "restore"
        before = [p.detach().clone() for p in params] if keep else []
        self.optimizer.step()
        finite = all(bool(torch.isfinite(fsdp.local(p)).all()) for p in params)
        if finite if not self.sharded else fsdp.on_all_ranks(finite, "min"):  # FSDP: each rank sees its shard
            return False
        if not keep:
            raise NonFiniteWeights("an optimizer step made the policy's weights non-finite (lr too high, or an "
                                   "fp16 overflow); the run stopped before saving them, the last checkpoint is "
                                   "intact (optim.nonfinite: restore undoes such steps instead)")
        for p, b in zip(params, before):
            p.copy_(b)
            state = self.optimizer.state.get(p, {})
            if any(torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(fsdp.local(v)).all())
                   for v in state.values()):
                self.optimizer.state.pop(p, None)  # AdamW re-initialises the moments of this parameter
        if not self._warned:
            self._warned = True
            print("groupwise: an optimizer step made the policy's weights non-finite; the pre-step weights "
                  "were restored (counted in update/nonfinite_restored; later ones are counted without a "
                  "message)",
                  file=sys.stderr, flush=True)
        return True

    def _forward(self, model: torch.nn.Module, packed: Packed, rows: list[Sample], **kw) -> Forward:
        """One teacher-forced pass; with ``optim.shared_prefix`` each distinct prompt runs once. A sharded
        model's calls are collectives, so every rank must make as many: there the prompts' common prefix (a
        third call only when a micro-batch holds several distinct prompts) is not run apart."""
        with autocast(model, self.settings.optim.autocast):
            if self.settings.optim.shared_prefix:
                return shared_prefix_logprobs(model, packed, [s.prompt_ids for s in rows], self.settings.pad_id,
                                              self.settings.temperature, common=not fsdp.is_sharded(model), **kw)
            return completion_logprobs(model, packed, self.settings.temperature, **kw)

    @torch.no_grad()
    def _ref(self, packed: Packed, rows: list[Sample]) -> Tensor | None:
        if "ref" not in self.needs:
            return None
        assert self.ref is not None, "a loss term needs the reference model but none was loaded"
        return self._forward(self.ref, packed, rows).logprobs

    def _teacher(self, rows: list[Sample], problems: list, cache: dict[int, TeacherOutput],
                 k: int) -> TeacherOutput | None:
        if not self.needs & {"teacher", "teacher_topk", "teacher_vocab"}:
            return None
        assert self.teacher is not None, "a loss term needs a teacher but teacher is 'none'"
        if k not in cache:
            cache[k] = self.teacher.score(rows, problems, self.want)
        return cache[k]


def autocast(model: torch.nn.Module, mode: str) -> contextlib.AbstractContextManager:
    """The context of the update's model passes (``optim.autocast``): ``none`` adds nothing (a ``nullcontext``);
    ``bf16`` autocasts to bfloat16 on ``model``'s device type, the weights staying as they are."""
    if mode == "none":
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, dtype=torch.bfloat16)


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
