#!/usr/bin/env python
"""The real model on this CPU: where a GRPO step's time goes, LoRA against full fine-tuning, and the largest
batch that fits in memory. Everything runs recipes/smollm2_math.yaml (SmolLM2-135M-Instruct) through the CLI
or the library's own generator and update, each measurement in a fresh process (so peak RSS is its own).

    # LoRA vs full, per-stage split
    PYTHONPATH=src python benchmarks/real_model.py steps  --threads 2 --steps 5
    # peak RSS vs batch, and the fit
    PYTHONPATH=src python benchmarks/real_model.py memory --threads 2
    # what docs/benchmarks.md shows: steps at 1 thread (the experiments' setting)
    PYTHONPATH=src python benchmarks/real_model.py steps --threads 1 --steps 6
    # today's defaults against those when the speed issue was filed, and the bf16 levers, on the real-model lab
    PYTHONPATH=src python benchmarks/real_model.py steps --threads 2 --steps 6 --arms before lora bf16 \
        --recipe recipes/smollm2_lab.yaml
    # the update under optim.autocast none vs bf16: CPU seconds, log-prob and gradient gaps
    PYTHONPATH=src python benchmarks/real_model.py autocast --threads 1 --repeats 3
    # the padded completion positions a lab run's update computed, in one call per micro-batch and split by length
    PYTHONPATH=src python benchmarks/real_model.py padding experiments/results/real_lab/grpo-s0
    # this checkout's update against another checkout's (git worktree add --detach /tmp/before <commit>)
    PYTHONPATH=src python benchmarks/real_model.py update --against /tmp/before --recipe recipes/smollm2_lab.yaml
    # the same for one generate call (prefill and decode)
    PYTHONPATH=src python benchmarks/real_model.py generate --against /tmp/before --recipe recipes/smollm2_lab.yaml

``steps``: ``groupwise train recipes/smollm2_math.yaml`` for ``--steps`` steps per arm (evals off, no
checkpoints): ``lora`` is the recipe as committed (LoRA r 16 on every linear layer, lr 6e-4), ``full`` trains
every weight (``model.lora=null optim.lr=1e-5``). Reported per arm: the medians over steps 2..N of s/step and
its split (``perf/generate_s``, ``perf/reward_s``, ``perf/update_s``; the rest of the rollout stage is
selection, prompt encoding and bookkeeping), generated tokens/s over the whole step and over generation alone,
and the run's peak RSS. The arms alternate (lora, full, full, lora, ...) with ``--repeats`` pairs.

``memory``: peak RSS of (a) one generate call of R rows (groups of 8, every row forced to the 48-token cap)
for R in ``--rows``, and (b) one update (forward + backward + AdamW step, full fine-tuning and LoRA) on a
fixed batch of 16 groups x 8 rows (~8k tokens as the recipe's ``optim.shared_prefix`` packs them: each group's
prompt once; an M above that measures nothing new) at ``optim.micro_batch_tokens`` M in ``--micro``. Memory grows
linearly in R (the KV cache and the sampling buffers) and in M (activations and one micro-batch of full-vocabulary
logits); the fitted slopes give the largest R and M under ``--budget-gib`` (24 GiB, this machine's memory) with 10%
headroom. The update's memory does not depend on the number of rows per step (the update is micro-batched by
tokens), so the batch limit is the generator's ``max_batch_rows`` and the update's ``micro_batch_tokens``, not
``prompts_per_step x group_size``.

``autocast``: per arm (lora, full; one process each), ``--groups`` x 8 completions of up to ``--tokens`` tokens
sampled by the recipe's own generator (fp32) behind the recipe's test prompts, advantages ±1 (every row trained);
then one update (``Learner.step``: forward, backward, AdamW step) of that identical batch from the same weights and
a fresh optimizer, under ``optim.autocast`` none and bf16, alternating (none, bf16, bf16, none, ...) ``--repeats``
times each after one untimed warm-up each, timed in process CPU seconds. Then, on the initial weights: the mean and
max |log p_bf16 − log p_fp32| per token (``Learner.logprobs``), each mode's mean |log p − rollout log p| against
the generator's fp32 log-probs (what ``mismatch/*`` logs), and the relative error ‖g_bf16 − g_fp32‖ / ‖g_fp32‖ of
the flattened gradient (``optim.grad_clip=0``), next to the fp32 gradient's own reordering noise (the same update
with ``optim.shared_prefix`` off).

``padding``: for each run directory given (its ``resolved_config.yaml`` and ``rollouts.jsonl[.gz]``), the trained
rows (non-zero advantage, not dropped) of the groups the run recorded: ``trainer.record_groups`` per kind and step,
2 at its default, so a sample of a step's trained groups, not all of them. Their prompts re-encoded from the run's
own task and config, each step's recorded rows planned into micro-batches as the update would plan them alone
(``plan_micro_batches``); reported: the completion positions computed per real completion token with one call per
micro-batch, and the bound if each micro-batch's completions ran in the two calls by length that pad least (the k
longest rows at the longest width, the rest at theirs). An estimate of the update's padding: its own micro-batches
hold all of a step's trained rows.

``update``: the same code measured against another checkout of it (``--against``: its ``src`` is imported instead
of this one's), for an exact lever in the update. Each process samples ``--groups`` x the recipe's group size
completions (the recipe's generator, cap and real EOS; the same completions on both sides where the generator is
unchanged, checked) behind the recipe's test prompts, advantages ±1, and runs ``Learner.step`` on them ``--repeats``
times from the same weights after an untimed first step, timed in process CPU seconds; the processes alternate
(this, against, against, this, ...) for ``--rounds`` pairs. Reported: each side's median [min-max] and the ratio,
each side's peak RSS (and what sampling alone had reached: above it, the peak is the update's), and how far apart
the two sides' first-step gradients and initial log-probs are (0 where the lever is bitwise).

``generate``: as ``update``, for one call of the recipe's generator: ``--groups`` of the recipe's test problems x its
group size, at its cap and T = 1, seed 0, timed ``--repeats`` times after an untimed first call, in process CPU
seconds; reported as ``update``'s, with the share of rows whose completions are the same token for token on both
sides and the largest log-prob gap on the tokens before the first difference (a lever exact up to float summation
order may flip a near-tie token, after which a row's tokens differ).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from groupwise.types import TokenBatch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/smollm2_math.yaml"
ARMS = {"lora": [], "full": ["model.lora=null", "optim.lr=1e-5"]}
# ``steps --arms before lora bf16 int8``: the recipe under the defaults when the issue "A real-model step at least
# twice as fast" was filed (each decode step the model's own forward), under today's defaults (``lora``: the fused
# decode with the adapter folded in), with both opt-in bf16 levers (generation and the update's passes in bfloat16),
# and with int8 generation (the fused decode's GEMMs in int8), each with the importance-sampling correction their docs
# pair them with
STEP_ARMS = {**ARMS, "before": ["rollout.generator.decode=model"],
             "bf16": ["rollout.generator.dtype=bf16", "optim.autocast=bf16",
                      "loss.importance_sampling={mode: token_truncate}"],
             "int8": ["rollout.generator.dtype=int8", "loss.importance_sampling={mode: token_truncate}"]}


def _env(threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return env


# ------------------------------------------------------------------------------------------------- steps
def run_arm(arm: str, steps: int, threads: int, out_dir: Path, tag: str, recipe: str = RECIPE) -> dict:
    overrides = [*STEP_ARMS[arm], f"trainer.steps={steps}", f"trainer.threads={threads}", "trainer.save_every=0",
                 "trainer.progress=false", "trainer.sinks=[jsonl]", "trainer.record_groups=0",
                 "eval.before=false", "eval.after=false", f"name={tag}", f"out_dir={out_dir}"]
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "groupwise.cli", "train", recipe, *overrides, "--overwrite"],
                          cwd=ROOT, env=_env(threads), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out_dir / tag / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "perf/step_s" in r]
    timed = rows[1:] or rows
    med = lambda k: statistics.median(r.get(k, 0.0) for r in timed)  # noqa: E731
    return {"arm": arm, "wall_s": time.perf_counter() - t, "step_s": med("perf/step_s"),
            "generate_s": med("perf/generate_s"), "reward_s": med("perf/reward_s"),
            "update_s": med("perf/update_s"),
            "gen_tokens": med("perf/gen_tokens"), "prompt_tokens": med("perf/prompt_tokens"),
            "tok_per_s_step": statistics.median(r["perf/gen_tokens"] / r["perf/step_s"] for r in timed),
            "tok_per_s_gen": med("perf/gen_tokens_per_s"),
            "peak_rss_mb": max(r["perf/peak_rss_mb"] for r in rows),
            "trained_rows": med("rollout/samples") - med("update/skipped_rows"), "steps": len(rows)}


def steps_main(a) -> dict:
    out_dir = Path(a.workdir or tempfile.mkdtemp(prefix="real_model-"))
    runs = []
    for r in range(a.repeats):
        for arm in (a.arms if r % 2 == 0 else reversed(a.arms)):
            print(f"[repeat {r + 1}/{a.repeats}] {arm} ...", file=sys.stderr, flush=True)
            runs.append(run_arm(arm, a.steps, a.threads, out_dir, f"{arm}-{r}", a.recipe))
    lines = [f"{a.recipe}, {a.threads} thread(s), "
             f"{a.steps} steps x {a.repeats} run(s) per arm (medians over steps 2..N, then over runs)", "",
             f"{'arm':<6} {'s/step':>7} {'generate':>9} {'reward':>7} {'update':>7} {'other':>6} "
             f"{'gen tok':>7} {'tok/s step':>10} {'tok/s gen':>9} {'rows trained':>12} {'peak RSS MB':>11}"]
    medians = {}
    for arm in a.arms:
        rs = [x for x in runs if x["arm"] == arm]
        m = {k: statistics.median(x[k] for x in rs) for k in rs[0] if isinstance(rs[0][k], float | int)}
        other = m["step_s"] - m["generate_s"] - m["reward_s"] - m["update_s"]
        lines.append(f"{arm:<6} {m['step_s']:>7.2f} {m['generate_s']:>9.2f} {m['reward_s']:>7.2f} "
                     f"{m['update_s']:>7.2f} {other:>6.2f} {m['gen_tokens']:>7.0f} "
                     f"{m['tok_per_s_step']:>10.1f} {m['tok_per_s_gen']:>9.1f} {m['trained_rows']:>12.1f} "
                     f"{m['peak_rss_mb']:>11.0f}")
        medians[arm] = m
    first = a.arms[0]  # the ratios against the first arm: per step, and per generated token (samples differ)
    lines += ["", f"against {first}: " + ", ".join(
        f"{arm} {medians[first]['step_s'] / m['step_s']:.2f}x per step, "
        f"{m['tok_per_s_step'] / medians[first]['tok_per_s_step']:.2f}x per generated token"
        for arm, m in medians.items() if arm != first)]
    print("\n".join(lines))
    return {"runs": runs, "table": lines}


# ------------------------------------------------------------------------------------------------ memory
def child_generate(rows: int, threads: int) -> dict:
    """Peak RSS of the recipe's pipeline after one generate call of ``rows`` rows, every row run to the
    cap."""
    import torch

    from groupwise.config import load
    from groupwise.loop.setup import build
    from groupwise.rollout.base import Request, SamplingParams

    torch.set_num_threads(threads)
    p = build(load(RECIPE, ["trainer.sinks=[]", f"out_dir={tempfile.mkdtemp()}"]), io=False)
    base = _peak_mb()
    prompts = [p.encode(x) for x in p.task.test[: max(rows // 8, 1)]]
    reqs = [Request(x) for x in prompts for _ in range(8)][:rows]
    p.generator.inner.eos_ids = p.generator.inner.eos_ids.new_tensor([-1])  # no EOS: every row runs 48 tokens
    t = time.perf_counter()
    out = p.generator.generate(reqs, SamplingParams(48, 1.0), torch.Generator().manual_seed(0))
    return {"rows": rows, "loaded_mb": base, "peak_mb": _peak_mb(), "seconds": time.perf_counter() - t,
            "tokens": sum(o.completion_ids.numel() for o in out)}


def child_update(micro: int, lora: bool, threads: int, groups: int = 16) -> dict:
    """Peak RSS after one update (forward, backward, AdamW step) of ``groups`` x 8 fixed rows at ``micro``
    tokens a micro-batch (the recipe's ``optim.shared_prefix``: a group packs as its prompt once + 8 x 48
    completion tokens, ~500 tokens)."""
    import torch

    from groupwise.config import load
    from groupwise.loop.setup import build
    from groupwise.types import Group, Sample, TokenBatch

    torch.set_num_threads(threads)
    overrides = ["trainer.sinks=[]", f"out_dir={tempfile.mkdtemp()}", f"optim.micro_batch_tokens={micro}"]
    p = build(load(RECIPE, overrides + ([] if lora else ["model.lora=null", "optim.lr=1e-5"])), io=False)
    base = _peak_mb()
    g = torch.Generator().manual_seed(0)
    batch = []
    for prob in p.task.test[:groups]:
        ids = p.encode(prob)
        samples = [Sample(prompt_ids=ids, completion_ids=torch.randint(100, 40000, (48,), generator=g),
                          rollout_logprobs=torch.zeros(48), loss_mask=torch.ones(48, dtype=torch.bool),
                          finish_reason="length", reward=float(j % 2), scored=True) for j in range(8)]
        batch.append(Group(problem=prob, samples=samples))
    adv = torch.tensor([[1.0 if j % 2 else -1.0 for j in range(8)] for _ in batch])
    t = time.perf_counter()
    m = p.learner.step(TokenBatch.build(batch, adv, []))
    return {"micro": micro, "lora": lora, "loaded_mb": base, "peak_mb": _peak_mb(),
            "seconds": time.perf_counter() - t, "micro_batches": m["update/micro_batches"],
            "tokens": sum(len(p.encode(g.problem)) + 8 * 48 for g in batch)}


def _sampled(p, groups: int, k: int, tokens: int, finish: str) -> tuple[list, list, torch.Tensor]:
    """``groups`` of the pipeline's test problems x ``k`` completions of at most ``tokens`` tokens sampled by its own
    generator (seed 0, T = 1), as samples with ``finish`` as their finish reason; advantages +-1, alternating in a
    group (every row trained)."""
    import torch

    from groupwise.rollout.base import Request, SamplingParams
    from groupwise.types import Sample

    problems = p.task.test[:groups]
    reqs = [Request(p.encode(prob)) for prob in problems for _ in range(k)]
    out = p.generator.generate(reqs, SamplingParams(tokens, 1.0), torch.Generator().manual_seed(0))
    samples = [Sample(prompt_ids=r.prompt_ids, completion_ids=c.completion_ids,
                      rollout_logprobs=c.rollout_logprobs.float(), finish_reason=finish, scored=True,
                      loss_mask=torch.ones(c.completion_ids.numel(), dtype=torch.bool)) for r, c in zip(reqs, out)]
    adv = torch.tensor([[1.0 if j % 2 else -1.0 for j in range(k)] for _ in problems])
    return problems, samples, adv


def _batch(problems: list, samples: list, adv) -> TokenBatch:
    """A fresh TokenBatch of ``_sampled``'s rows (no old log-probs kept from an earlier step)."""
    import dataclasses

    from groupwise.types import Group, TokenBatch

    k = len(samples) // len(problems)
    fresh = [dataclasses.replace(s, old_logprobs=None) for s in samples]
    return TokenBatch.build([Group(problem=prob, samples=fresh[k * i:k * i + k]) for i, prob in enumerate(problems)],
                            adv, [])


