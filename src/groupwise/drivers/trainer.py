"""The single-policy training loop. It calls the stages in order and has no method branches:

  select → rollout (builder + transforms, which score) → filter → advantage (+ transforms) → replay
  → credit → update (loss terms, reduce) → replay.add → log / eval / checkpoint

Hook points, each a registry (see docs/architecture.md): group builders and transforms (resampling,
editing, trees), token-level credit, teachers (in the update), replay buffers, problem selectors; other
drivers (multi-policy, federated) reuse ``rl_step``.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import torch

from groupwise import checkpoint as ckpt
from groupwise.config import RunConfig, dump, to_dict
from groupwise.drivers.setup import Components, build
from groupwise.drivers.stats import group_metrics
from groupwise.eval import evaluate
from groupwise.log import Logger, Progress
from groupwise.types import ScoredBatch, TokenBatch


def rl_step(c: Components, step: int) -> tuple[dict[str, float], int]:
    """One RL step through every stage. Returns (metrics, generated tokens)."""
    cfg, t0 = c.cfg, time.perf_counter()
    ctx = c.context(step)
    c.generator.reset()  # counts every token generated this step, discarded samples included
    n = cfg.rollout.prompts_per_step

    all_rollouts: list = []  # everything generated this step, refills included (for rollout metrics)

    def make(k: int):
        groups = c.build_groups(c.selector.next(step, k, ctx), ctx)
        all_rollouts.extend(groups)
        return groups

    groups, metrics = c.filter(make(n), n, make)
    t_rollout = time.perf_counter() - t0

    batch = ScoredBatch.from_groups(groups, step)
    adv = cfg.advantage.entry()(batch, cfg.advantage.cfg) if groups else torch.zeros(0, 0)
    for spec in cfg.advantage_transforms:
        adv = spec.entry()(batch, adv, spec.cfg)
    for i, g in enumerate(groups):
        for j, s in enumerate(g.samples):
            s.advantage = float(adv[i, j])

    train_groups = groups + c.buffer.sample(step, ctx)
    tokens = token_batch(train_groups)
    for spec in cfg.credit:
        tokens.advantages = spec.entry()(tokens, spec.cfg)
    t1 = time.perf_counter()
    if tokens.samples:
        problems = [g.problem for g in train_groups for _ in g.samples]
        advantages = [tokens.advantages[i, :s.length] for i, s in enumerate(tokens.samples)]
        metrics.update(c.learner.step(tokens.samples, advantages, problems))
        c.generator.sync_weights(c.policy)
    c.buffer.add(groups, step)
    if c.teacher is not None and hasattr(c.teacher, "on_step"):
        c.teacher.on_step(step, c.policy)

    t_update = time.perf_counter() - t1
    metrics.update(group_metrics(all_rollouts))
    metrics.update(c.component_metrics())
    metrics.update({"perf/rollout_s": t_rollout, "perf/update_s": t_update,
                    "perf/step_s": time.perf_counter() - t0, "perf/gen_tokens": float(c.generator.tokens),
                    "perf/generate_s": c.generator.seconds, "perf/prompt_tokens": float(c.generator.prompt_tokens),
                    "perf/gen_tokens_per_s": c.generator.tokens / max(c.generator.seconds, 1e-9),
                    "update/replay_rows": float(sum(len(g.samples) for g in train_groups if g.replayed))})
    return metrics, c.generator.tokens


def token_batch(groups) -> TokenBatch:
    samples = [s for g in groups for s in g.samples]
    t = max((s.length for s in samples), default=1)
    b = len(samples)
    ids = torch.zeros(b, t, dtype=torch.long)
    mask = torch.zeros(b, t, dtype=torch.bool)
    adv = torch.zeros(b, t)
    index = torch.tensor([gi for gi, g in enumerate(groups) for _ in g.samples], dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, :s.length] = s.completion_ids
        mask[i, :s.length] = s.loss_mask
        adv[i, :s.length] = s.advantage * s.loss_mask.float()
    return TokenBatch(samples, index, ids, mask, adv)


def run_eval(c: Components, step: int, logger: Logger, progress: Progress, tag: str) -> dict[str, float]:
    e = c.cfg.eval
    problems = list(c.task.test[:e.n_problems])
    metrics, records = evaluate(c.generator, c.tokenizer, c.task, problems, c.encode, k=e.k,
                                temperature=e.temperature, greedy=e.greedy, seed=c.cfg.seed,
                                max_tokens=e.max_completion_tokens or c.cfg.rollout.max_completion_tokens,
                                timeout_s=c.cfg.reward.verifier_timeout_s)
    out = c.cfg.run_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{tag}.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    logger.log(step, metrics)
    progress.note(f"[{tag}] step {step}: mean@{e.k} {metrics.get('eval/mean_at_k', 0):.3f}  "
                  f"greedy {metrics.get('eval/greedy_acc', float('nan')):.3f}  "
                  f"len {metrics.get('eval/len_mean', 0):.1f}")
    return metrics


def train(cfg: RunConfig, resume: bool = False, overwrite: bool = False) -> dict[str, dict[str, float]]:
    """Run (or resume) training; returns {"before": eval metrics, "after": eval metrics, "last": step metrics}."""
    run_dir = cfg.run_dir
    last = ckpt.latest(run_dir) if resume else None
    if not resume and (run_dir / "metrics.jsonl").exists() and not overwrite:
        raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or --overwrite")
    if overwrite and not resume:
        import shutil

        shutil.rmtree(ckpt.checkpoint_dir(run_dir), ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump(cfg, run_dir / "resolved_config.yaml")
    progress = Progress(cfg.trainer.steps, 0, cfg.trainer.progress)
    progress.note(f"run {run_dir}" + (f" (resuming from {last.name})" if last else ""))
    c = build(cfg, last, progress=progress.callback("warm start (SFT, cached)"))
    start, counters = 0, {"gen_tokens_total": 0.0, "wall_s_total": 0.0}
    if last is not None:
        state = ckpt.load_state(last)
        start, counters = state["step"], state["counters"]
        c.learner.optimizer.load_state_dict(state["optimizer"])
        c.learner.scheduler.load_state_dict(state["scheduler"])
        for name, comp in c.stateful().items():
            comp.load_state_dict(state["components"][name])
    logger = Logger(run_dir, cfg.trainer.sinks, to_dict(cfg), start if last else None)
    progress.update(start, {})
    result: dict[str, dict[str, float]] = {}
    if start == 0 and cfg.eval.before:
        result["before"] = run_eval(c, 0, logger, progress, "step_0")

    def save(step: int) -> None:
        state = {"optimizer": c.learner.optimizer.state_dict(), "scheduler": c.learner.scheduler.state_dict(),
                 "counters": dict(counters), "components": {k: v.state_dict() for k, v in c.stateful().items()}}
        ckpt.save(run_dir, step, c.policy, c.tokenizer, state, cfg.trainer.keep_last)

    stop: list[int] = []  # Ctrl-C / SIGTERM: finish the current step, save, exit; a second one aborts

    def request_stop(signum, frame):
        if stop:
            raise KeyboardInterrupt
        stop.append(signum)
        progress.note("stopping after this step (interrupt again to abort without saving)")

    main = threading.current_thread() is threading.main_thread()  # signals can only be caught there
    handlers = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    step = start
    try:
        while step < cfg.trainer.steps and not stop:
            metrics, gen = rl_step(c, step)
            step += 1
            counters["gen_tokens_total"] += gen
            counters["wall_s_total"] += metrics["perf/step_s"]
            metrics.update({"perf/gen_tokens_total": counters["gen_tokens_total"],
                            "perf/wall_s_total": counters["wall_s_total"]})
            logger.log(step, metrics)
            progress.update(step, metrics)
            result["last"] = metrics
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.trainer.steps:
                run_eval(c, step, logger, progress, f"step_{step}")
            if cfg.trainer.save_every and step % cfg.trainer.save_every == 0:
                save(step)
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
    if stop:
        save(step)
        progress.note(f"interrupted: saved step {step} to {ckpt.checkpoint_dir(run_dir)}; resume with --resume")
        progress.close()
        logger.close()
        raise KeyboardInterrupt
    if ckpt.latest(run_dir) is None or ckpt.latest(run_dir).name != f"step_{step:07d}":
        save(step)
    if cfg.eval.after:
        result["after"] = run_eval(c, step, logger, progress, f"step_{step}")
    progress.close()
    logger.close()
    (run_dir / "summary.json").write_text(json.dumps(result, indent=1))
    return result


def latest_model_dir(run_dir: str | Path) -> Path:
    last = ckpt.latest(Path(run_dir))
    if last is None:
        raise FileNotFoundError(f"{run_dir}: no complete checkpoint")
    return last / "model"
