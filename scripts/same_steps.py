"""Every recipe's first steps, metric for metric: a refactor must leave them bit-identical.

    python scripts/same_steps.py --write before.json [recipes/*.yaml]    # on the old code
    python scripts/same_steps.py --against before.json [recipes/*.yaml]  # on the new code: exit 1 on a difference

Each recipe runs ``--steps`` RL steps (default 3) through ``groupwise.train`` with no eval, no checkpoint but
the last, one torch thread and shrunk batches (``--small``, default on: 4 prompts × the recipe's group size,
so the whole set runs in minutes on 2 cores), and every step's metrics are kept except the wall-clock ones
(``perf/*``, ``*_s``, ``*/seconds``, ``time``). Metrics that exist on one side only are listed but not failed on (a
refactor may add a metric; ``--strict`` fails on them too). Recipes that need what this machine lacks (vLLM, a GPU, Ray,
Flower, a model that is not on disk) are skipped with the reason; the list of skips is printed.

``tests/e2e/test_same_steps.py`` runs the check on a few recipes against goldens written by this script
(``tests/e2e/golden_steps.json``). Those goldens were written on another machine, whose float32 kernels round
differently in the last bits, so the tests compare within ``ACROSS_MACHINES`` (``--tol``); a refactor checked
on one machine stays bit for bit (``--tol 0``, the default).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WALL_CLOCK_ENDS = ("/seconds", "_s")  # teacher/seconds, select/probe_s
ACROSS_MACHINES = 1e-5
"""Tolerance for a golden written on another machine: |after - before| <= tol * max(|before|, 1). Seen between
two machines of the project's kind: a few float32 ulps after three steps (grad norms 3e-7 relative), and up to
2e-6 absolute in ``mismatch/max_abs_dlogp``, which measures float noise itself. A changed reward, token or
formula moves values far more (docs/results.md, "The third setting's GRPO again, on another machine")."""


def wall_clock(key: str) -> bool:
    """A metric measured on the clock or of the process (``perf/*``, ``challenger/perf/*``, ``*_s``, ``time``)."""
    return key == "time" or key.startswith("perf/") or "/perf/" in key or key.endswith(WALL_CLOCK_ENDS)


def step_metrics(recipe: str, steps: int = 3, small: bool = True, out_dir: str | None = None) -> list[dict]:
    """``recipe``'s first ``steps`` steps' metrics, wall-clock ones left out."""
    import groupwise

    with tempfile.TemporaryDirectory() as tmp:
        out = out_dir or tmp
        over = [f"trainer.steps={steps}", "eval.before=false", "eval.after=false", "trainer.save_every=0",
                "trainer.progress=false", "trainer.threads=1", f"out_dir={out}", "name=same_steps",
                "trainer.record_groups=0", "trainer.sinks=[jsonl]"]
        if small:
            over.append("rollout.prompts_per_step=4")
        from groupwise.config import load

        if load(recipe).rollout.generator.name == "hf":
            over.append("rollout.generator.sampler=multinomial")  # the goldens' sampler (before 2026-12-06)
        groupwise.train(recipe, over, overwrite=True)
        rows = [json.loads(line) for line in (Path(out) / "same_steps" / "metrics.jsonl").read_text().splitlines()
                if line.strip()]
    return [{k: v for k, v in r.items() if not wall_clock(k)}
            for r in rows if "step" in r and not any(k.startswith("eval/") for k in r)]


def skip_reason(recipe: Path) -> str:
    text = recipe.read_text()
    for needle, why in (("vllm", "needs vLLM"), ("workers:", "needs Ray"), ("fgrpo", "needs Flower/Ray"),
                        ("smollm2", "a real model (slow on CPU)"), ("reasoning_gym", "needs reasoning-gym data"),
                        ("cuda", "needs a GPU")):
        if needle in text:
            return why
    return ""


def same(before, after, tol: float = 0.0) -> bool:
    """Equal (NaN equals NaN), or, with ``tol`` > 0, two numbers within ``tol * max(|before|, 1)``."""
    if before == after or (before != before and after != after):
        return True
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (before, after))
    return bool(tol) and numbers and abs(after - before) <= tol * max(abs(before), 1.0)


def compare(before: list[dict], after: list[dict], strict: bool, tol: float = 0.0) -> list[str]:
    """Every metric that differs between two runs' step rows (bit for bit, or within ``tol``: see ``same``)."""
    out = []
    if len(before) != len(after):
        return [f"{len(before)} steps before, {len(after)} after"]
    for b, a in zip(before, after):
        for k in sorted(set(b) | set(a)):
            if k not in b or k not in a:
                if strict:
                    out.append(f"step {b.get('step')}: {k} only {'after' if k in a else 'before'}")
            elif wall_clock(k):
                continue
            elif not same(b[k], a[k], tol):
                out.append(f"step {b.get('step')}: {k} {b[k]!r} -> {a[k]!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipes", nargs="*")
    ap.add_argument("--write")
    ap.add_argument("--against")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--no-small", action="store_true")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--tol", type=float, default=0.0,
                    help=f"compare within this tolerance (0: bit for bit; {ACROSS_MACHINES:g} for another machine)")
    args = ap.parse_args()
    recipes = [Path(r) for r in args.recipes] or sorted((ROOT / "recipes").glob("*.yaml"))
    got: dict[str, list[dict]] = {}
    for r in recipes:
        why = skip_reason(r)
        if why:
            print(f"skip {r.name}: {why}", file=sys.stderr)
            continue
        got[r.name] = step_metrics(str(r), args.steps, not args.no_small)
        print(f"ran {r.name}: {len(got[r.name])} steps", file=sys.stderr)
    if args.write:
        Path(args.write).write_text(json.dumps(got, indent=1, sort_keys=True))
    if not args.against:
        return 0
    want = json.loads(Path(args.against).read_text())
    bad = 0
    for name, rows in got.items():
        if name not in want:
            print(f"{name}: not in {args.against}")
            continue
        diffs = compare(want[name], rows, args.strict, args.tol)
        bad += bool(diffs)
        print(f"{name}: {'identical' if not diffs else 'DIFFERS'}")
        for d in diffs[:10]:
            print(f"  {d}")
    print(f"{len(got) - bad} of {len(got)} recipes identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
