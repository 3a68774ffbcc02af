"""The single-policy training loop. It calls the stages in order and has no method branches:

  select → rollout (builder) → reward → transforms → filter → advantage (+ transforms) → replay
  → credit → update (teacher, loss terms, reduce) → replay.add → log / eval / checkpoint

Hook points, each a registry (see docs/architecture.md): group builders and transforms (resampling,
editing, trees), token-level credit and loss weights, teachers (in the update), replay buffers, problem
selectors. Other drivers (multi-policy, federated) reuse ``setup.build`` and ``rl_step``; the run directory,
resume, saving and signals live in ``session.py``. With ``rollout.max_async_level`` K > 0 the same stages run
as ``lagged_step``: the rollout stage one step ahead, on a weight snapshot K versions old (``loop/lag.py``).
"""

from __future__ import annotations

import resource
import sys
import time

import torch

from groupwise.config import RunConfig
from groupwise.eval import evaluate_run
from groupwise.loop import distributed
from groupwise.loop.pipeline import Pipeline, Rollout, Work
from groupwise.loop.session import Session, latest_model_dir  # noqa: F401  (latest_model_dir: public API)
from groupwise.loop.setup import build
from groupwise.loop.stats import advantage_metrics, group_metrics
from groupwise.types import Group, ScoredBatch, TokenBatch


def rl_step(p: Pipeline, step: int) -> dict[str, float]:
    """One synchronous RL step through every stage (``rollout.max_async_level: 0``); returns its metrics."""
    t0 = time.perf_counter()
    # FSDP: rollout, advantage, replay, credit on the whole weights (else a no-op)
    with p.full_weights(), p.screen.phase(f"step {step + 1}: generating", rollout_rows(p)):
        work = prepare(p, rollout_stage(p, step, version=step))
    p.generator.release()  # the rollout stage is over (an engine may free its memory for the update)
    t1 = time.perf_counter()
    with p.screen.phase(f"step {step + 1}: updating"):
        return finish(p, work, p.learner.step(work.tokens) if work.tokens.samples else {}, t0, t1)


def rollout_rows(p: Pipeline) -> int:
    """The completions this process generates for a step (N·G of its share of the prompts), for the screen's
    counter (refills and builders that sample more go past it)."""
    r = p.cfg.rollout
    return len(distributed.shard(list(range(r.prompts_per_step)))) * r.group_size


def lagged_step(p: Pipeline, step: int) -> dict[str, float]:
    """One step with ``rollout.max_async_level`` K > 0 (``loop/lag.py``): step t's rollouts were sampled
    by version max(0, t − K) while step t − 1 updated; step t + 1's are sampled here while step t's update
    runs in a background thread."""
    lag, t0 = p.lag, time.perf_counter()
    lag.keep(step)  # version `step`: the weights after step − 1's update
    with p.screen.phase(f"step {step + 1}: generating", rollout_rows(p)):
        work = prepare(p, lag.take(step) or lagged_rollout(p, step))
    lag.behaviour(work.tokens, step)  # π_old of the rows the update runs, on the snapshot that sampled them
    t1 = time.perf_counter()
    more = step + 1 < p.cfg.trainer.steps
    with p.screen.phase(f"step {step + 1}: updating" + (f", generating {step + 2}" if more else ""),
                        rollout_rows(p) if more else 0):
        update = lag.start(step, lambda: p.learner.step(work.tokens) if work.tokens.samples else {})
        try:
            lag.capture()  # the rollout stage's state before step + 1's rollout: what a checkpoint here holds
            lag.ahead = lagged_rollout(p, step + 1) if more else None
        finally:
            out = update.result()  # joined also when the rollout raised (bounded by rollout.async_timeout_s)
        return finish(p, work, out, t0, t1)


def lagged_rollout(p: Pipeline, step: int) -> Rollout:
    """Step ``step``'s rollout stage on the snapshot of version max(0, step − K) (``sync/snapshot_version``: the
    version the snapshot was verified to hold, ``Lag.verify``). Its rows' behaviour log-probs come later
    (``Lag.behaviour``, once the advantages say which rows the update runs)."""
    view, version = p.lag.at(step)
    r = rollout_stage(view, step, version)
    view.generator.release()
    if p.lag.verified == version:  # absent when not checked (rollout.sync_check=none): never a check that passed
        r.metrics["sync/snapshot_version"] = float(version)
    return r


