"""Steps per second of the synchronous loop against asynchronous rollouts (``rollout.max_async_level`` 1, 2).

    python benchmarks/async_rollouts.py [--recipe recipes/grpo_lab.yaml] [--steps 6] [--threads 1 2] [--rounds 3]
                                        [KEY=VALUE ...]

One invocation runs the recipe with K = 0, 1, 2 for every ``--threads`` value (``trainer.threads``: torch's
intra-op threads, process-wide), everything else equal, each for ``--steps`` RL steps through the loop's own
step function (``rl_step``, or ``lagged_step`` for K > 0). Steps 2..N are timed on the wall clock: with K > 0
each of them is one update (background thread) overlapped with the next step's rollout stage (main thread),
and step 1, which rolls out twice and overlaps nothing, is left out, as are start-up and the warm start.
``trainer.steps`` is set past ``--steps`` so that every timed step also rolls the next one out.

Thread split: the rollout stage runs in the main thread, the update in one background thread; torch gives
each calling thread its own intra-op team of ``trainer.threads`` threads, so ``--threads 1`` runs at most two
busy threads (one per core on a 2-core machine) and ``--threads 2`` up to four. Prints a markdown table (steps/s,
rollout and update seconds per step, each K's ratio to K=0 at the same thread count; medians over ``--rounds``
rounds that run every setting in turn, so that the load of a shared machine drifts over all of them alike) and
how much two threads gain over one on this machine at all (two single-thread matmul loops at once against one).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _matmuls(n: int, out: list[float]) -> None:
    a = torch.randn(256, 256)
    t0 = time.perf_counter()
    for _ in range(n):
        a @ a
    out.append(time.perf_counter() - t0)


def thread_scaling(n: int = 2000) -> float:
    """2 x (one thread's matmul seconds) / (wall seconds of two threads doing the same at once), one intra-op
    thread each: 2.0 = two free cores, 1.0 = no gain."""
    torch.set_num_threads(1)
    one: list[float] = []
    _matmuls(n, one)
    both: list[float] = []
    workers = [threading.Thread(target=_matmuls, args=(n, both)) for _ in range(2)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return 2 * one[0] / (time.perf_counter() - t0)


def measure(recipe: str, overrides: list[str], steps: int) -> dict[str, float]:
    from groupwise.config import load
    from groupwise.loop.setup import build
    from groupwise.loop.trainer import lagged_step, rl_step

    p = build(load(recipe, [*overrides, f"trainer.steps={steps + 1}"]), io=False)
    fn = lagged_step if p.lag is not None else rl_step
    inner, learn = p.learner.step, []

    def timed_step(batch):  # the update's own seconds (perf/update_s of a lagged step also holds the overlap)
        t = time.perf_counter()
        out = inner(batch)
        learn.append(time.perf_counter() - t)
        return out

    p.learner.step = timed_step
    rows = [fn(p, 0)]
    t0 = time.perf_counter()
    rows += [fn(p, step) for step in range(1, steps)]
    wall, timed = time.perf_counter() - t0, rows[1:]
    return {"steps_s": len(timed) / wall, "rollout_s": sum(r["perf/rollout_s"] for r in timed) / len(timed),
            "update_s": sum(learn[1:]) / max(len(learn) - 1, 1),
            "staleness": sum(r["rollout/staleness_mean"] for r in timed) / len(timed)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "grpo_lab.yaml"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="K = 0, 1, 2 in turn, this many times (medians reported)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="async_bench_")
    base = [*args.overrides, f"out_dir={out}", "trainer.progress=false", "eval.before=false", "eval.after=false"]
    got: dict[tuple[int, int], list[dict[str, float]]] = {}
    scaling = []
    for _ in range(args.rounds):  # interleaved, so that a shared machine's load drifts over every K alike
        scaling.append(thread_scaling())
        for threads in args.threads:
            for k in (0, 1, 2):
                over = [*base, f"trainer.threads={threads}", f"rollout.max_async_level={k}"]
                got.setdefault((threads, k), []).append(measure(args.recipe, over, args.steps))
    med = lambda xs: statistics.median(xs)  # noqa: E731
    print(f"two threads did {med(scaling):.2f}x the matmul work of one on this machine (median of "
          f"{', '.join(f'{x:.2f}' for x in scaling)})\n")
    print("| threads | K | steps/s (median [min, max]) | rollout s/step | update s/step | mean staleness | vs K=0 |\n"
          "|---|---|---|---|---|---|---|")
    for threads in args.threads:
        for k in (0, 1, 2):
            ms = got[(threads, k)]
            sps = [m["steps_s"] for m in ms]
            ratio = med(sps) / med([m["steps_s"] for m in got[(threads, 0)]])
            print(f"| {threads} | {k} | {med(sps):.3f} [{min(sps):.3f}, {max(sps):.3f}] | "
                  f"{med([m['rollout_s'] for m in ms]):.2f} | {med([m['update_s'] for m in ms]):.2f} | "
                  f"{med([m['staleness'] for m in ms]):.1f} | {ratio:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
