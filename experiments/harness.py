"""Shared experiment harness: run arms × seeds as separate `groupwise train` processes, aggregate, report.

Each run is `python -m groupwise.cli train <recipe> <arm overrides> seed=<s> name=<arm>-s<s>` writing to
``experiments/out/<experiment>/``; runs execute ``jobs`` at a time with one torch thread each (2 jobs fill
the 2-core reference machine). Aggregates are mean ± sample std over seeds (and min..max), from each run's
``summary.json`` (held-out eval before/after) and ``metrics.jsonl`` (training curves). Nothing is tuned
here: an experiment script states its arms and budget, and reports whatever comes out.

``experiments/out`` is not committed; ``python experiments/harness.py archive <experiment>`` copies its results (not
its checkpoints) into ``experiments/results/<experiment>``, which is, and ``restore`` puts them back for
``--report-only`` on a fresh machine (2026-12-07: a replaced machine took a day of the real-model lab's runs along).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "out"
RESULTS = ROOT / "experiments" / "results"  # archived results, committed: what a lost machine must not take along
FIXED = ["trainer.threads=1", "trainer.progress=false"]  # what every run adds to its arm's overrides


def cli_args(description: str, add_own=None) -> argparse.Namespace:
    """The shared options, plus the experiment's own: ``add_own(parser)`` adds them to the same parser."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (1 torch thread each)")
    p.add_argument("--steps", type=int, default=0, help="override the experiment's step budget (0: its default)")
    p.add_argument("--out", default="", help="output directory (default experiments/out/<experiment>)")
    p.add_argument("--report-only", action="store_true", help="re-aggregate existing runs without training")
    if add_own is not None:
        add_own(p)
    return p.parse_args()


def run_one(recipe: str, overrides: list[str], out_dir: Path, name: str, log: Path) -> Path:
    run = out_dir / name
    if (run / "summary.json").exists():
        return run
    # a run stopped after a checkpoint (a session's end) continues from it; otherwise it starts again
    again = "--resume" if any((run / "checkpoints").glob("step_*")) else "--overwrite"
    cmd = [sys.executable, "-m", "groupwise.cli", "train", recipe, *overrides, f"name={name}", f"out_dir={out_dir}",
           *FIXED, again]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.time()
    with log.open("a") as f:  # appended: a resumed run's log keeps the segments before its stops
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if rc != 0:
        raise RuntimeError(f"run {name} failed (exit {rc}); see {log}")
    print(f"  done {name} in {time.time() - t0:.0f}s", flush=True)
    return run


def run_arms(experiment: str, recipe: str, arms: dict[str, list[str]],
             args: argparse.Namespace) -> dict[str, list[Path]]:
    """Run every arm for every seed (skipping runs already finished); returns arm -> run dirs."""
    out_dir = Path(args.out) if args.out else OUT / experiment
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    jobs = []
    for arm, overrides in arms.items():
        for s in args.seeds:
            ov = [*overrides, f"seed={s}"] + ([f"trainer.steps={args.steps}"] if args.steps else [])
            jobs.append((arm, out_dir / f"{arm}-s{s}", ov, f"{arm}-s{s}"))
    if not args.report_only:
        print(f"{experiment}: {len(jobs)} runs, {args.jobs} at a time -> {out_dir}", flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda j: run_one(recipe, j[2], out_dir, j[3], out_dir / "logs" / f"{j[3]}.log"), jobs))
    runs: dict[str, list[Path]] = {}
    for arm, run, _, _ in jobs:
        runs.setdefault(arm, []).append(run)
    return runs


def seed_of(run: Path) -> int:
    """The seed of a run that ``run_arms`` named ``<arm>-s<seed>``."""
    return int(run.name.rsplit("-s", 1)[1])


def finished(runs: dict[str, list[Path]]) -> dict[str, list[Path]]:
    """``runs`` without the runs that have no summary (stopped or not started), and without arms left empty."""
    return {arm: done for arm, dirs in runs.items() if (done := [d for d in dirs if (d / "summary.json").exists()])}