def _restore(trained: list, start: list) -> None:
    """The trained parameters back to ``start``."""
    import torch

    with torch.no_grad():
        for q, s0 in zip(trained, start):
            q.copy_(s0)


def _step_grad(learner, trained: list, batch) -> torch.Tensor:
    """``learner.step(batch)``, returning the flattened gradient of ``trained`` as the optimizer step saw it."""
    import torch

    got: list[torch.Tensor] = []
    real = learner.optimizer.step
    learner.optimizer.step = lambda *a, **kw: (got.append(torch.cat([q.grad.reshape(-1) for q in trained])),
                                               real(*a, **kw))[1]
    try:
        learner.step(batch)
    finally:
        learner.optimizer.step = real
    return got[0]


def child_autocast(arm: str, threads: int, groups: int = 8, tokens: int = 40, repeats: int = 3) -> dict:
    """The update of one sampled batch under optim.autocast none and bf16 (see the module docstring)."""
    import dataclasses

    import torch

    from groupwise.config import load
    from groupwise.loop.setup import build
    from groupwise.update import Learner, build_optimizer

    torch.set_num_threads(threads)
    p = build(load(RECIPE, ["trainer.sinks=[]", f"out_dir={tempfile.mkdtemp()}", *ARMS[arm]]), io=False)
    problems, samples, adv = _sampled(p, groups, 8, tokens, "length")
    trained = [q for q in p.policy.parameters() if q.requires_grad]
    start = [q.detach().clone() for q in trained]

    def learner(mode: str, **optim) -> Learner:
        _restore(trained, start)
        o = dataclasses.replace(p.learner.settings.optim, autocast=mode, **optim)
        opt, sched = build_optimizer(p.policy, o, p.cfg.trainer.steps)
        return Learner(p.policy, opt, sched, p.learner.terms, dataclasses.replace(p.learner.settings, optim=o),
                       p.learner.ref, p.learner.teacher)

    seconds: dict[str, list[float]] = {"none": [], "bf16": []}
    for mode in ("none", "bf16"):  # warm-up: first-call allocations and kernel setup
        learner(mode).step(_batch(problems, samples, adv))
    order = [m for r in range(repeats) for m in (("none", "bf16") if r % 2 == 0 else ("bf16", "none"))]
    for mode in order:
        lr = learner(mode)
        b = _batch(problems, samples, adv)
        t = time.process_time()
        lr.step(b)
        seconds[mode].append(time.process_time() - t)

    def grads(mode: str, **optim) -> torch.Tensor:
        return _step_grad(learner(mode, grad_clip=0.0, **optim), trained, _batch(problems, samples, adv))

    g32, g16, g32b = grads("none"), grads("bf16"), grads("none", shared_prefix=False)
    lp = {mode: learner(mode).logprobs(p.policy, samples) for mode in ("none", "bf16")}
    cat = lambda xs: torch.cat([x.reshape(-1) for x in xs])  # noqa: E731
    gap = (cat(lp["bf16"]) - cat(lp["none"])).abs()
    roll = cat([s.rollout_logprobs for s in samples])
    return {"arm": arm, "seconds": seconds, "rows": len(samples), "tokens": int(roll.numel()),
            "dlogp_mean": float(gap.mean()), "dlogp_max": float(gap.max()),
            "rollout_gap_fp32": float((cat(lp["none"]) - roll).abs().mean()),
            "rollout_gap_bf16": float((cat(lp["bf16"]) - roll).abs().mean()),
            "grad_rel_err": float((g16 - g32).norm() / g32.norm()),
            "grad_rel_err_fp32_reorder": float((g32b - g32).norm() / g32.norm())}


