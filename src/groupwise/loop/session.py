"""A run's session: its directory, resolved config, metrics logger, progress, checkpoints and signals.

Everything a driver needs around its loop, so that the loop itself only runs steps:

  lock        ``<run>/.lock`` is held (an exclusive ``flock``) while the run is open, with the owner's pid in it:
              a second process on the same run (a second ``--resume`` or ``--overwrite``) is refused in one line
              naming the owner; the kernel frees the lock of a dead process (SIGKILL), so it is taken over.
              Taking it is atomic (``take_lock``)
  open        ``<out_dir>/<name>`` is created (an existing run needs ``resume`` or ``overwrite``; a resumed run
              must keep its settings except ``RESUMABLE`` ones such as ``trainer.steps``), the resolved
              config is written (atomically), temporary directories of unfinished saves are removed, and with
              ``resume`` the newest intact checkpoint is found: newer damaged ones are named with the reason
              and moved aside to ``damaged-step_*`` (``checkpoint.damage``); ``setup.build`` and ``restore``
              load only that verified checkpoint
  restore     optimizer, scheduler, counters and every stateful part's state come back from that checkpoint
              (the weights are loaded by ``setup.build``); metric lines after its step are dropped
  save        atomic checkpoints in Hugging Face format plus the trainer state (``checkpoint.py``)
  signals     Ctrl-C / SIGTERM request a stop: the current step finishes, the run saves and exits; a second
              one aborts at once
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from groupwise import checkpoint as ckpt
from groupwise.config import RunConfig, diff, load, to_dict
from groupwise.log import Logger, Progress, StorageError, io_reason, read_metrics, to_stderr, write_atomic
from groupwise.loop.distributed import agree, check_in_sync
from groupwise.registry import ConfigError

CONFIG = "resolved_config.yaml"
LOCK = ".lock"
SECTIONS = ("task", "model", "rollout", "reward", "eval")  # what ``groupwise eval RUN`` reads from it
RESUMABLE = ("trainer.steps", "trainer.save_every", "trainer.keep_last", "trainer.progress", "trainer.sinks",
             "trainer.threads", "trainer.record_groups", "eval.", "out_dir", "name", "rollout.workers",
             "rollout.async_timeout_s", "driver.round_timeout_s")
"""Keys a resumed run may change (prefixes); with a cosine or linear schedule, ``trainer.steps`` also
changes the rest of the schedule. ``rollout.workers`` changes no sample (``loop/workers.py``); ``rollout.shards``
does, so it stays. ``rollout.async_timeout_s`` and FGRPO's ``driver.round_timeout_s`` change no sample either: a
run one stopped resumes with a longer one."""


FORWARD_S = 2.0  # under torchrun: a second signal this soon after the first is the launcher's forward of it


class Session:
    """``main=False`` (the other ranks of a multi-process run): nothing is written, the checkpoint to resume
    from is only looked up (rank 0 has opened the directory and set damaged checkpoints aside first)."""

    def __init__(self, cfg: RunConfig, resume: bool = False, overwrite: bool = False, main: bool = True):
        self.cfg, self.run_dir, self.main = cfg, cfg.run_dir, main
        if main:
            take_lock(self.run_dir)
        if main and not resume and (self.run_dir / "metrics.jsonl").exists() and not overwrite:
            raise FileExistsError(f"{self.run_dir} already holds a run; pass --resume to continue it or --overwrite")
        k = cfg.rollout.max_async_level
        self.progress = Progress(cfg.trainer.steps, 0, cfg.trainer.progress and main, async_level=k)
        if not main:
            self.progress.note = lambda message: None  # rank 0 says it
        if main:
            if resume and not (self.run_dir / "metrics.jsonl").exists():  # a restart loop's first launch
                self.progress.note(f"--resume: nothing to resume at {self.run_dir} (no run there yet); starting "
                                   "a fresh run")
            if resume:
                self._same_settings()
            self._open_dir(fresh=overwrite and not resume)
        self.checkpoint = self._find_checkpoint() if resume else None
        self.progress.note(f"run {self.run_dir}" + (f" (resuming from {self.checkpoint.name})"
                                                    if self.checkpoint else "")
                           + (f"; asynchronous: rollouts sampled up to {k} policy version{'s' * (k > 1)} behind "
                              f"(rollout.max_async_level={k})" if k else ""))
        self.counters = {"gen_tokens_total": 0.0, "wall_s_total": 0.0}
        self.stop: list[int] = []
        self.logger: Logger | None = None

    def _open_dir(self, fresh: bool) -> None:
        """Create the run directory, write the resolved config, remove unfinished saves."""
        try:
            if fresh:
                shutil.rmtree(ckpt.checkpoint_dir(self.run_dir), ignore_errors=True)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"{self.run_dir}: cannot create the run directory: {io_reason(e) or e}") from None
        write_atomic(self.run_dir / CONFIG, yaml.safe_dump(to_dict(self.cfg), sort_keys=False))
        stale = ckpt.clean_stale(self.run_dir)
        if stale:
            self.progress.note(f"removed {len(stale)} unfinished checkpoint save(s): "
                               f"{', '.join(p.name for p in stale)}")

    def _same_settings(self) -> None:
        """A resumed run must run what its resolved config says: only the length, saving, logging and eval
        settings may change (``RESUMABLE``); anything else (seed, lr, group size, a component) is an error."""
        path = self.run_dir / CONFIG
        if not path.is_file():
            return
        try:
            before = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError):
            before = None
        if not isinstance(before, dict) or not before:
            self.progress.note(f"warning: {path} is unreadable; resuming without checking that the settings match")
            return
        with contextlib.suppress(ConfigError):  # a key since removed or renamed stays a difference
            before = load(str(path))  # keys added to the schema since the run began take their defaults: no difference
        changed = [k for k in diff(before, self.cfg) if not k.startswith(RESUMABLE)]
        if changed:
            raise ConfigError(f"{self.run_dir}: --resume with settings that differ from the run's {CONFIG}: "
                              f"{', '.join(changed)}; resume with the same settings, or start a new run (--overwrite "
                              f"or another name); only {', '.join(RESUMABLE)} may change")

    def _find_checkpoint(self) -> Path | None:
        """The newest intact checkpoint; newer damaged ones (each named with its reason) are moved aside, so
        that new saves and ``keep_last`` never count them."""
        good, damaged = ckpt.newest_good(self.run_dir, self.progress.note)
        if not self.main:  # rank 0 has named them and set them aside
            return good
        moved = [ckpt.set_aside(p).name for p in damaged]
        if moved and good is not None:
            self.progress.note(f"resuming from {good.name}; moved the damaged checkpoint(s) aside to "
                               f"{', '.join(moved)} in {ckpt.checkpoint_dir(self.run_dir)}")
        return good

    def restore(self, pipeline: Any) -> int:
        """Load the checkpoint's trainer state into ``pipeline``; open the logger; return the next step."""
        start = 0
        if self.checkpoint is not None:
            state = ckpt.load_state(self.checkpoint)
            start, self.counters = state["step"], state["counters"]
            pipeline.load_trainer_state(state)
        if self.main:
            self.logger = Logger(self.run_dir, self.cfg.trainer.sinks, to_dict(self.cfg),
                                 start if self.checkpoint else None, note=self.progress.note)
        self.progress.update(start, {})
        return start

    def logged(self, step: int) -> dict[str, dict[str, float]]:
        """What the log of a resumed run already holds for its summary: the step-0 eval (``before``) and the
        metrics of ``step``, the checkpoint's (``last``); empty entries are left out. Rank 0 only."""
        rows = read_metrics(self.run_dir, self.progress.note) if self.main else []
        before = {k: v for r in rows if r["step"] == 0 for k, v in r.items() if k.startswith("eval/")}
        last = {k: v for r in rows if r["step"] == step for k, v in r.items()
                if k not in ("step", "time") and not k.startswith("eval/")}
        return {k: v for k, v in (("before", before), ("last", last)) if v}

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Log one finished step (with the run's running totals)."""
        self.counters["gen_tokens_total"] += metrics.get("perf/gen_tokens", 0.0)
        self.counters["wall_s_total"] += metrics.get("perf/step_s", 0.0)
        metrics.update({"perf/gen_tokens_total": self.counters["gen_tokens_total"],
                        "perf/wall_s_total": self.counters["wall_s_total"]})
        if not self.main:
            return
        assert self.logger is not None, "restore() opens the logger"
        self.logger.log(step, metrics)
        self.progress.update(step, metrics)

    def log_eval(self, step: int, tag: str, metrics: dict[str, float], records: list[dict], note: str) -> None:
        """A held-out eval: its records to ``eval/<tag>.jsonl``, its metrics to the log, ``note`` to the console."""
        out = self.run_dir / "eval"
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / f"{tag}.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        assert self.logger is not None, "restore() opens the logger"
        self.logger.log(step, metrics)
        self.progress.note(note)

    def save(self, pipeline: Any, step: int) -> None:
        learner = pipeline.learner
        if not learner.sharded:  # replicas: bit-identical on every rank, or the run forked (FSDP: one copy)
            check_in_sync(pipeline.policy, step)
        weights, optimizer = learner.full_state()  # under FSDP: gathered to rank 0, every rank joins
        if not self.main:  # every rank holds the same state: rank 0 saves it
            return
        state = {**pipeline.trainer_state(optimizer), "counters": dict(self.counters)}
        ckpt.save(self.run_dir, step, pipeline.policy, pipeline.tokenizer, state, self.cfg.trainer.keep_last,
                  weights=weights)

    def save_final(self, pipeline: Any, step: int) -> None:
        """Save ``step`` unless its checkpoint already exists (the last periodic save); rank 0 decides."""
        last = ckpt.latest(self.run_dir) if self.main else None
        if agree(self.main and (last is None or last.name != f"step_{step:07d}")):
            self.save(pipeline, step)

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """Ctrl-C / SIGTERM set ``stopping`` (the loop finishes its step); a second one aborts. Under torchrun
        a Ctrl-C reaches every rank twice (the terminal's, then the launcher forwards its own), so there a
        second signal within ``FORWARD_S`` seconds of the first is the same interrupt."""
        first: list[float] = []
        launched = "TORCHELASTIC_RUN_ID" in os.environ

        def request_stop(signum, frame):
            if self.stop:
                if launched and time.monotonic() - first[0] < FORWARD_S:
                    return
                raise KeyboardInterrupt
            self.stop.append(signum)
            first.append(time.monotonic())
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
        if result is not None and self.main:
            write_atomic(self.run_dir / "summary.json", json.dumps(result, indent=1))
        if self.main:
            release_lock(self.run_dir)


def _lock_owner(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or "0") or None
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


_HELD: dict[str, int] = {}
"""The run locks this process holds: the lock file's absolute path → the descriptor its ``flock`` is on."""


def _forked_child() -> None:  # a forked worker must not keep its trainer's lock alive after the trainer dies
    for fd in _HELD.values():
        os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_forked_child)


