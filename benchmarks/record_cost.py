#!/usr/bin/env python
"""What rollout recording (``trainer.record_groups``, loop/record.py) costs per step, on CPU, in one invocation.

    PYTHONPATH=src python benchmarks/record_cost.py                      # recipes/grpo_lab.yaml, small settings
    PYTHONPATH=src python benchmarks/record_cost.py --recipe recipes/distill_frozen_lab.yaml   # with the teacher gap

Trains the recipe for ``--steps`` steps with recording off (``record_groups=0``) and on (each ``--on`` value),
alternating off, on, ..., on, off over ``--repeats`` rounds in this one process (the warm start is cached, so
every run starts from the same weights and draws the same rollouts). Reports, per setting, the median
``perf/step_s`` over steps 2..N (wall-clock, noisy on a shared machine), the median ``perf/record_s`` (the
recorder's own timer: selection, token decoding, JSON, the write, and with a teacher the gap's two passes)
and the bytes of ``rollouts.jsonl`` per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from groupwise.config import load
from groupwise.loop.trainer import train

SMALL = ["rollout.prompts_per_step=8", "rollout.group_size=8", "rollout.max_completion_tokens=48",
         "trainer.threads=1", "trainer.progress=false", "trainer.sinks=[jsonl]", "trainer.save_every=0",
         "eval.before=false", "eval.after=false", "eval.every=0"]


def one_run(recipe: str, steps: int, groups: int, out: Path) -> dict[str, float]:
    cfg = load(recipe, [*SMALL, f"trainer.steps={steps}", f"trainer.record_groups={groups}", f"out_dir={out}",
                        "name=run"])
    train(cfg)
    rows = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/step_s" in r][1:]  # step 1 warms caches up
    log = cfg.run_dir / "rollouts.jsonl"
    return {"step_s": statistics.median(r["perf/step_s"] for r in rows),
            "record_s": statistics.median(r.get("perf/record_s", 0.0) for r in rows),
            "bytes_per_step": (log.stat().st_size / steps) if log.exists() else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="recipes/grpo_lab.yaml")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--on", default="2,8", help="record_groups values to measure against 0")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    settings = [int(x) for x in args.on.split(",")]
    results: dict[int, list[dict[str, float]]] = {g: [] for g in [0, *settings]}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            order = [0, *settings] if r % 2 == 0 else [*settings[::-1], 0]
            for g in order:
                results[g].append(one_run(args.recipe, args.steps, g, Path(tmp) / f"r{r}g{g}"))
    base = statistics.median(x["step_s"] for x in results[0])
    print(f"{args.recipe}: {args.steps} steps x {args.repeats} repeats, {' '.join(SMALL[:3])}")
    print(f"{'record_groups':>13} {'step_s':>8} {'vs off':>8} {'record_s':>9} {'share':>7} {'KiB/step':>9}")
    for g, xs in results.items():
        step, rec = statistics.median(x["step_s"] for x in xs), statistics.median(x["record_s"] for x in xs)
        kib = statistics.median(x["bytes_per_step"] for x in xs) / 1024
        print(f"{g:>13} {step:8.3f} {step - base:+8.3f} {rec:9.4f} {rec / step:7.1%} {kib:9.1f}")


if __name__ == "__main__":
    main()