def child_update_ab(recipe: str, threads: int, groups: int, repeats: int, save: str) -> dict:
    """``update``'s measurement in one process (see the module docstring); gradient and log-probs to ``save``."""
    import torch

    from groupwise.config import load
    from groupwise.loop.setup import build

    torch.set_num_threads(threads)
    p = build(load(recipe, ["trainer.sinks=[]", f"out_dir={tempfile.mkdtemp()}"]), io=False)
    problems, samples, adv = _sampled(p, groups, p.cfg.rollout.group_size, p.cfg.rollout.max_completion_tokens, "stop")
    trained = [q for q in p.policy.parameters() if q.requires_grad]
    start = [q.detach().clone() for q in trained]
    sampled_mb = _peak_mb()
    logprobs = torch.cat([x.reshape(-1) for x in p.learner.logprobs(p.policy, samples)])
    # untimed: first-call allocations and kernel setup; its gradient is the one compared
    torch.save({"grad": _step_grad(p.learner, trained, _batch(problems, samples, adv)), "logprobs": logprobs}, save)
    seconds = []
    for _ in range(repeats):
        _restore(trained, start)
        b = _batch(problems, samples, adv)
        t = time.process_time()
        p.learner.step(b)
        seconds.append(time.process_time() - t)
    ids = torch.cat([s.completion_ids for s in samples])
    return {"seconds": seconds, "rows": len(samples), "tokens": int(ids.numel()), "sampled_mb": sampled_mb,
            "peak_mb": _peak_mb(),
            "samples_hash": int((ids * torch.arange(1, ids.numel() + 1)).sum())}


