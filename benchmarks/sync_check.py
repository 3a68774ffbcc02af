#!/usr/bin/env python
"""What the weight-sync check (``rollout.sync_check``, ``rollout/sync_check.py``) sees and costs, on a recipe.

    PYTHONPATH=src python benchmarks/sync_check.py                          # recipes/grpo_lab.yaml, 5 steps
    PYTHONPATH=src python benchmarks/sync_check.py --recipe R --steps N model.device=cuda ...

Each step: a deep copy of the policy is taken before the step (an engine that would miss this step's sync),
the step runs (its own check probes the real generator: the gap of a good sync, ``sync/probe_dlogp``), then
the stale copy is probed against the updated policy. Prints a markdown table: per step the good gap, the
one-step-stale gap, the tolerance, the check's seconds (``perf/sync_check_s``: the probes of this step, the
engine's first-generation probe included at step 1) and the step's seconds.
"""

from __future__ import annotations

import argparse
import copy

from groupwise.config import load
from groupwise.drivers.setup import build
from groupwise.drivers.trainer import rl_step
from groupwise.rollout.hf import HFConfig, HFGenerator
from groupwise.rollout.sync_check import gap, probe


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
    print("| step | gap, good sync | gap, one step stale | tolerance | check s | step s |")
    print("|---|---|---|---|---|---|")
    for step in range(a.steps):
        stale = HFGenerator(HFConfig(), copy.deepcopy(p.policy), p.tokenizer)
        m = rl_step(p, step)
        g = gap(p.policy, probe(stale, check.prompt_ids), check.pad_id)
        print(f"| {step + 1} | {m['sync/probe_dlogp']:.1e} | {g:.1e} | {check.tol:.0e} | {m['perf/sync_check_s']:.3f} "
              f"| {m['perf/step_s']:.2f} |")


if __name__ == "__main__":
    main()
