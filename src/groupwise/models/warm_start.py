"""The SFT warm start: packaged for every embedded recipe's setting, else built and cached; for a pretrained
model, built on request (``model.warm_start: true``) and cached.

Key = sha256 of (preset, task name, the task config's fields that differ from their defaults, steps, lr,
batch, format version): adding a field with a default to a task config does not change existing keys, and a
field declared ``metadata={"warm_start": False}`` (it changes RL problems, not the SFT traces: the lab's
``label_noise``) is left out, so such a setting shares the clean setting's warm start. The
cache lives in ``$GROUPWISE_CACHE`` (default ``~/.cache/groupwise``)/warm_start/<preset>-<key>; it is written
to a temporary directory and renamed into place, under a file lock, so concurrent runs build it once.

Packaged warm starts: the package ships the warm start of every setting its recipes use
(``groupwise/data/warm_starts/<preset>-<key>/``, ~3.1 MB each, the same bytes a build on the reference
machine writes), so the first run of a recipe starts RL at once; a missing key is copied from there into the
cache, else built. ``python -m groupwise.models.warm_start recipes/*.yaml`` rebuilds and packages them
(``tests/test_warm_starts_packaged.py`` fails when a recipe's setting has no packaged warm start).

A pretrained model (``model.path`` a model directory, a ``.gguf`` or an alias) gets a warm start only when the
recipe says ``model.warm_start: true`` (the default ``auto`` leaves it as it is): the same loop on the task's
reference traces, training a LoRA adapter (seed 0) when ``model.lora`` is set (else every weight), the adapter
then merged into the weights and saved as a plain model directory (``<name>-<key>``; the key adds the source path
and ``model.lora``), so the RL run starts a fresh adapter on top of it and its reference model is the warmed-up
policy. Use it as a format warm-up: a small model that cannot yet write a task's traces leaves RL no signal.

The warm start uses a fixed seed: RL seeds vary the RL run, not the starting policy. Its traces are drawn from the
task of the run that builds it, and the key has no seed: for a task whose train sequence depends on the run's seed
(reasoning-gym), every seed shares the first builder's warm start (build it with the seed you report, e.g. 0).
Loss: token-mean cross-entropy on completion tokens (EOS included); AdamW (0.9, 0.95), linear warm-up
over 10 steps then cosine decay; fresh procedural traces every step.

A build is its own phase on the run's screen (``BUILDING``, with its SFT steps counted: ~20 min for the real-model
lab's, on first use only); a cached or packaged warm start shows nothing.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import sys
from importlib import resources
from pathlib import Path

import torch

from groupwise.config import ModelConfig, to_dict
from groupwise.log import Progress, advance, follow_umask, lines
from groupwise.models.forward import completion_logprobs, pack
from groupwise.tasks.base import render_prompt

VERSION = 2  # 2: the key hashes only non-default task fields
MICRO_ROWS = 4  # a pretrained model's SFT rows per forward / backward pass
BUILDING = "building the warm start (first use, cached after): SFT steps"
"""The screen's phase while a warm start is built, counting its SFT steps."""
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "chat_template.jinja", "warm_start.json")


def cache_root() -> Path:
    return Path(os.environ.get("GROUPWISE_CACHE", Path.home() / ".cache" / "groupwise"))


def packaged_root() -> Path:
    return Path(str(resources.files("groupwise") / "data" / "warm_starts"))


def non_default(cfg) -> dict:
    """The config's fields whose values differ from the dataclass defaults (required fields always), without
    those declared ``metadata={"warm_start": False}``."""
    out = {}
    for f in dataclasses.fields(cfg):
        if not f.init or f.metadata.get("warm_start", True) is False:
            continue
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        value = getattr(cfg, f.name)
        if not has_default or value != default:
            out[f.name] = to_dict(value)
    return out