def rollout_stage(p: Pipeline, step: int, version: int) -> Rollout:
    """select → shards (builder + reward) → transforms → filter (refills) → reward check, sampled by policy
    ``version`` (recorded on every group)."""
    cfg, t0, passes = p.cfg, time.perf_counter(), p.learner.stored_passes
    draws: dict = {}  # per (stage, shard): the step's seed counters, shared with the shards (refills continue them)
    ctx = p.context(step, draws=draws)
    p.generator.reset()  # counts every token generated this step, discarded samples included
    rollouts: list[Group] = []  # everything generated this step, refills included (for rollout metrics)
    seen: list = []

    def make(k: int) -> list[Group]:
        problems = distributed.shard(p.selector.next(step, k, ctx))  # this rank's share (all: 1 rank)
        groups = p.shards(problems, step, draws)  # built and scored, in rollout.shards, here or in Ray workers
        seen.extend(p.recorder.seen(groups))
        for spec, transform in zip(cfg.rollout.transforms, p.transforms):
            groups = transform(groups, ctx)
            require_scored(groups, f"group transform '{spec.name}'")
        groups = distributed.gather(groups)
        if hasattr(p.selector, "observe"):  # a selector that learns from outcomes (every rank sees every group)
            p.selector.observe(groups)
        rollouts.extend(groups)
        return groups

    n = cfg.rollout.prompts_per_step
    groups, filtered = p.filter(make(n), n, make)
    p.reward.check_terms(step)  # a term that failed on every sample stops the run here (reward.fail_fast)
    for g in rollouts + groups:
        g.policy_version = version
    stale = [step - g.policy_version for g in groups] or [0]
    gen = p.generator
    metrics = {**p.component_metrics(rollout=True),
               "rollout/staleness_mean": sum(stale) / len(stale), "rollout/staleness_max": float(max(stale)),
               "rollout/policy_forwards": float(p.learner.stored_passes - passes),
               "perf/rollout_s": time.perf_counter() - t0, "perf/gen_tokens": float(gen.tokens),
               "perf/generate_s": gen.seconds, "perf/prompt_tokens": float(gen.prompt_tokens),
               "perf/gen_tokens_per_s": gen.tokens / max(gen.seconds, 1e-9), "perf/reward_s": p.reward.seconds}
    return Rollout(step, groups, rollouts, seen, draws, filtered, metrics)


def prepare(p: Pipeline, r: Rollout) -> Work:
    """Advantage (+ transforms) → replay.sample → credit, on the current weights: the step's TokenBatch."""
    k, old = p.cfg.rollout.max_async_level, [g.policy_version for g in r.groups]
    if old and r.step - min(old) > k:  # the lag is fixed, so this is a bug, never a slow generator
        raise RuntimeError(f"step {r.step + 1}: groups of policy version {min(old)}; rollout.max_async_level={k}")
    batch = ScoredBatch.from_groups(r.groups, r.step)
    adv = p.advantage(batch) if r.groups else torch.zeros(0, 0)
    for transform in p.advantage_transforms:
        adv = transform(batch, adv)
    passes = p.learner.stored_passes
    replayed = p.replay.sample(r.step, p.context(r.step, draws=r.draws))
    r.metrics["replay/policy_forwards"] = float(p.learner.stored_passes - passes)
    tokens = TokenBatch.build(r.groups, adv, replayed)
    for credit in p.credit:
        tokens = credit(tokens)
    return Work(r, batch, adv, replayed, tokens)


