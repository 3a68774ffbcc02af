"""Checkpoints: model (HF format), optimizer, scheduler, component states, RNG states, step, counters.

Each checkpoint is written to a temporary directory (``.tmp-step_*``) and renamed into place, so a kill at
any moment leaves either the previous complete checkpoint or the new one, never a torn one; temporary
directories left by a killed or failed save are removed at the next save or start. The last file written
before the rename is ``manifest.json``: the size and sha256 of every other file. ``damage`` checks a
checkpoint against it (and that its weights load and are finite), so flipped bytes, truncated or deleted
files and NaN weights are found before anything is loaded; ``newest_good`` skips such checkpoints for the
newest intact one. A checkpoint without a manifest (saved by an older groupwise) gets the structural checks
only. Only the last ``keep_last`` are kept. Disk errors while saving are one-line ``StorageError``s.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from groupwise.log import StorageError, follow_umask, fsync_dir, io_reason, to_stderr
from groupwise.models.load import save_model
from groupwise.tempdirs import remove_stale

STATE = "trainer_state.pt"
MANIFEST = "manifest.json"
REQUIRED = (STATE, "model/config.json", "model/tokenizer_config.json")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any], keep_last: int,
         weights: dict[str, Any] | None = None) -> Path:
    """Write checkpoint ``step`` atomically; ``weights`` (the whole state dict of a sharded model) replaces
    the model's own."""
    root = checkpoint_dir(run_dir)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp-step_{step:07d}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        clean_stale(run_dir)
        save_model(model, tokenizer, tmp / "model", weights)
        follow_umask(tmp / "model")  # safetensors writes 0600
        with open(tmp / STATE, "wb") as f:  # a file object: a full disk surfaces as OSError, not RuntimeError
            torch.save({**state, "step": step, "rng": rng_state()}, f)
        write_manifest(tmp)
        _swap_in(tmp, final)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = io_reason(e)
        if reason is None:
            raise
        raise StorageError(f"{final}: cannot save the checkpoint: {reason}") from None
    for old in complete(run_dir)[:-keep_last]:
        _remove(old)
    return final


