"""``groupwise plot RUN...``: PNG curves overlaying runs, one panel per metric.

Training metrics are smoothed with a trailing moving average (``smooth`` steps); eval metrics are drawn as
markers at the steps they were measured. The x axis is the step, or any cumulative metric such as
``perf/gen_tokens_total`` or ``perf/wall_s_total``.
"""

from __future__ import annotations

from pathlib import Path

from groupwise.log import read_metrics

DEFAULT_METRICS = ("reward/correct_frac", "rollout/completion_len_mean", "eval/mean_at_k", "eval/len_mean")


def _smooth(ys: list[float], w: int) -> list[float]:
    out, acc = [], []
    for y in ys:
        acc.append(y)
        acc = acc[-w:]
        out.append(sum(acc) / len(acc))
    return out


def plot(runs: list[str], out: str | Path, metrics: tuple[str, ...] = DEFAULT_METRICS, x: str = "step",
         smooth: int = 5) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {Path(r).name: read_metrics(r) for r in runs}
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for name, rows in data.items():
            xs_map = _x_values(rows, x)
            pts = [(xs_map[i], r[metric]) for i, r in enumerate(rows) if metric in r and xs_map[i] is not None]
            if not pts:
                continue
            xs, ys = zip(*pts)
            if metric.startswith("eval/"):
                ax.plot(xs, ys, marker="o", label=name)
            else:
                ax.plot(xs, _smooth(list(ys), smooth), label=name)
        ax.set_title(metric)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _x_values(rows: list[dict], x: str) -> list[float | None]:
    """x for every row; eval rows (no training metrics) take the x of the training row at their step."""
    if x == "step":
        return [float(r["step"]) for r in rows]
    by_step = {r["step"]: r[x] for r in rows if x in r}
    by_step.setdefault(0, 0.0)
    return [by_step.get(r["step"]) for r in rows]
