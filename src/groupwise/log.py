"""Observability: JSONL metrics (``<stage>/<name>``), TensorBoard / W&B / MLflow / Trackio sinks, a rich progress bar.

``metrics.jsonl`` has one object per logged step: ``{"step": s, "time": t, "<stage>/<name>": value, ...}``.
On resume, lines after the checkpoint's step are dropped so the file continues exactly where the
checkpoint left off. W&B and MLflow are optional (``pip install groupwise[tracking]``), and so is Trackio
(``pip install groupwise[trackio]``; TRL's recommended tracker: a local SQLite store under ``TRACKIO_DIR``,
by default ``~/.cache/huggingface/trackio``, read by ``trackio show``; project ``groupwise``, the run directory's
name as the run, ``resume="allow"`` as for W&B). Each is imported only when ``trainer.sinks`` names it.

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
from collections.abc import Callable, Iterator
from contextvars import ContextVar
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
        self._tb = self._wandb = self._mlflow = self._trackio = None
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
        if "trackio" in sinks:
            try:
                import trackio
            except ImportError:
                raise ConfigError("trainer.sinks: trackio is not installed; pip install groupwise[trackio]") from None
            trackio.init(project="groupwise", name=self.run_dir.name, config=config, resume="allow")
            self._trackio = trackio

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
        if self._trackio is not None:
            self._trackio.log(clean, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()
        if self._trackio is not None:
            self._trackio.finish()


QUIET_S = 30.0
"""Piped output (a log file, CI): the longest a run stays silent while a phase or its steps go on."""

_ticks: ContextVar[Callable[[int], None] | None] = ContextVar("groupwise_ticks", default=None)


def advance(n: int) -> None:
    """``n`` more items of the work under way are done (a generator's finished completions): counted by the
    ``counting`` callback around it (the screen's counter, ``Progress.phase``); a no-op anywhere else."""
    if n > 0 and (tick := _ticks.get()) is not None:
        tick(n)


@contextlib.contextmanager
def counting(tick: Callable[[int], None] | None) -> Iterator[None]:
    """``advance`` calls inside the block go to ``tick`` (None: nowhere)."""
    token = _ticks.set(tick)
    try:
        yield
    finally:
        _ticks.reset(token)


@contextlib.contextmanager
def work(n: int) -> Iterator[None]:
    """A call that does ``n`` items: the ``advance``s inside it count, at most ``n``, and what they left uncounted
    is counted when it returns (an engine that reports nothing is counted at once, when it is done)."""
    outer = _ticks.get()
    if outer is None:
        yield
        return
    left = [n]

    def tick(k: int) -> None:
        k = min(k, left[0])
        left[0] -= k
        if k:
            outer(k)

    with counting(tick):
        yield
    if left[0]:
        outer(left[0])


def quiet_libraries(errors_only: bool = False) -> None:
    """Third-party progress bars off: they draw over the run's own display and fill a piped log with ``\\r``
    frames. The hub's and datasets' through their environment variables (read when they are imported; a value
    the user set is kept) and, where already imported, their switches; transformers' through its switch, and its
    GGUF conversion's ("Converting and de-quantizing GGUF tensors", a plain tqdm bar) made to follow that switch.
    ``errors_only`` (the command line): transformers logs errors only, through its switch when it is imported,
    else its ``TRANSFORMERS_VERBOSITY`` (read when it is imported), so a command that never loads a model never
    imports it. Imports only what the process has imported (the GGUF module: a part of transformers)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    if errors_only and "transformers" not in sys.modules:
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        if errors_only:
            hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # the hub's too
        with contextlib.suppress(ImportError):
            import transformers.modeling_gguf_pytorch_utils as gguf_utils

            gguf_utils.tqdm = hf_logging.tqdm  # its own tqdm import ignores transformers' switch
    elif "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()


def lines() -> Progress:
    """A screen of plain lines whatever stdout is (each phase's start, its counter when quiet, notes): for work that
    no run's screen shows, e.g. ``load_model`` called from a script or for a teacher's model."""
    return Progress(0, 0, True, plain=True)


def step_info(m: dict[str, float], async_level: int = 0) -> str:
    """The screen's numbers for a finished step, ``—`` for one it did not log; "" before the first step (never
    placeholder zeros). With asynchronous rollouts (``rollout.max_async_level`` K > 0), the staleness too."""
    if not m:
        return ""

    def num(key: str, spec: str) -> str:
        return format(m[key], spec) if key in m else "—"

    out = (f"reward {num('reward/mean', '.3f')}  acc {num('reward/correct_frac', '.3f')}  "
           f"len {num('rollout/completion_len_mean', '.1f')}  {num('perf/gen_tokens_per_s', ',.0f')} tok/s")
    return out + (f"  staleness {num('rollout/staleness_mean', '.1f')}" if async_level else "")


class Progress:
    """The run's screen: a rich progress bar with the phase under way (``phase``: loading the model, a GGUF
    conversion or a warm start built on first use, an eval with its counter, a step's generation and update) and
    the last step's reward, accuracy, completion length and generated tokens/s; with asynchronous rollouts
    (``async_level`` K > 0) K in the title and the staleness too.

    On a terminal it is a live bar. Otherwise (CI logs, files; or ``plain``) it prints plain lines: a step every
    ~10% of the run, each phase's start until the first step has finished, and whatever is under way whenever
    nothing was printed for ``QUIET_S`` seconds. With ``enabled=False`` it prints only notes. ``console``: rich's,
    where the screen goes (default stdout; ``groupwise eval --json``: stderr). ``total`` None: not known yet
    (a ``bar`` phase sets it).
    """

    def __init__(self, total: int | None, start: int, enabled: bool, title: str = "train", console=None,
                 async_level: int = 0, plain: bool = False):
        tty = not plain and (console.is_terminal if console is not None else sys.stdout.isatty())
        self.total, self.plain = total, enabled and not tty
        self.enabled = enabled and not self.plain
        self.async_level, self._metrics, self._phase = async_level, "", ("", 0, 0, False)
        self._said, self._stepped, self._console = time.monotonic(), False, console
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

        title += f" (async K={async_level})" if async_level else ""
        # the info (phase and numbers) gets what the rest leaves, a 10-column bar included, and is cut there
        self._info_column = Column(no_wrap=True, overflow="ellipsis")
        self._others = len(title) + 7 + 7 + 10 + 5  # the columns but the counter's, then their gaps
        self._p = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(),
                               MofNCompleteColumn(table_column=whole(self._counter_width())),
                               TimeElapsedColumn(table_column=whole(7)),
                               TimeRemainingColumn(table_column=whole(7)),
                               TextColumn("{task.fields[info]}", table_column=self._info_column),
                               transient=False, console=console)
        self._task = self._p.add_task(title, total=total, completed=start, info="")
        self._p.start()

    def update(self, step: int, m: dict[str, float]) -> None:
        self._metrics = step_info(m, self.async_level)
        if self.enabled:
            self._p.update(self._task, completed=step)
            self._show()
        elif self.plain and m and (step % max((self.total or 0) // 10, 1) == 0 or not self._stepped or self._quiet()):
            self._say(f"step {step}/{self.total}  {self._metrics}")
        self._stepped = self._stepped or bool(m)

    @contextlib.contextmanager
    def phase(self, label: str, total: int = 0, about: str = "", bar: bool = False) -> Iterator[None]:
        """Show ``label`` while the block runs; with ``total``, a counter of the items ``advance`` reports inside
        it; with ``bar`` too, the bar counts them instead, ``total`` its new total (``groupwise eval``: its bar is
        its completions). Piped, its start is one line (``label: about``) until the first step has finished, later
        only after ``QUIET_S`` seconds of silence; its counter, only after such a silence. The enclosing phase
        comes back when it ends."""
        if not (self.enabled or self.plain):
            yield
            return
        before, self._phase = self._phase, (label, 0, total, bar and total > 0)
        if bar and total > 0:
            self.total = total
            if self.enabled:
                self._p.update(self._task, total=total, completed=0)
        if self.plain and (not self._stepped or self._quiet()):
            self._say(f"{label}: {about}" if about else f"{label} ...")
        self._show()
        try:
            with counting(self._tick if total else None):
                yield
        finally:
            self._phase = before
            self._show()

    def _tick(self, n: int) -> None:
        label, done, total, bar = self._phase
        self._phase = (label, done + n, total, bar)
        if bar and self.enabled:
            self._p.update(self._task, completed=done + n)
        if self.plain and self._quiet():
            self._say(f"{label}: {self._counter()}")
        self._show()

    def _counter(self) -> str:
        _, done, total, _ = self._phase
        return f"{done}/{total}" if done <= total else f"{done}"

    def _counter_width(self) -> int:
        return 2 * len(str(self.total if self.total is not None else "?")) + 1

    def _info(self) -> str:
        label, _, total, bar = self._phase
        now = f"{label} ({self._counter()})" if label and total and not bar else label
        return "  ·  ".join(x for x in (now, self._metrics) if x)

    def _show(self) -> None:
        if self.enabled:  # (a resize or a new total: from here)
            self._info_column.max_width = max(12, self._p.console.width - self._others - self._counter_width())
            self._p.update(self._task, info=self._info())

    def _quiet(self) -> bool:
        return time.monotonic() - self._said >= QUIET_S

    def _say(self, text: str) -> None:
        print(text, file=self._console.file if self._console is not None else None, flush=True)
        self._said = time.monotonic()

    def note(self, text: str) -> None:
        if self.enabled:
            self._p.console.print(text)
        else:
            self._say(text)

    def close(self) -> None:
        if self.enabled:
            self._p.stop()
