"""``groupwise export``: a trained model written where other tools read it."""

from __future__ import annotations

import shutil
from pathlib import Path

from groupwise.log import follow_umask
from groupwise.models.load import load_pretrained, save_model
from groupwise.models.lora import is_adapter_dir


def export(model_dir: str | Path, out: str | Path, dtype: str = "float32") -> list[Path]:
    """Write a trained model where other tools read it: for an adapter, ``out/adapter`` (as saved) and
    ``out/merged`` (the base with the adapter merged in, a plain transformers model); for a full model,
    ``out/model``. Returns the directories written; their files have the mode the umask gives a new file
    (safetensors writes 0600, and a checkpoint saved before that was fixed holds 0600 files)."""
    model_dir, out = Path(model_dir), Path(out)
    if not is_adapter_dir(model_dir):
        shutil.copytree(model_dir, out / "model", dirs_exist_ok=True)
        dirs = [out / "model"]
    else:
        shutil.copytree(model_dir, out / "adapter", dirs_exist_ok=True)
        model, tokenizer = load_pretrained(model_dir, dtype)
        save_model(model.merge_and_unload(), tokenizer, out / "merged")
        dirs = [out / "adapter", out / "merged"]
    for d in dirs:
        follow_umask(d)
    return dirs
