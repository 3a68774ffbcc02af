"""A run's session: its directory, resolved config, metrics logger, progress, checkpoints and signals.

Everything a driver needs around its loop, so that the loop itself only runs steps:

  open        ``<out_dir>/<name>`` is created (an existing run needs ``resume`` or ``overwrite``), the resolved
              config is written, and with ``resume`` the latest complete checkpoint is found
  restore     optimizer, scheduler, counters and every stateful part's state come back from that checkpoint
              (the weights are loaded by ``setup.build``); metric lines after its step are dropped
  save        atomic checkpoints in Hugging Face format plus the trainer state (``checkpoint.py``)
  signals     Ctrl-C / SIGTERM request a stop: the current step finishes, the run saves and exits; a second
              one aborts at once
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from groupwise import checkpoint as ckpt
from groupwise.config import RunConfig, dump, to_dict
from groupwise.log import Logger, Progress


class Session:
    def __init__(self, cfg: RunConfig, resume: bool = False, overwrite: bool = False):
        self.cfg, self.run_dir = cfg, cfg.run_dir
        self.checkpoint = ckpt.latest(self.run_dir) if resume else None
        if not resume and (self.run_dir / "metrics.jsonl").exists() and not overwrite:
            raise FileExistsError(f"{self.run_dir} already holds a run; pass --resume to continue it or --overwrite")
        if overwrite and not resume:
            shutil.rmtree(ckpt.checkpoint_dir(self.run_dir), ignore_errors=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        dump(cfg, self.run_dir / "resolved_config.yaml")
        self.progress = Progress(cfg.trainer.steps, 0, cfg.trainer.progress)
        self.progress.note(f"run {self.run_dir}" + (f" (resuming from {self.checkpoint.name})"
                                                    if self.checkpoint else ""))
        self.counters = {"gen_tokens_total": 0.0, "wall_s_total": 0.0}
        self.stop: list[int] = []
        self.logger: Logger | None = None

    def restore(self, pipeline: Any) -> int:
        """Load the checkpoint's trainer state into ``pipeline``; open the logger; return the next step."""
        start = 0
        if self.checkpoint is not None:
            state = ckpt.load_state(self.checkpoint)
            start, self.counters = state["step"], state["counters"]
            pipeline.learner.optimizer.load_state_dict(state["optimizer"])
            pipeline.learner.scheduler.load_state_dict(state["scheduler"])
            for key, part in pipeline.stateful().items():
                part.load_state_dict(state["components"][key])
        self.logger = Logger(self.run_dir, self.cfg.trainer.sinks, to_dict(self.cfg),
                             start if self.checkpoint else None)
        self.progress.update(start, {})
        return start

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Log one finished step (with the run's running totals)."""
        self.counters["gen_tokens_total"] += metrics.get("perf/gen_tokens", 0.0)
        self.counters["wall_s_total"] += metrics.get("perf/step_s", 0.0)
        metrics.update({"perf/gen_tokens_total": self.counters["gen_tokens_total"],
                        "perf/wall_s_total": self.counters["wall_s_total"]})
        assert self.logger is not None, "restore() opens the logger"
        self.logger.log(step, metrics)
        self.progress.update(step, metrics)

    def save(self, pipeline: Any, step: int) -> None:
        learner = pipeline.learner
        state = {"optimizer": learner.optimizer.state_dict(), "scheduler": learner.scheduler.state_dict(),
                 "counters": dict(self.counters),
                 "components": {k: v.state_dict() for k, v in pipeline.stateful().items()}}
        ckpt.save(self.run_dir, step, pipeline.policy, pipeline.tokenizer, state, self.cfg.trainer.keep_last)

    def save_final(self, pipeline: Any, step: int) -> None:
        """Save ``step`` unless its checkpoint already exists (the last periodic save)."""
        last = ckpt.latest(self.run_dir)
        if last is None or last.name != f"step_{step:07d}":
            self.save(pipeline, step)

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """Ctrl-C / SIGTERM set ``stopping`` (the loop finishes its step); a second one aborts."""

        def request_stop(signum, frame):
            if self.stop:
                raise KeyboardInterrupt
            self.stop.append(signum)
            self.progress.note("stopping after this step (interrupt again to abort without saving)")

        main = threading.current_thread() is threading.main_thread()  # signals can only be caught there
        handlers = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            yield
        finally:
            for sig, h in handlers.items():
                signal.signal(sig, h)

    @property
    def stopping(self) -> bool:
        return bool(self.stop)

    def interrupted(self, pipeline: Any, step: int) -> None:
        """Save after a requested stop, tell the user how to resume, and raise KeyboardInterrupt."""
        self.save(pipeline, step)
        self.progress.note(f"interrupted: saved step {step} to {ckpt.checkpoint_dir(self.run_dir)}; "
                           "resume with --resume")
        self.close()
        raise KeyboardInterrupt

    def close(self, result: dict[str, Any] | None = None) -> None:
        self.progress.close()
        if self.logger is not None:
            self.logger.close()
        if result is not None:
            (self.run_dir / "summary.json").write_text(json.dumps(result, indent=1))


def latest_model_dir(run_dir: str | Path) -> Path:
    last = ckpt.latest(Path(run_dir))
    if last is None:
        raise FileNotFoundError(f"{run_dir}: no complete checkpoint")
    return last / "model"