def take_lock(run_dir: Path) -> None:
    """Own ``run_dir`` for this process: an exclusive, non-blocking ``flock`` on ``<run>/.lock``, then this pid
    written into it. Atomic: the kernel grants the ``flock`` to one process, so there is no moment (file created,
    pid not yet written) in which a second process can take the lock too; it is refused in one line. A dead
    owner's ``flock`` is gone with it (its lock is taken over); this process's own lock (an earlier session here
    that raised before closing) is kept. A lock file naming another live process whose lock holds no ``flock``
    (an older groupwise's pid lock) refuses too. Forked children do not inherit it (``_forked_child``)."""
    path = run_dir / LOCK
    key = os.path.abspath(path)
    if key in _HELD:
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    _refuse(run_dir, path, _lock_owner(path))
                if os.fstat(fd).st_ino != _inode(path):  # its owner removed it between our open and our flock
                    continue
                written = os.pread(fd, 32, 0).decode(errors="replace").strip()
                owner = int(written) if written.isdigit() else None
                if owner is not None and owner != os.getpid() and _alive(owner):
                    _refuse(run_dir, path, owner)
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                _HELD[key], fd = fd, -1
                return
            finally:
                if fd >= 0:  # not ours (refused, removed meanwhile, or an I/O error)
                    os.close(fd)
    except OSError as e:
        reason = io_reason(e) or e
        raise StorageError(f"{run_dir}: cannot create the run directory or its lock: {reason}") from None
    raise StorageError(f"{run_dir}: another process took the lock {path} at the same moment; try again")


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _refuse(run_dir: Path, path: Path, owner: int | None) -> None:
    who = f"process {owner}" if owner is not None else "another process"
    raise StorageError(f"{run_dir}: in use by {who} ({path}); wait for it to end or stop it, or use another name "
                       "(no groupwise there: delete the lock)")


