"""``groupwise plot RUN...``: PNG curves overlaying runs, one panel per metric.

Training metrics are smoothed with a trailing moving average (``smooth`` steps); eval metrics are drawn as
markers at the steps they were measured. The x axis is the step, or any cumulative metric such as
``perf/gen_tokens_total`` or ``perf/wall_s_total``.
"""

from __future__ import annotations

from pathlib import Path

from groupwise.log import eval_k, read_metrics
from groupwise.registry import ConfigError

DEFAULT_METRICS = ("reward/correct_frac", "rollout/completion_len_mean", "eval/mean_at_k", "eval/len_mean")


def _smooth(ys: list[float], w: int) -> list[float]:
    out, acc = [], []
    for y in ys:
        acc.append(y)
        acc = acc[-w:]
        out.append(sum(acc) / len(acc))
    return out


def plot(runs: list[str], out: str | Path, metrics: tuple[str, ...] | None = None, x: str = "step",
         smooth: int = 5) -> Path:
    """Write the PNG; ``metrics=None`` draws those of ``DEFAULT_METRICS`` that the runs logged. An unknown
    metric or x axis is a ``ConfigError`` listing the available ones (nothing is written)."""
    names = [Path(r).name for r in runs]
    labels = names if len(set(names)) == len(names) else [str(r) for r in runs]  # same-named runs: full paths
    ks = [eval_k(r) for r in runs]
    if len({k for k in ks if k is not None}) > 1:  # mean_at_k of different k under one title: each label says its k
        labels = [f"{label} (eval.k {k if k is not None else '?'})" for label, k in zip(labels, ks)]
    data = {label: read_metrics(r) for label, r in zip(labels, runs)}
    metrics = _check_names(data, metrics, x)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def _check_names(data: dict[str, list[dict]], metrics: tuple[str, ...] | None, x: str) -> tuple[str, ...]:
    """The metrics to draw; every one must be logged by some run and the x axis by every run."""
    logged = {k for rows in data.values() for r in rows for k in r} - {"step", "time"}
    available = ", ".join(sorted(logged)) or "none (no steps logged)"
    if metrics is None:
        metrics = tuple(m for m in DEFAULT_METRICS if m in logged)
        if not metrics:
            raise ConfigError(f"plot: none of the default metrics ({', '.join(DEFAULT_METRICS)}) was logged; "
                              f"pass --metrics, available: {available}")
    unknown = [m for m in metrics if m not in logged]
    if unknown:
        raise ConfigError(f"plot --metrics: unknown metric(s) {', '.join(map(repr, unknown))}; available: {available}")
    for name, rows in data.items():
        if x != "step" and not any(x in r for r in rows):
            have = sorted({k for r in rows for k in r if k.endswith("_total")})
            raise ConfigError(f"plot --x: run '{name}' never logged '{x}'; use step or a cumulative metric it "
                              f"logged: {', '.join(have) or 'none'}")
    return metrics


def _x_values(rows: list[dict], x: str) -> list[float | None]:
    """x for every row; eval rows (no training metrics) take the x of the training row at their step."""
    if x == "step":
        return [float(r["step"]) for r in rows]
    by_step = {r["step"]: r[x] for r in rows if x in r}
    by_step.setdefault(0, 0.0)
    return [by_step.get(r["step"]) for r in rows]
