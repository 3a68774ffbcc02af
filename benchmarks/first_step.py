"""Time to the first RL step of every recipe on a fresh machine (empty cache), as a user would start it.

    python benchmarks/first_step.py [recipes/*.yaml] [--out docs/first_step.md]

Each recipe runs as ``groupwise train RECIPE trainer.steps=1 eval.after=false`` in its own process with an
empty ``GROUPWISE_CACHE`` (the packaged warm start is copied, or the warm start is built), the default
thread count, and the held-out eval before RL on (the default). Reported: seconds from the process start to
the first step's metrics line (warm start + pipeline build + eval before + one step) and the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def first_step(recipe: Path, work: Path) -> tuple[float, float]:
    env = {**os.environ, "GROUPWISE_CACHE": str(work / "cache"), "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "groupwise.cli", "train", str(recipe), "trainer.steps=1", "eval.after=false",
           "trainer.progress=false", f"out_dir={work}", "--overwrite"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    total = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{recipe.name} failed:\n{proc.stderr[-2000:]}")
    name = next(p for p in work.iterdir() if (p / "metrics.jsonl").exists() and p.name != "cache")
    rows = [json.loads(x) for x in (name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    step = next(r for r in rows if "perf/step_s" in r)
    return step["time"] - t0, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipes", nargs="*", default=[str(x) for x in sorted((ROOT / "recipes").glob("*.yaml"))])
    p.add_argument("--out", default="")
    args = p.parse_args()
    lines = ["| recipe | first RL step (s) | whole run (s) |", "|---|---|---|"]
    for r in map(Path, args.recipes):
        with tempfile.TemporaryDirectory() as tmp:
            first, total = first_step(r.resolve(), Path(tmp))
        lines.append(f"| {r.stem} | {first:.1f} | {total:.1f} |")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
