"""Observability: JSONL metrics (``<stage>/<name>``), TensorBoard / W&B / MLflow sinks, a rich progress bar.

``metrics.jsonl`` has one object per logged step: ``{"step": s, "time": t, "<stage>/<name>": value, ...}``.
On resume, lines after the checkpoint's step are dropped so the file continues exactly where the
checkpoint left off. W&B and MLflow are optional (``pip install groupwise[tracking]``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from groupwise.registry import ConfigError


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics (is '{run_dir}' a groupwise run directory?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Logger:
    def __init__(self, run_dir: Path, sinks: tuple[str, ...], config: dict[str, Any], resume_step: int | None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            keep = [ln for ln in self.path.read_text().splitlines()
                    if ln.strip() and json.loads(ln).get("step", 0) <= resume_step]
            self.path.write_text("".join(ln + "\n" for ln in keep))
        elif resume_step is None:
            self.path.write_text("")
        self._tb = self._wandb = self._mlflow = None
        if "tensorboard" in sinks:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=resume_step)
        if "wandb" in sinks:
            try:
                import wandb
            except ImportError:
                raise ConfigError("trainer.sinks: wandb is not installed; pip install groupwise[tracking]") from None
            self._wandb = wandb.init(project="groupwise", name=self.run_dir.name, config=config, resume="allow")
        if "mlflow" in sinks:
            try:
                import mlflow
            except ImportError:
                raise ConfigError("trainer.sinks: mlflow is not installed; pip install groupwise[tracking]") from None
            mlflow.start_run(run_name=self.run_dir.name)
            self._mlflow = mlflow

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in clean.items()}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()


class Progress:
    """A rich progress bar with live reward, accuracy, completion length and generated tokens/s.

    On a terminal it is a live bar; otherwise (CI logs, files) it prints a plain line every ~10% of the run.
    With ``enabled=False`` it prints only notes.
    """

    def __init__(self, total: int, start: int, enabled: bool, title: str = "train"):
        import sys

        self.total, self.plain = total, enabled and not sys.stdout.isatty()
        self.enabled = enabled and not self.plain
        if not self.enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self._p = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                               transient=False)
        self._task = self._p.add_task(title, total=total, completed=start, info="")
        self._p.start()

    def update(self, step: int, m: dict[str, float]) -> None:
        if not self.enabled and not (self.plain and m and (step % max(self.total // 10, 1) == 0)):
            return
        info = (f"reward {m.get('reward/mean', 0):.3f}  acc {m.get('reward/correct_frac', 0):.3f}  "
                f"len {m.get('rollout/completion_len_mean', 0):.1f}  {m.get('perf/gen_tokens_per_s', 0):,.0f} tok/s")
        if self.plain:
            print(f"step {step}/{self.total}  {info}", flush=True)
        else:
            self._p.update(self._task, completed=step, info=info)

    def callback(self, title: str):
        """A ``(i, n, loss)`` callback that shows a sub-task (e.g. the warm start) in the same display."""
        state: dict = {}

        def cb(i: int, n: int, loss: float) -> None:
            if not self.enabled:
                if self.plain and (i == 1 or i == n or i % max(n // 10, 1) == 0):
                    print(f"{title}: {i}/{n} loss {loss:.4f}", flush=True)
                return
            if "task" not in state:
                state["task"] = self._p.add_task(title, total=n, info="")
            self._p.update(state["task"], completed=i, info=f"loss {loss:.4f}")

        return cb

    def note(self, text: str) -> None:
        if self.enabled:
            self._p.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.enabled:
            self._p.stop()
