"""Checkpoints: model (HF format), optimizer, scheduler, component states, RNG states, step, counters.

Each checkpoint is written to a temporary directory and renamed into place, so a kill at any moment
leaves either the previous complete checkpoint or the new one, never a torn one. Only the last
``keep_last`` are kept. ``latest`` ignores incomplete (temporary) directories.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from groupwise.models.load import save_model

STATE = "trainer_state.pt"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any], keep_last: int) -> Path:
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp-step_{step:07d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tokenizer, tmp / "model")
    state = {**state, "step": step, "rng": rng_state()}
    torch.save(state, tmp / STATE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in complete(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def complete(run_dir: Path) -> list[Path]:
    root = checkpoint_dir(run_dir)
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / STATE).exists())


def latest(run_dir: Path) -> Path | None:
    done = complete(run_dir)
    return done[-1] if done else None


def load_state(path: Path) -> dict[str, Any]:
    state = torch.load(Path(path) / STATE, weights_only=False)
    set_rng_state(state["rng"])
    return state


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