def child_generate_ab(recipe: str, threads: int, groups: int, repeats: int, save: str) -> dict:
    """``generate``'s measurement in one process (see the module docstring); the first call's output to ``save``."""
    import torch

    from groupwise.config import load
    from groupwise.loop.setup import build
    from groupwise.rollout.base import Request, SamplingParams

    torch.set_num_threads(threads)
    p = build(load(recipe, ["trainer.sinks=[]", f"out_dir={tempfile.mkdtemp()}"]), io=False)
    reqs = [Request(p.encode(prob)) for prob in p.task.test[:groups] for _ in range(p.cfg.rollout.group_size)]
    params = SamplingParams(p.cfg.rollout.max_completion_tokens, 1.0)
    first = p.generator.generate(reqs, params, torch.Generator().manual_seed(0))  # untimed: first-call setup
    torch.save([(c.completion_ids, c.rollout_logprobs.float()) for c in first], save)
    seconds = []
    for _ in range(repeats):
        t = time.process_time()
        p.generator.generate(reqs, params, torch.Generator().manual_seed(0))
        seconds.append(time.process_time() - t)
    return {"seconds": seconds, "rows": len(reqs), "tokens": sum(int(c.completion_ids.numel()) for c in first),
            "prompt_tokens": sum(len(r.prompt_ids) for r in reqs[::p.cfg.rollout.group_size]), "peak_mb": _peak_mb()}