def warm_start_key(preset: str, task, cfg: ModelConfig, source: Path | None = None) -> str:
    """``source``: a pretrained model's directory (its path and ``model.lora`` join the key; embedded presets keep
    their keys, which the packaged warm starts are named by)."""
    fields = {"v": VERSION, "preset": preset, "task": task.name, "task_cfg": non_default(task.cfg),
              "steps": cfg.warm_start_steps, "lr": cfg.warm_start_lr, "batch": cfg.warm_start_batch}
    if source is not None:
        fields.update(source=str(source), lora=to_dict(cfg.lora))
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def ensure_warm_start(preset: str, task, cfg: ModelConfig, progress=None, source: Path | None = None,
                      screen: Progress | None = None) -> Path:
    """The warm start's model directory (built on a miss, a ``BUILDING`` phase of ``screen``: the run's; None:
    plain lines, ``log.lines``). ``preset``: the embedded preset, or a pretrained model's name (``model.path``)
    with ``source`` its resolved directory. ``progress``: ``sft``'s per-step callback (a script's monitor)."""
    if task is None or not hasattr(task, "sft_examples"):
        raise ValueError("a warm start needs a task with reference traces (sft_examples)")
    root = cache_root() / "warm_start"
    name = preset if source is None else re.sub(r"[^A-Za-z0-9._-]+", "_", Path(preset).name)
    final = root / f"{name}-{warm_start_key(preset, task, cfg, source)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{final.name}.lock", "w")  # noqa: SIM115 (held while the warm start is made)
    except OSError as e:  # a read-only cache: a packaged warm start is read from the package itself
        if (final / "config.json").exists():
            return final
        if (packaged_root() / final.name / "model.safetensors").is_file():
            return packaged_root() / final.name
        from groupwise.log import StorageError, io_reason

        raise StorageError(f"GROUPWISE_CACHE={cache_root()}: cannot write the warm start cache "
                           f"({io_reason(e) or e.strerror or e}); set GROUPWISE_CACHE to a writable directory"
                           ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "config.json").exists():
            return final
        for stale in root.glob(f".tmp-{final.name}-*"):  # a killed build of this entry (we hold its lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".tmp-{final.name}-{os.getpid()}"
        tmp.mkdir()
        try:
            packaged = packaged_root() / final.name
            if source is None and (packaged / "model.safetensors").is_file():
                for name in FILES:
                    if (packaged / name).is_file():
                        shutil.copyfile(packaged / name, tmp / name)
            else:
                with (screen or lines()).phase(BUILDING, cfg.warm_start_steps,
                                               f"{cfg.warm_start_steps} steps on {task.name}'s reference traces, "
                                               f"into {final}"):
                    model, tokenizer = sft(preset, task, cfg, progress, source)
                model.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
                (tmp / "warm_start.json").write_text(json.dumps(
                    {"preset": preset, "source": None if source is None else str(source), "task": to_dict(task.cfg),
                     "steps": cfg.warm_start_steps, "lr": cfg.warm_start_lr, "batch": cfg.warm_start_batch,
                     "lora": to_dict(cfg.lora)}, indent=1))
            follow_umask(tmp)  # safetensors writes 0600
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def sft(preset: str, task, cfg: ModelConfig, progress=None, source: Path | None = None):
    """SFT of the embedded preset from scratch, or (``source``) of a pretrained model: its LoRA adapter with
    ``model.lora``, merged into the weights at the end, else every weight. Each step done is ``log.advance``d
    (the screen's counter) and, with ``progress``, called back as ``progress(step, steps, loss)``."""
    if source is None:
        from groupwise.models import tiny

        tokenizer = tiny.build_tokenizer()
        model = tiny.build_model(preset, tokenizer, seed=0)
    else:  # a directory models/load.py has checked (and that imports this module: transformers directly here)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from groupwise.models import lora

        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, local_files_only=True)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if cfg.lora is not None:
            model = lora.wrap(model, cfg.lora, seed=0)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]  # with LoRA: the adapter's
    opt = torch.optim.AdamW(params, lr=cfg.warm_start_lr, betas=(0.9, 0.95), weight_decay=0.0)
    steps = cfg.warm_start_steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * s / steps)).item()))
    rng = random.Random(0)
    for step in range(steps):
        examples = task.sft_examples(rng, cfg.warm_start_batch)
        prompts = [torch.tensor(tokenizer.encode(render_prompt(p, tokenizer, cfg.chat_template),
                                                 add_special_tokens=False))
                   for p, _ in examples]
        completions = [torch.tensor(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])
                       for _, text in examples]
        # embedded: one pass; pretrained: micro-batches of MICRO_ROWS rows (the same loss, the batch's token mean:
        # batch 16 of ~300-token chat prompts in one pass peaked at 15 GB on SmolLM2-135M)
        rows = len(examples) if source is None else MICRO_ROWS
        n_tokens = sum(c.numel() for c in completions)
        total = 0.0
        for i in range(0, len(examples), rows):
            packed = pack(prompts[i:i + rows], completions[i:i + rows], tokenizer.pad_token_id)
            logprobs = completion_logprobs(model, packed).logprobs
            loss = -(logprobs * packed.completion_mask).sum() / n_tokens
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        advance(1)  # a step done: the screen's counter (log.py)
        if progress is not None:
            progress(step + 1, steps, total)
    if source is not None and cfg.lora is not None:
        model = model.merge_and_unload()
    model.eval()
    return model, tokenizer


def package(recipes: list[str]) -> list[Path]:
    """Build (or reuse from the cache) the warm start of every recipe's setting and copy it into the package."""
    from groupwise.config import load
    from groupwise.registry import BuildEnv

    out = []
    for recipe in recipes:
        cfg = load(recipe)
        if not (cfg.model.path.startswith("embedded:") and cfg.model.warm_start and cfg.model.warm_start_steps):
            continue
        task = cfg.task.build(BuildEnv(run=cfg, seed=cfg.seed))
        src = ensure_warm_start(cfg.model.path.split(":", 1)[1], task, cfg.model)
        dst = packaged_root() / src.name
        if not (dst / "model.safetensors").is_file():
            dst.mkdir(parents=True, exist_ok=True)
            for name in FILES:
                if (src / name).is_file():
                    shutil.copyfile(src / name, dst / name)
            print(f"packaged {dst.name} ({recipe})", flush=True)
        out.append(dst)
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)  # the thread count the packaged warm starts were built with (bit-reproducible)
    package(sys.argv[1:])