def _remove(path: Path) -> None:
    """Delete a checkpoint directory; renamed to a ``.tmp-`` name first, so a kill midway leaves nothing
    that looks like a checkpoint (``clean_stale`` removes the rest)."""
    trash = path.with_name(f".tmp-old-{path.name}-{os.getpid()}")
    try:
        os.replace(path, trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


def _swap_in(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final`` (an existing ``final``, a re-saved step, is removed first)."""
    if final.exists():
        _remove(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def clean_stale(run_dir: Path) -> list[Path]:
    """Remove the temporary directories of saves that did not finish (unless their process still runs)."""
    return remove_stale(checkpoint_dir(run_dir))


def write_manifest(path: Path) -> None:
    """``manifest.json``: size and sha256 of every file under ``path`` (each fsynced on the way)."""
    files = {p.relative_to(path).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p, sync=True)}
             for p in sorted(path.rglob("*")) if p.is_file() and p.name != MANIFEST}
    with open(path / MANIFEST, "w") as f:
        json.dump({"version": 1, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path, sync: bool = False) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        if sync:
            os.fsync(f.fileno())
    return h.hexdigest()


def complete(run_dir: Path) -> list[Path]:
    """Every renamed-into-place checkpoint, oldest first (``damage`` says whether it is intact)."""
    root = checkpoint_dir(run_dir)
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and p.is_dir())


def latest(run_dir: Path) -> Path | None:
    done = complete(run_dir)
    return done[-1] if done else None


def newest_good(run_dir: Path, note: Callable[[str], None] = to_stderr) -> tuple[Path | None, list[Path]]:
    """(the newest intact checkpoint, the newer damaged ones): one note per damaged checkpoint saying why,
    and one for an intact checkpoint without a manifest. None if there are no checkpoints; a
    ``StorageError`` naming the checkpoint directory if there are some and none is intact."""
    done, skipped = complete(run_dir), []
    for path in reversed(done):
        problem = damage(path)
        if problem is None:
            if not (path / MANIFEST).exists():
                note(f"warning: {path}: no {MANIFEST} (saved by an older groupwise): its files are not verified")
            return path, skipped
        note(f"warning: skipping damaged checkpoint {path}: {problem}")
        skipped.append(path)
    if done:
        raise StorageError(f"{checkpoint_dir(run_dir)}: no intact checkpoint (all {len(done)} damaged, see above); "
                           "start over with --overwrite")
    return None, []


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to ``damaged-step_*`` (kept for inspection, no longer a checkpoint)."""
    dest, n = path.with_name(f"damaged-{path.name}"), 0
    while dest.exists():
        n += 1
        dest = path.with_name(f"damaged-{path.name}-{n}")
    try:
        os.replace(path, dest)
    except OSError as e:
        raise StorageError(f"{path}: cannot move the damaged checkpoint aside: {io_reason(e) or e}") from None
    return dest


def damage(path: Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be trusted, or None if it is intact: every file the manifest
    lists, with its size and sha256 (without a manifest: the state must load), the required files, and
    weights that load and are finite (NaN / inf weights are damage: a resumed run could not recover)."""
    path = Path(path)
    manifest = (path / MANIFEST).exists()
    problem = _check_manifest(path) if manifest else None
    adapter = (path / "model" / "adapter_config.json").is_file()  # a LoRA run saves its adapter, not the model
    for rel in REQUIRED:
        rel = "model/adapter_config.json" if adapter and rel == "model/config.json" else rel
        if problem is None and not (path / rel).is_file():
            problem = f"{rel} is missing"
    if problem is None and not manifest:
        problem = _check_state(path)
    return problem or weights_damage(path / "model", values=True, base=path)


def _check_manifest(path: Path) -> str | None:
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
        entries = [(rel, int(meta["bytes"]), str(meta["sha256"])) for rel, meta in files.items()]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__}: {str(e)[:80]})"
    for rel, size, sha in entries:
        p = path / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != size:
            return f"{rel} is {p.stat().st_size} bytes, {MANIFEST} says {size} (truncated or rewritten)"
        if _sha256(p) != sha:
            return f"{rel}: sha256 differs from {MANIFEST} (the file changed after it was saved)"
    return None


def _check_state(path: Path) -> str | None:
    try:
        state = torch.load(path / STATE, weights_only=False, map_location="cpu")
    except Exception as e:  # garbage, truncated or empty files fail in pickle, zipfile or torch itself
        return f"{STATE} does not load ({_first_line(e)})"
    return None if isinstance(state, dict) and "step" in state else f"{STATE} holds no trainer state"


def weights_damage(model_dir: Path, values: bool, base: Path | None = None) -> str | None:
    """Why the ``*.safetensors`` weights in ``model_dir`` cannot be used, or None: each file must open
    (a truncated file fails on its header) and, with ``values``, every floating tensor must be finite.
    Files are named relative to ``base`` (default: as given)."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return f"{model_dir.relative_to(base) if base else model_dir}/*.safetensors: no weights"
    from safetensors import safe_open

    for f in files:
        name = f.relative_to(base) if base else f
        try:
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys() if values else ():
                    t = sf.get_tensor(key)
                    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                        return f"{name}: tensor '{key}' holds NaN or inf values"
        except Exception as e:  # safetensors raises its own error type for a bad header or buffer
            return f"{name} does not load ({_first_line(e)})"
    return None


def model_dir_damage(model_dir: Path) -> str | None:
    """For a model directory given directly (``groupwise eval DIR``): the whole checkpoint's ``damage`` if
    it is a checkpoint's ``model/`` (it has a manifest), else whether its safetensors files open (cheap: the
    headers only). A directory without safetensors files is left to the loader."""
    model_dir = Path(model_dir)
    if (model_dir.parent / MANIFEST).is_file():
        problem = damage(model_dir.parent)
        return f"{model_dir.parent}: damaged checkpoint: {problem}" if problem else None
    if not any(model_dir.glob("*.safetensors")):
        return None
    return weights_damage(model_dir, values=False)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:120]}" if text else type(e).__name__


def load_state(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(Path(path) / STATE, weights_only=False)
    except Exception as e:  # checked by ``damage`` first; this is the last line of defence
        raise StorageError(f"{Path(path) / STATE}: does not load ({_first_line(e)})") from None
    set_rng_state(state["rng"])
    return state


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
