"""Rollout throughput in this process against 1 and 2 Ray rollout workers, at the same ``rollout.shards``.

    python benchmarks/ray_workers.py [--recipe recipes/ray_lab.yaml] [--steps 5] [--threads 1] [KEY=VALUE ...]

One invocation runs the recipe three ways (``rollout.workers`` 0, 1, 2; everything else equal, including
``rollout.shards`` and the torch thread count, so the three produce the same samples, which is checked), each
for ``--steps`` RL steps through ``rl_step``. Throughput is the generated completion tokens of steps 2..N
over the wall seconds of their rollout stage (``perf/gen_tokens / perf/rollout_s``: builder + reward, plus
with workers the weight hand-over and the transfer of the groups; "generate s" sums the generator's own
seconds over the shards, wherever they ran); step 1 is left out (it starts the actors
and sends the first weights). The actors are started once (``workers.prestart``) before the timed runs, so
start-up is not measured. Prints a markdown table with each mode's ratio to in-process, and how much two
processes gain over one on this machine at all (two single-thread matmul loops at once against one).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _matmuls(n: int) -> float:
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    t0 = time.perf_counter()
    for _ in range(n):
        a @ a
    return time.perf_counter() - t0


def cpu_scaling(n: int = 2000) -> float:
    """How much two processes gain over one on this machine: 2 x (one process's matmul seconds) / (the wall
    seconds of two processes doing the same at once). 2.0 = two free cores; 1.0 = no gain."""
    import multiprocessing as mp

    one = _matmuls(n)
    with mp.get_context("spawn").Pool(2) as pool:
        pool.map(_matmuls, [10, 10])  # start-up out of the timing
        t0 = time.perf_counter()
        pool.map(_matmuls, [n, n])
        return 2 * one / (time.perf_counter() - t0)


def measure(recipe: str, overrides: list[str], steps: int) -> dict[str, float | str]:
    from groupwise.config import load
    from groupwise.loop.setup import build
    from groupwise.loop.trainer import rl_step

    p = build(load(recipe, overrides), io=False)
    digest, rows = hashlib.sha256(), []
    inner = p.filter

    def seen(groups, n, make):  # every sample the step trains on, for the same-samples check
        for g in groups:
            for s in g.samples:
                digest.update(s.completion_ids.numpy().tobytes())
                digest.update(s.rollout_logprobs.numpy().tobytes())
        return inner(groups, n, make)

    p.filter = seen
    try:
        rows = [rl_step(p, step) for step in range(steps)]
    finally:
        p.shards.close()
    timed = rows[1:] or rows
    tokens, seconds = sum(r["perf/gen_tokens"] for r in timed), sum(r["perf/rollout_s"] for r in timed)
    return {"tok_s": tokens / seconds, "rollout_s": seconds / len(timed), "tokens": tokens / len(timed),
            "gen_s": sum(r["perf/generate_s"] for r in timed) / len(timed),
            "update_s": sum(r["perf/update_s"] for r in timed) / len(timed), "digest": digest.hexdigest()[:12]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "ray_lab.yaml"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the driver and of every worker")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("overrides", nargs="*", help="extra KEY=VALUE overrides for every mode")
    args = ap.parse_args()
    import ray

    from groupwise.loop import workers

    torch.set_num_threads(args.threads)
    work = tempfile.mkdtemp(prefix="ray_workers_")
    common = [f"out_dir={work}", f"trainer.threads={args.threads}", f"rollout.shards={args.shards}",
              "trainer.record_groups=0", *args.overrides]
    results = {0: measure(args.recipe, [*common, "rollout.workers=0"], args.steps)}
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        workers.prestart(2)  # after the in-process mode: their start must not load its measurement
        for n in (1, 2):
            results[n] = measure(args.recipe, [*common, f"rollout.workers={n}"], args.steps)
    finally:
        ray.shutdown()
    base, scaling = results[0]["tok_s"], cpu_scaling()
    print(f"\n{os.cpu_count()} CPUs (2 processes do {scaling:.2f}x the matmul work of 1), "
          f"{args.threads} torch thread(s) per process, rollout.shards={args.shards}, "
          f"steps 2..{args.steps} of {Path(args.recipe).name} {' '.join(args.overrides)}\n")
    print("| rollout | gen tok/step | rollout s/step | generate s/step (sum over shards) | gen tok/s | ratio | "
          "update s/step | samples |")
    print("|---|---|---|---|---|---|---|---|")
    for n, r in results.items():
        same = "same" if r["digest"] == results[0]["digest"] else f"DIFFER ({r['digest']})"
        print(f"| {'in-process' if n == 0 else f'{n} Ray worker' + ('s' if n > 1 else '')} | {r['tokens']:.0f} | "
              f"{r['rollout_s']:.2f} | {r['gen_s']:.2f} | {r['tok_s']:.0f} | {r['tok_s'] / base:.2f}x | "
              f"{r['update_s']:.2f} | {same} |")


if __name__ == "__main__":
    main()
