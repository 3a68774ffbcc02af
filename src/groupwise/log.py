"""Observability: JSONL metrics (``<stage>/<name>``), TensorBoard / W&B / MLflow sinks, a rich progress bar.

``metrics.jsonl`` has one object per logged step: ``{"step": s, "time": t, "<stage>/<name>": value, ...}``.
On resume, lines after the checkpoint's step are dropped so the file continues exactly where the
checkpoint left off. W&B and MLflow are optional (``pip install groupwise[tracking]``).

Run-directory files are never rewritten in place: ``write_atomic`` writes a temporary file next to the
target, fsyncs it and renames it over the target, so a kill or a full disk leaves the old file or the new
one. Readers skip a torn last line (a kill or a full disk mid-append) with a note and refuse a corrupt line
elsewhere, naming file:line. Disk errors become one-line ``StorageError``s naming the path and the cause.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from groupwise.registry import ConfigError


class StorageError(ConfigError):
    """A run-directory file cannot be written or read back (disk full, read-only, damaged); one line naming
    the path and the cause."""


def to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def io_reason(e: BaseException) -> str | None:
    """``"no space left on device (ENOSPC)"`` for an OS-level failure anywhere in ``e``'s chain (also one
    that a library wrapped into its own error, e.g. safetensors' ``... (os error 28)``), else None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        code = e.errno if isinstance(e, OSError) else None
        if code is None and (m := re.search(r"os error (\d+)", str(e))):
            code = int(m.group(1))
        if code:
            return f"{os.strerror(code).lower()} ({errno.errorcode.get(code, code)})"
        e = e.__cause__ or e.__context__
    return None


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a temporary file in the same directory, fsync, ``os.replace``.
    Temporary files left by a killed writer are removed first."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        for stale in path.parent.glob(f".{path.name}.tmp-*"):
            stale.unlink(missing_ok=True)
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise StorageError(f"{path}: cannot write: {io_reason(e) or e}") from None
    fsync_dir(path.parent)


def file_mode() -> int:
    """The mode ``open`` gives a new file: 0o666 less the umask (read from /proc, since ``os.umask`` can only be
    read by setting it; the fallback sets 0o077 for that instant, never a laxer mask)."""
    try:
        mask = int(re.search(r"^Umask:\s*([0-7]+)$", Path("/proc/self/status").read_text(), re.M).group(1), 8)
    except (OSError, AttributeError):
        mask = os.umask(0o077)
        os.umask(mask)
    return 0o666 & ~mask


def follow_umask(path: Path) -> None:
    """Give every file under ``path`` the mode any new file gets (``file_mode``): safetensors writes its files
    0600 (a temporary file renamed into place), which keeps a checkpoint, an export or a shared cache from the
    users and groups the umask lets read everything else."""
    mode = file_mode()
    for p in Path(path).rglob("*"):
        if p.is_file() and not p.is_symlink():
            p.chmod(mode)


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (best effort: not every file system can fsync a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: Path, note: Callable[[str], None] = to_stderr) -> list[tuple[str, dict[str, Any]]]:
    """(raw line, parsed object) for every line of a JSONL file of ``{"step": int, ...}`` objects.

    A torn last line (the writer was killed or the disk filled mid-line) is skipped with one note; a bad line
    elsewhere is a ``StorageError`` naming file:line."""
    lines = Path(path).read_bytes().split(b"\n")
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    out: list[tuple[str, dict[str, Any]]] = []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        text, row = _parse_line(ln)
        if row is not None:
            out.append((text, row))
        elif i == last:
            note(f"warning: {path}:{i + 1}: skipped a torn last line ({len(ln)} bytes; an interrupted write)")
        else:
            raise StorageError(f"{path}:{i + 1}: corrupt line (expected a JSON object with an integer 'step'): "
                               f"{ln[:60]!r}")
    return out


def _parse_line(ln: bytes) -> tuple[str, dict[str, Any] | None]:
    try:
        text = ln.decode()
        row = json.loads(text)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return "", None
    ok = isinstance(row, dict) and isinstance(row.get("step"), int)
    return text, row if ok else None


def read_metrics(run_dir: str | Path, note: Callable[[str], None] = to_stderr) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics (is '{run_dir}' a groupwise run directory?)")
    return [row for _, row in read_lines(path, note)]


def eval_k(run_dir: str | Path) -> int | None:
    """The run's ``eval.k`` (samples per held-out problem behind ``eval/mean_at_k``), from its
    ``resolved_config.yaml``; None when the run has none (a bare metrics log)."""
    import yaml

    path = Path(run_dir) / "resolved_config.yaml"
    try:
        k = (yaml.safe_load(path.read_text()) or {}).get("eval", {}).get("k")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return int(k) if isinstance(k, int) else None


class Logger:
    def __init__(self, run_dir: Path, sinks: tuple[str, ...], config: dict[str, Any], resume_step: int | None,
                 note: Callable[[str], None] = to_stderr):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            keep = [text for text, row in read_lines(self.path, note) if row["step"] <= resume_step]
            write_atomic(self.path, "".join(ln + "\n" for ln in keep))
        elif resume_step is None:
            write_atomic(self.path, "")
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
        try:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        except OSError as e:
            raise StorageError(f"{self.path}: cannot append step {step}: {io_reason(e) or e}") from None
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


WARM_START = "building the warm start (SFT)"
"""The warm start's progress line: shown only while it is built (a cached or packaged one shows nothing)."""


class Progress:
    """A rich progress bar with live reward, accuracy, completion length and generated tokens/s.

    On a terminal it is a live bar; otherwise (CI logs, files) it prints a plain line every ~10% of the run.
    With ``enabled=False`` it prints only notes.
    """

    def __init__(self, total: int, start: int, enabled: bool, title: str = "train", console=None):
        import sys

        tty = console.is_terminal if console is not None else sys.stdout.isatty()  # console: rich's (tests)
        self.total, self.plain = total, enabled and not tty
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
        from rich.table import Column

        def whole(width: int) -> Column:  # a narrow terminal shrinks the bar and cuts the info, never these
            return Column(no_wrap=True, min_width=width)

        self._p = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(),
                               MofNCompleteColumn(table_column=whole(2 * len(str(total)) + 1)),
                               TimeElapsedColumn(table_column=whole(7)),
                               TimeRemainingColumn(table_column=whole(7)),
                               TextColumn("{task.fields[info]}",
                                          table_column=Column(no_wrap=True, overflow="ellipsis")),
                               transient=False, console=console)
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