def finish(p: Pipeline, w: Work, update: dict[str, float], t0: float, t1: float) -> dict[str, float]:
    """After the update (its metrics ``update``): weights to the generator, replay.add, teacher.on_step, and
    the step's metrics (``t0``: the step's start, ``t1``: the update's)."""
    r = w.rollout
    if w.tokens.samples:
        p.generator.sync_weights(p.policy)
        p.shards.sync_weights(p.policy)
    p.replay.add(r.groups, w.adv, r.step)
    if p.teacher is not None:
        with p.full_weights():
            p.teacher.on_step(r.step, p.policy)
    t_update, metrics = time.perf_counter() - t1, {**r.filtered, **update}
    metrics.update(p.recorder.record(r.step, r.rollouts, w.tokens, w.replayed, r.seen))  # for `groupwise inspect`
    metrics.update(group_metrics(r.rollouts))
    metrics.update(advantage_metrics(w.adv, w.batch.mask))
    metrics.update(r.metrics)
    metrics.update(p.component_metrics(rollout=False))
    metrics.update({"perf/update_s": t_update, "perf/step_s": time.perf_counter() - t0,
                    "perf/peak_rss_mb": peak_rss_mb(),
                    "update/replay_rows": float(sum(len(x.group.samples) for x in w.replayed))})
    return metrics


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def require_scored(groups: list[Group], where: str) -> None:
    """A transform that creates or edits samples must score them (``ctx.score``); say so instead of training
    on zero rewards."""
    for g in groups:
        for s in g.samples:
            if not s.scored:
                raise RuntimeError(f"{where} returned an unscored sample (problem {g.problem.id!r}); a transform "
                                   "that creates or edits samples must pass them to ctx.score")


def run_eval(p: Pipeline, step: int, session: Session, tag: str) -> dict[str, float]:
    """A held-out eval, on rank 0 (every rank calls it: under FSDP they gather the weights first)."""
    with p.full_weights():
        return _eval(p, step, session, tag) if distributed.is_main() else {}


def _eval(p: Pipeline, step: int, session: Session, tag: str) -> dict[str, float]:
    e, problems = p.cfg.eval, p.task.test[:p.cfg.eval.n_problems]
    rows = len(problems) * (e.k + int(e.greedy))
    with session.progress.phase(f"eval step {step}", rows, f"{len(problems)} problems, {rows} completions"):
        metrics, records = evaluate_run(p, problems)
    session.log_eval(step, tag, metrics, records, f"eval step {step}: mean@{e.k} "
                     f"{metrics.get('eval/mean_at_k', 0):.3f}  "
                     f"greedy {metrics.get('eval/greedy_acc', float('nan')):.3f}  "
                     f"len {metrics.get('eval/len_mean', 0):.1f}")
    return metrics


def train(cfg: RunConfig, resume: bool = False, overwrite: bool = False) -> dict[str, dict[str, float]]:
    """Run (or resume) training; returns {"before": eval metrics, "after": eval metrics, "last": step metrics}.
    Under ``torchrun`` every rank runs this; rank 0 does the I/O and the evals (``distributed.py``)."""
    cfg = distributed.setup(cfg)
    main = distributed.is_main()
    # rank 0 first: it opens the run directory, sets damaged checkpoints aside and builds any warm start (only
    # rank 0 may write one: transformers saves nothing on other ranks), the others then find them in place
    if not main:
        distributed.barrier()
    session = Session(cfg, resume, overwrite, main=main)
    with session.progress.phase("loading the model", about=cfg.model.path):
        p = build(cfg, session.checkpoint, screen=session.progress, io=main)
    p.screen = session.progress
    if main:
        distributed.barrier()
    step = session.restore(p)
    # a resumed run's summary keeps its step-0 eval and last step from the log
    result: dict[str, dict[str, float]] = session.logged(step) if step > 0 else {}
    if step == 0 and cfg.eval.before:
        result["before"] = run_eval(p, 0, session, "step_0")
    step_fn = lagged_step if p.lag is not None else rl_step
    with session.signals():
        while step < cfg.trainer.steps and not distributed.agree(session.stopping):
            metrics = step_fn(p, step)
            step += 1
            session.record(step, metrics)
            result["last"] = metrics
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.trainer.steps:
                run_eval(p, step, session, f"step_{step}")
            if cfg.trainer.save_every and step % cfg.trainer.save_every == 0:
                session.save(p, step)
    if distributed.agree(session.stopping):
        session.interrupted(p, step)
    session.save_final(p, step)
    p.shards.close()  # Ray workers (if any) stop here: the eval below runs in this process
    if cfg.eval.after:
        result["after"] = run_eval(p, step, session, f"step_{step}")
    session.close(result)
    p.generator.close()  # an engine (vLLM) shuts down here, not whenever it is garbage-collected
    distributed.barrier()
    return result