def reuse(src: Path, recipe: str, overrides: list[str], dst: Path) -> bool:
    """Copy a finished run of another experiment to ``dst`` when its resolved config is this run's (every key it
    records equals the value ``recipe`` + ``overrides`` resolve to; ``name`` and ``out_dir`` aside). Returns
    whether ``dst`` now holds a finished run."""
    import shutil

    import yaml

    from groupwise.config import load, to_dict

    if (dst / "summary.json").exists():
        return True
    if not (src / "summary.json").exists():
        return False
    want, have = to_dict(load(recipe, [*overrides, *FIXED])), yaml.safe_load((src / "resolved_config.yaml").read_text())

    def same(a, b) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return all(k in a and same(a[k], v) for k, v in b.items() if k not in ("name", "out_dir"))
        return a == b

    if not same(want, have):
        print(f"  not reusing {src}: its config differs from this arm's", flush=True)
        return False
    shutil.copytree(src, dst)
    print(f"  reused {src} -> {dst}", flush=True)
    return True


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def eval_samples(run: Path, step: int) -> list[dict]:
    """The held-out eval records of ``step`` (``eval/step_<step>.jsonl``) that were sampled at T=1, not greedy."""
    rows = [json.loads(x) for x in (run / "eval" / f"step_{step}.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if not r["greedy"]]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def final_eval(run: Path, key: str) -> float:
    return summary(run)["after"][key]


def tail_mean(run: Path, key: str, tail: int = 20) -> float:
    rows = [r[key] for r in metrics(run) if key in r and "perf/step_s" in r]
    return statistics.fmean(rows[-tail:])


def head_mean(run: Path, key: str, head: int = 10) -> float:
    """Mean of ``key`` over the first ``head`` training steps (the twin of ``tail_mean``)."""
    rows = [r[key] for r in metrics(run) if key in r and "perf/step_s" in r]
    return statistics.fmean(rows[:head])


def cost_cells(dirs: list[Path]) -> dict[str, dict[str, float]]:
    """Policy + teacher forward passes per step and seconds per step (last 20 steps), over an arm's seeds."""
    return {"forwards/step": agg([forwards(d) for d in dirs]),
            "s/step": agg([tail_mean(d, "perf/step_s", 10**9) for d in dirs])}


def warm_start_eval(runs: dict[str, list[Path]], key: str = "eval/mean_at_k") -> dict[str, float]:
    """``key`` before training (the same warm start in every arm), over the first arm's seeds."""
    return agg([summary(r)["before"][key] for r in next(iter(runs.values()))])


def eval_cells(dirs: list[Path], keys=("mean_at_k", "greedy_acc", "len_mean")) -> dict[str, dict[str, float]]:
    """Each held-out metric ``eval/<key>`` after training, aggregated over an arm's seeds."""
    return {k: agg([final_eval(d, f"eval/{k}") for d in dirs]) for k in keys}


def write_report(out_dir: Path, lines: list[str], plots: list[Path]) -> None:
    """``results.md`` in the experiment's output directory (the plots linked at the end), echoed to stdout."""
    lines = [*lines, *[f"\n![{p.stem}]({p.name})\n" for p in plots]]
    (out_dir / "results.md").write_text("".join(lines))
    print("".join(lines))


def forwards(run: Path) -> float:
    """Mean forward passes per step: the policy's micro-batches (the update's, and the no-grad ones the rollout
    stage's transforms and the replay buffer run; runs before 2026-12-05 did not log the latter) plus the
    teacher's."""
    keys = ("update/policy_forwards", "rollout/policy_forwards", "replay/policy_forwards", "teacher/forwards")
    rows = [r for r in metrics(run) if "perf/step_s" in r]
    return statistics.fmean(sum(r.get(k, 0.0) for k in keys) for r in rows)


def eval_at(run: Path, step: int, key: str = "eval/mean_at_k") -> float:
    return next(r[key] for r in metrics(run) if r["step"] == step and key in r)


def eval_curve(runs: dict[str, list[Path]], key: str = "eval/mean_at_k", upto: float = float("inf")) -> str:
    """A table of ``key`` at every evaluation step up to ``upto`` (the curve as numbers), one row per arm."""
    steps = sorted({r["step"] for r in metrics(next(iter(runs.values()))[0]) if key in r and r["step"] <= upto})
    rows = {arm: {f"step {t}": agg([eval_at(d, t, key) for d in dirs]) for t in steps} for arm, dirs in runs.items()}
    return table(rows, [f"step {t}" for t in steps])


def eval_points(run: Path, key: str = "eval/mean_at_k", x: str = "step", step0=None) -> list[tuple[float, float]]:
    """(x, held-out ``key``) at every evaluation, the warm start's first; x = the step, or a cumulative training
    metric at that step (``perf/wall_s_total``, ``perf/gen_tokens_total``: 0 at step 0). A run that skipped its
    step-0 eval reads it from ``step0(run, key)`` (e.g. another arm of the same seed and warm start)."""
    rows = metrics(run)
    at = {0: 0.0, **{r["step"]: r.get(x, r["step"]) for r in rows if "perf/step_s" in r}}
    pts = [(float(r["step"]) if x == "step" else at[r["step"]], r[key]) for r in rows if key in r]
    if not any(r["step"] == 0 and key in r for r in rows):
        pts.insert(0, (0.0, step0(run, key) if step0 else summary(run)["before"][key]))
    return pts


def first_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    """The x at which the (linearly interpolated) curve first reaches ``target``; None if it never does."""
    if curve[0][1] >= target:
        return curve[0][0]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if y0 < target <= y1:
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0)
    return None


def first_step_at(run: Path, key: str, level: float, window: int = 20, below: bool = False) -> float:
    """The first step whose trailing ``window``-step mean of ``key`` reaches ``level`` (falls under it with
    ``below``); inf if never."""
    rows = [r[key] for r in metrics(run) if key in r and "perf/step_s" in r]
    for i in range(window, len(rows) + 1):
        m = statistics.fmean(rows[i - window:i])
        if (m < level) if below else (m >= level):
            return float(i)
    return float("inf")


def agg(values: list[float]) -> dict[str, float]:
    finite = all(math.isfinite(v) for v in values)  # e.g. "never reached" (inf) in steps-to-x, "none logged" (nan)
    return {"mean": statistics.fmean(values), "undefined": sum(math.isnan(v) for v in values),
            "std": (statistics.stdev(values) if len(values) > 1 else 0.0) if finite else float("nan"),
            "min": min(values), "max": max(values), "n": len(values)}


def fmt(a: dict[str, float], digits: int = 3) -> str:
    if a.get("undefined"):  # e.g. a tail after the commitment in runs that leave no commitment
        return f"undefined in {a['undefined']:.0f}/{a['n']:.0f} seeds"
    return f"{a['mean']:.{digits}f} ± {a['std']:.{digits}f} [{a['min']:.{digits}f}, {a['max']:.{digits}f}]"


def table(rows: dict[str, dict[str, dict[str, float]]], columns: list[str], digits: int = 3) -> str:
    """Markdown: one row per arm, cells 'mean ± std [min, max]' over seeds."""
    head = "| arm | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns) + "\n"
    body = "".join(f"| {arm} | " + " | ".join(fmt(cells[c], digits) if c in cells else "-" for c in columns) + " |\n"
                   for arm, cells in rows.items())
    return head + body


def curves(runs: dict[str, list[Path]], key: str, x: str = "step") -> dict[str, tuple[list[float], list[float]]]:
    """Per arm: the mean curve of ``key`` across seeds (rows aligned by step), with x = step or a cumulative metric."""
    out = {}
    for arm, dirs in runs.items():
        per_seed = []
        for d in dirs:
            rows = [r for r in metrics(d) if key in r]
            xs_by_step = {r["step"]: r.get(x, r["step"]) for r in metrics(d) if x == "step" or x in r}
            xs_by_step.setdefault(0, 0.0)
            per_seed.append([(xs_by_step.get(r["step"], r["step"]) if x != "step" else r["step"], r[key])
                             for r in rows])
        n = min(len(s) for s in per_seed)
        xs = [statistics.fmean(s[i][0] for s in per_seed) for i in range(n)]
        ys = [statistics.fmean(s[i][1] for s in per_seed) for i in range(n)]
        out[arm] = (xs, ys)
    return out


def plot_curves(runs: dict[str, list[Path]], keys: list[str], out: Path, x: str = "step", smooth: int = 10) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for arm, (xs, ys) in curves(runs, key, x).items():
            if not key.startswith("eval/") and smooth > 1:
                ys = [statistics.fmean(ys[max(0, i - smooth + 1):i + 1]) for i in range(len(ys))]
            ax.plot(xs, ys, marker="o" if key.startswith("eval/") else None, label=arm)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# An archive keeps every file of an experiment's output but its checkpoints and the pieces of unfinished work (a run's
# lock, an eval's chunks, temporary files), text logs and records gzipped: a restored finished run is what
# ``--report-only`` reads (its summary, metrics, eval records), not what ``--resume`` or ``--transfer`` needs (weights).
ZIPPED = (".jsonl", ".log")


def archived(path: Path) -> bool:
    return not ({"checkpoints", "weights"} & set(path.parts) or path.name == ".lock" or ".chunk" in path.name
                or path.suffix == ".tmp")


def archive(out_dir: Path, dest: Path) -> list[Path]:
    """Copy ``out_dir``'s results into ``dest`` (``ZIPPED`` suffixes gzipped, ``mtime=0`` so unchanged content
    gives unchanged bytes); returns the files written or changed."""
    written = []
    for src in sorted(p for p in out_dir.rglob("*") if p.is_file() and archived(p.relative_to(out_dir))):
        rel = src.relative_to(out_dir)
        data = src.read_bytes()
        if src.suffix in ZIPPED:
            rel, data = rel.with_name(rel.name + ".gz"), gzip.compress(data, mtime=0)
        if not (target := dest / rel).exists() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(target)
    return written


def restore(dest: Path, out_dir: Path) -> list[Path]:
    """The reverse of ``archive``: every archived file that ``out_dir`` lacks, unzipped; returns the files written."""
    written = []
    for src in sorted(p for p in dest.rglob("*") if p.is_file()):
        rel = src.relative_to(dest)
        zipped = src.suffix == ".gz" and Path(src.stem).suffix in ZIPPED
        if (target := out_dir / (rel.with_name(src.stem) if zipped else rel)).exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.decompress(src.read_bytes()) if zipped else src.read_bytes())
        written.append(target)
    return written


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="archive an experiment's results (experiments/out/<experiment> -> "
                                  "experiments/results/<experiment>, to commit) or restore them")
    cli.add_argument("action", choices=["archive", "restore"])
    cli.add_argument("experiment")
    a = cli.parse_args()
    out, res = OUT / a.experiment, RESULTS / a.experiment
    files = archive(out, res) if a.action == "archive" else restore(res, out)
    print(f"{a.action}: {len(files)} files -> {res if a.action == 'archive' else out}")
