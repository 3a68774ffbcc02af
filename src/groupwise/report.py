"""``groupwise compare RUN...``: a table of runs side by side.

For each run: held-out metrics before and after training (from its eval entries), training metrics
averaged over the last ``tail`` logged steps, and cost (steps, generated tokens, wall-clock).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from groupwise.log import eval_k, read_metrics

DEFAULT_EVAL = ("eval/mean_at_k", "eval/greedy_acc", "eval/len_mean")
DEFAULT_TRAIN = ("reward/mean", "reward/correct_frac", "rollout/completion_len_mean")


def run_summary(run: str | Path, tail: int = 10, extra: tuple[str, ...] = (),
                rows: list[dict] | None = None) -> dict[str, float | int | str]:
    rows = read_metrics(run) if rows is None else rows
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    train = [r for r in rows if "perf/step_s" in r]
    out: dict[str, float | int | str] = {"run": Path(run).name}
    samples_per_problem = eval_k(run)
    if evals and samples_per_problem is not None:  # the k of mean_at_k / pass_at_k: runs with other k differ
        out["eval.k"] = str(samples_per_problem)
    if evals:
        for k in DEFAULT_EVAL:
            if k in evals[0]:
                out[f"{k} (start)"] = evals[0][k]
            if k in evals[-1]:
                out[k] = evals[-1][k]
    for k in (*DEFAULT_TRAIN, *extra):
        vals = [r[k] for r in train[-tail:] if k in r] or [r[k] for r in evals[-1:] if k in r]
        if vals:
            out[k] = statistics.fmean(vals)
    if train:
        out["steps"] = int(train[-1]["step"])
        out["perf/gen_tokens_total"] = int(train[-1].get("perf/gen_tokens_total", 0))  # counts: integers
        out["perf/wall_s_total"] = train[-1].get("perf/wall_s_total", 0.0)
        out["perf/step_s (median)"] = statistics.median(r["perf/step_s"] for r in train)
    return out


def compare(runs: list[str], tail: int = 10, extra: tuple[str, ...] = ()):
    from rich.table import Table

    logs = [read_metrics(r) for r in runs]
    summaries = [run_summary(r, tail, extra, rows) for r, rows in zip(runs, logs)]
    cols: list[str] = []
    for s in summaries:
        cols += [k for k in s if k not in cols]
    # metrics as rows, runs as columns: a few runs fit a terminal however many metrics there are
    # the steps each mean covers: a run shorter than ``tail`` averages all of its steps
    counts = sorted({min(tail, sum("perf/step_s" in r for r in rows)) for rows in logs})
    ks = [str(s["eval.k"]) for s in summaries if "eval.k" in s]
    k_note = f"; eval.k differs ({' / '.join(ks)}): each mean_at_k is over its run's own k" if len(set(ks)) > 1 else ""
    table = Table(title=f"groupwise compare (training metrics: mean of the last "
                        f"{' / '.join(map(str, counts))} step{'s' * (counts != [1])}{k_note})")
    table.add_column("metric", justify="left")
    for s in summaries:
        table.add_column(str(s["run"]), justify="right")
    for c in cols[1:]:
        table.add_row(c, *[_fmt(s.get(c)) for s in summaries])
    return table, summaries


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, int):  # a count (steps, tokens): no decimals
        return f"{v:,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3f}"