def padding_main(a) -> dict:
    import gzip

    import torch

    from groupwise.config import load
    from groupwise.loop.setup import build
    from groupwise.types import Sample
    from groupwise.update import plan_micro_batches

    out, lines = {}, ["run: real completion tokens trained; positions computed per real token, one call per "
                      "micro-batch -> two calls by length"]
    for run in map(Path, a.runs):
        cfg = load(str(run / "resolved_config.yaml"), ["trainer.sinks=[]", f"out_dir={tempfile.mkdtemp()}"])
        p = build(cfg, io=False)
        by_id = {prob.id: prob for prob in p.task.train}
        gz = run / "rollouts.jsonl.gz"
        with gzip.open(gz, "rt") if gz.exists() else (run / "rollouts.jsonl").open() as f:
            records = f.read().splitlines()
        real = one = two = groups = 0
        for line in records:
            samples = []
            for g in json.loads(line)["groups"]:
                if g["kind"] != "trained":
                    continue
                groups += 1
                ids = p.encode(by_id[g["problem"]["id"]])
                for x in g["samples"]:
                    if x.get("dropped") or x.get("filtered") or not x.get("advantage"):
                        continue
                    n = x["length"]
                    samples.append(Sample(prompt_ids=ids, completion_ids=torch.zeros(n, dtype=torch.long),
                                          rollout_logprobs=torch.zeros(n), loss_mask=torch.ones(n, dtype=torch.bool),
                                          finish_reason=x["finish_reason"]))
            for mb in plan_micro_batches(samples, cfg.optim.micro_batch_tokens, shared_prefix=True):
                ls = [samples[i].length for i in mb]
                real, one = real + sum(ls), one + len(ls) * max(ls)
                top = sorted(ls, reverse=True)  # the best two calls: the k longest at the longest width, the rest
                two += min([len(top) * top[0]] + [k * top[0] + (len(top) - k) * top[k] for k in range(1, len(top))])
        out[str(run)] = {"real": real, "one_call": one / real, "split": two / real, "groups": groups,
                         "steps": len(records)}
        lines.append(f"{run}: {groups} recorded trained groups over {len(records)} steps, {real} tokens; "
                     f"{one / real:.3f} -> {two / real:.3f}")
    print("\n".join(lines))
    return {"runs": out, "table": lines}