def release_lock(run_dir: Path) -> None:
    """Give up this process's lock on ``run_dir`` (none held: nothing). The file goes before the ``flock``, so a
    process that opened it meanwhile sees it gone and opens the next one (``take_lock``)."""
    path = run_dir / LOCK
    fd = _HELD.pop(os.path.abspath(path), None)
    if fd is not None:
        path.unlink(missing_ok=True)
        os.close(fd)


def latest_model_dir(run_dir: str | Path, note: Callable[[str], None] = to_stderr) -> Path:
    """The model of the run's newest intact checkpoint (damaged newer ones are named through ``note``)."""
    last, _ = ckpt.newest_good(Path(run_dir), note)
    if last is None:
        raise FileNotFoundError(f"{ckpt.checkpoint_dir(Path(run_dir))}: no checkpoint")
    return last / "model"


def is_run_dir(path: str | Path) -> bool:
    path = Path(path)
    return any((path / name).exists() for name in (CONFIG, "metrics.jsonl", "checkpoints"))


def run_config(run_dir: str | Path) -> Path:
    """The run's ``resolved_config.yaml``, refused (one line naming it) if it is missing, empty, not YAML or
    not a complete resolved config (every section is written, so a missing one means the file was cut)."""
    path = Path(run_dir) / CONFIG
    hint = "pass --recipe RECIPE to evaluate this run's checkpoints with that recipe's settings"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing, so the run's task and eval settings are unknown; {hint}")
    try:
        tree = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e}); {hint}") from None
    if not tree:
        raise ConfigError(f"{path}: empty (the resolved config was lost); {hint}")
    missing = [k for k in SECTIONS if not isinstance(tree, dict) or k not in tree]
    if missing:
        raise ConfigError(f"{path}: incomplete resolved config (missing: {', '.join(missing)}); {hint}")
    return path
