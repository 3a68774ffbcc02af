#!/usr/bin/env python
"""What the weight-sync check (``rollout.sync_check``, ``loop/sync_check.py``) sees and costs, on a recipe.

    PYTHONPATH=src python benchmarks/sync_check.py                          # recipes/grpo_lab.yaml, 5 steps
    PYTHONPATH=src python benchmarks/sync_check.py --recipe R --steps N model.device=cuda ...

Each step: a deep copy of the policy is taken before the step (an engine that would miss this step's sync),
the step runs, then the run's own engine is probed against the updated policy (the gap of a good sync; timed:
what one check costs an engine that must be probed, e.g. vLLM or an ``hf`` copy; the default ``hf`` generator
shares the policy's parameters and is not probed after its syncs), then the stale copy. Prints a markdown table:
per step the good gap, the one-step-stale gap, the tolerance, one probe's seconds and the step's seconds.
"""

from __future__ import annotations

import argparse
import copy
import time

from groupwise.config import load
from groupwise.loop.setup import build
from groupwise.loop.sync_check import gap, probe
from groupwise.loop.trainer import rl_step
from groupwise.standard.hf import HFConfig, HFGenerator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="recipes/grpo_lab.yaml")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.threads=1")
    a = ap.parse_args()
    p = build(load(a.recipe, ["trainer.record_groups=0", "out_dir=/tmp/groupwise-sync-check", *a.overrides]), io=False)
    check = p.generator.check
    if check is None:
        raise SystemExit("rollout.sync_check is none (or the generator's log-probs are scripted): nothing to measure")
    print(f"{a.recipe} {' '.join(a.overrides)}: probe of {len(check.prompt_ids)} prompt tokens\n")
    print("| step | gap, good sync | gap, one step stale | tolerance | probe s | step s |")
    print("|---|---|---|---|---|---|")
    for step in range(a.steps):
        stale = HFGenerator(HFConfig(), copy.deepcopy(p.policy), p.tokenizer)
        m = rl_step(p, step)
        t0 = time.perf_counter()
        good = gap(p.policy, probe(p.generator.engine, check.prompt_ids), check.pad_id)
        seconds = time.perf_counter() - t0
        g = gap(p.policy, probe(stale, check.prompt_ids), check.pad_id)
        print(f"| {step + 1} | {good:.1e} | {g:.1e} | {check.tol:.0e} | {seconds:.3f} | {m['perf/step_s']:.2f} |")


if __name__ == "__main__":
    main()