def update_main(a) -> dict:
    return ab_main(a, "update")


def generate_main(a) -> dict:
    return ab_main(a, "generate")


def ab_main(a, what: str) -> dict:
    """``update`` / ``generate``: this checkout against ``--against``, alternating processes (module docstring)."""
    against = Path(a.against).resolve()
    sides = {"this": ROOT, "against": against}
    runs: dict[str, list[dict]] = {"this": [], "against": []}
    saved: dict[str, str] = {}
    order = [s for r in range(a.rounds) for s in (("this", "against") if r % 2 == 0 else ("against", "this"))]
    for side in order:
        print(f"{what}: {side} ({sides[side]}) ...", file=sys.stderr, flush=True)
        saved.setdefault(side, str(Path(tempfile.mkdtemp()) / "first.pt"))
        runs[side].append(_child(f"child_{what}_ab({a.recipe!r}, {a.threads}, {a.groups}, {a.repeats}, "
                                 f"{saved[side]!r})", a.threads, sides[side] / "src"))
    import torch

    first = {side: torch.load(path) for side, path in saved.items()}
    secs = {side: [x for r in rs for x in r["seconds"]] for side, rs in runs.items()}
    fmt = lambda xs: f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"  # noqa: E731
    r0 = runs["this"][0]
    call = (f"Learner.step on {r0['rows']} sampled rows ({a.groups} groups, {r0['tokens']} completion tokens)"
            if what == "update" else f"one generate call of {r0['rows']} rows ({a.groups} prompts, "
            f"{r0['prompt_tokens']} prompt tokens, {r0['tokens']} generated)")
    lines = [f"{a.recipe}, {call}, {a.threads} thread(s), process CPU s, {a.rounds} alternating processes x "
             f"{a.repeats} calls per side (median [min-max])",
             f"  this    ({ROOT}): {fmt(secs['this'])}",
             f"  against ({against}): {fmt(secs['against'])}",
             f"  against / this: {statistics.median(secs['against']) / statistics.median(secs['this']):.3f}x",
             *[f"  peak RSS {side}: {max(r['peak_mb'] for r in runs[side]):.0f} MB" + (
               f" (after sampling: {max(r['sampled_mb'] for r in runs[side]):.0f} MB)" if what == "update" else "")
               for side in sides]]
    if what == "update":
        g, g0 = first["this"]["grad"], first["against"]["grad"]
        same = len({r["samples_hash"] for rs in runs.values() for r in rs}) == 1
        lines += [f"  same completions on both sides: {same}",
                  f"  first-step gradient |g - g_against| / |g_against|: {float((g - g0).norm() / g0.norm()):.2e} "
                  f"(bitwise equal: {bool(torch.equal(g, g0))})",
                  f"  initial log-probs max |diff|: "
                  f"{float((first['this']['logprobs'] - first['against']['logprobs']).abs().max()):.2e}"]
    else:
        same, gap = 0, 0.0
        for (ids, lp), (ids0, lp0) in zip(first["this"], first["against"]):
            n = min(len(ids), len(ids0))
            diff = (ids[:n] != ids0[:n]).nonzero()
            k = int(diff[0]) if len(diff) else n
            same += bool(k == n and len(ids) == len(ids0))
            if k:  # the log-probs of the same tokens, before the first different one
                gap = max(gap, float((lp[:k] - lp0[:k]).abs().max()))
        lines += [f"  rows the same token for token on both sides: {same} of {len(first['this'])}",
                  f"  largest log-prob gap up to a row's first different token: {gap:.2e}"]
    print("\n".join(lines))
    return {"runs": runs, "table": lines}


