"""``groupwise inspect RUN [RUN2]``: a static, self-contained HTML report of one run or two (docs/inspect.md).

One file that opens from disk and works offline: the data (``rollouts.jsonl`` written by
``loop/record.py``, ``metrics.jsonl``, ``eval/step_*.jsonl``) is inlined as JSON, the script and the
style sheet (``data/inspect.js``, ``data/inspect.css``) inline too; nothing is fetched. The page draws the
run's curves (the metrics of ``groupwise plot``, as SVG), every recorded step's groups with each completion's
tokens coloured by a chosen per-token signal, filters and a text search, and with two runs the held-out
problems side by side with the differences highlighted. Named ``inspect_report`` so as not to shadow the
standard library's ``inspect``.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from groupwise.log import read_lines, read_metrics
from groupwise.plot import DEFAULT_METRICS

ASSETS = Path(__file__).parent / "data"
SMOOTH = 5  # the trailing moving average of `groupwise plot`


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_evals(run: Path) -> dict[int, list[dict[str, Any]]]:
    """Eval records by step, from ``<run>/eval/step_<n>.jsonl`` (``trainer.run_eval``)."""
    out = {}
    for path in (run / "eval").glob("step_*.jsonl"):
        m = re.fullmatch(r"step_(\d+)\.jsonl", path.name)
        if m:
            out[int(m.group(1))] = read_jsonl(path)
    return dict(sorted(out.items()))


def run_data(run: str | Path) -> dict[str, Any]:
    """Everything the page shows of one run directory."""
    run = Path(run)
    metrics = read_metrics(run)  # raises a one-line FileNotFoundError for a directory that is not a run
    rollouts = run / "rollouts.jsonl"
    return {"name": run.name, "dir": str(run), "metrics": metrics,
            "rollouts": [row for _, row in read_lines(rollouts)] if rollouts.exists() else [],  # torn tail skipped
            "evals": {str(k): v for k, v in read_evals(run).items()},
            "config": (run / "resolved_config.yaml").read_text() if (run / "resolved_config.yaml").exists() else ""}


def render(runs: list[dict[str, Any]]) -> str:
    """The page: one HTML document with the data, the script and the style inlined."""
    data = {"runs": runs, "curves": list(DEFAULT_METRICS), "smooth": SMOOTH}
    payload = json.dumps(data, allow_nan=False).replace("<", "\\u003c")  # no "</script>" or "<!--" in the tag
    title = html.escape(" vs ".join(r["name"] for r in runs))
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>groupwise inspect: {title}"
            f"</title>\n<style>\n{(ASSETS / 'inspect.css').read_text()}</style></head>\n<body>\n"
            f"<script type=\"application/json\" id=\"data\">{payload}</script>\n"
            f"<script>\n{(ASSETS / 'inspect.js').read_text()}</script>\n</body></html>\n")


def inspect_runs(runs: list[str | Path], out: str | Path) -> Path:
    """Write the report of ``runs`` (one or two run directories) to ``out``; returns its path."""
    if not 1 <= len(runs) <= 2:
        raise ValueError(f"inspect takes one or two runs, got {len(runs)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = [run_data(r) for r in runs]
    if len({d["name"] for d in data}) < len(data):  # two runs of one name: label them by directory
        for d in data:
            d["name"] = d["dir"]
    out.write_text(render(data))
    return out