def autocast_main(a) -> dict:
    runs = []
    for arm in ARMS:
        print(f"autocast: {arm} ...", file=sys.stderr, flush=True)
        runs.append(_child(f"child_autocast({arm!r}, {a.threads}, {a.groups}, {a.tokens}, {a.repeats})", a.threads))
    lines = [f"{RECIPE}, one update of {runs[0]['rows']} sampled rows ({a.groups} groups x 8, "
             f"{runs[0]['tokens']} completion tokens), {a.threads} thread(s), process CPU s, "
             f"{a.repeats} alternating repeats per mode (median [min-max])", "",
             f"{'arm':<5} {'none s':>18} {'bf16 s':>18} {'speed-up':>8} {'|dlogp| mean':>12} {'max':>6} "
             f"{'vs rollout fp32':>15} {'bf16':>7} {'grad rel err':>12} {'fp32 noise':>10}"]
    for r in runs:
        s32, s16 = r["seconds"]["none"], r["seconds"]["bf16"]
        fmt = lambda xs: f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"  # noqa: E731
        lines.append(f"{r['arm']:<5} {fmt(s32):>18} {fmt(s16):>18} "
                     f"{statistics.median(s32) / statistics.median(s16):>7.2f}x {r['dlogp_mean']:>12.2e} "
                     f"{r['dlogp_max']:>6.2f} {r['rollout_gap_fp32']:>15.2e} {r['rollout_gap_bf16']:>7.2e} "
                     f"{r['grad_rel_err']:>12.2e} {r['grad_rel_err_fp32_reorder']:>10.1e}")
    print("\n".join(lines))
    return {"runs": runs, "table": lines}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(call: str, threads: int, src: Path = ROOT / "src") -> dict:
    """``call`` (``child_...(...)``, a function of this module) in a fresh process importing groupwise from ``src``:
    its returned dict."""
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import real_model as m; "
            f"print(json.dumps(m.{call}))")
    env = dict(_env(threads), PYTHONPATH=str(src))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{call} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def memory_main(a) -> dict:
    budget = a.budget_gib * 1024 * 0.9
    gen = []
    for r in a.rows:
        print(f"generate {r} rows ...", file=sys.stderr, flush=True)
        gen.append(_child(f"child_generate({r}, {a.threads})", a.threads))
    upd = []
    for lora in (False, True):
        for m in a.micro:
            print(f"update at {m} tokens a micro-batch ({'lora' if lora else 'full'}) ...", file=sys.stderr,
                  flush=True)
            upd.append(_child(f"child_update({m}, {lora}, {a.threads})", a.threads))
    lines = [f"peak RSS, one process per point, {a.threads} thread(s); linear fits; "
             f"budget {a.budget_gib} GiB x 0.9", ""]
    out: dict = {"generate": gen, "update": upd}
    if len(gen) > 1:
        g0, g1 = fit([x["rows"] for x in gen], [x["peak_mb"] for x in gen])
        lines.append("generate (groups of 8, 48 new tokens a row, prompts ~112 tokens):")
        lines += [f"  {x['rows']:>5} rows: peak {x['peak_mb']:>7.0f} MB (model loaded: {x['loaded_mb']:.0f} MB), "
                  f"{x['tokens'] / x['seconds']:.0f} tok/s" for x in gen]
        lines.append(f"  fit: {g0:.0f} MB + {g1:.2f} MB/row -> at most {int((budget - g0) / g1):,} rows per "
                     "generate call")
        out.update(generate_fit=[g0, g1], max_rows=int((budget - g0) / g1))
    for lora in (False, True) if len(a.micro) > 1 else ():
        pts = [x for x in upd if x["lora"] == lora]
        u0, u1 = fit([x["micro"] for x in pts], [x["peak_mb"] for x in pts])
        name = "LoRA" if lora else "full fine-tuning"
        lines.append(f"update, {name} ({pts[0]['tokens']:,} packed tokens a step):")
        lines += [f"  micro_batch_tokens {x['micro']:>6}: {x['micro_batches']:.0f} micro-batches, "
                  f"peak {x['peak_mb']:>7.0f} MB, {x['seconds']:.1f} s" for x in pts]
        top = int((budget - u0) / u1)
        lines.append(f"  fit: {u0:.0f} MB + {u1 * 1024:.0f} MB per 1k tokens -> "
                     f"micro_batch_tokens up to {top:,}")
        out[f"max_micro_{'lora' if lora else 'full'}"] = top
    print("\n".join(lines))
    out["table"] = lines
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("steps")
    s.add_argument("--steps", type=int, default=5)
    s.add_argument("--repeats", type=int, default=1)
    s.add_argument("--workdir")
    s.add_argument("--arms", nargs="+", choices=list(STEP_ARMS), default=list(ARMS))
    s.add_argument("--recipe", default=RECIPE)
    m = sub.add_parser("memory")
    m.add_argument("--rows", type=int, nargs="*", default=[64, 256, 512], help="none: skip generation")
    m.add_argument("--micro", type=int, nargs="*", default=[1024, 2048, 4096], help="none: skip the update")
    m.add_argument("--budget-gib", type=float, default=24.0)
    c = sub.add_parser("autocast")
    c.add_argument("--groups", type=int, default=8)
    c.add_argument("--tokens", type=int, default=40)
    c.add_argument("--repeats", type=int, default=3)
    ab = []  # this checkout against another: the update, one generate call
    for name, groups in (("update", 4), ("generate", 8)):
        ab.append(q := sub.add_parser(name))
        q.add_argument("--against", required=True, help="another checkout of groupwise (its src is imported)")
        q.add_argument("--recipe", default=RECIPE)
        q.add_argument("--groups", type=int, default=groups)
        q.add_argument("--repeats", type=int, default=2)
        q.add_argument("--rounds", type=int, default=2)
    d = sub.add_parser("padding")
    d.add_argument("runs", nargs="+", help="run directories (resolved_config.yaml, rollouts.jsonl[.gz])")
    for q in (s, m, c, *ab):
        q.add_argument("--threads", type=int, default=2)
        q.add_argument("--json", help="write the measurements here")
    d.add_argument("--json", help="write the measurements here")
    a = p.parse_args(argv)
    result = {"steps": steps_main, "memory": memory_main, "autocast": autocast_main,
              "update": update_main, "generate": generate_main, "padding": padding_main}[a.cmd](a)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
