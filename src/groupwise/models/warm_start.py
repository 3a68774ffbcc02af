"""The SFT warm start for embedded models, cached on disk and keyed by everything that shapes it.

Key = sha256 of (preset, task name + task config, steps, lr, batch, seed 0, format version). The cache
lives in ``$GROUPWISE_CACHE`` (default ``~/.cache/groupwise``)/warm_start/<preset>-<key>; it is written to a
temporary directory and renamed into place, under a file lock, so concurrent runs build it once.
The warm start uses a fixed seed: RL seeds vary the RL run, not the starting policy.
Loss: token-mean cross-entropy on completion tokens (EOS included); AdamW (0.9, 0.95), linear warm-up
over 10 steps then cosine decay; fresh procedural traces every step.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch

from groupwise.config import ModelConfig, to_dict
from groupwise.models.forward import completion_logprobs, pack
from groupwise.tasks.base import render_prompt

VERSION = 1


def cache_root() -> Path:
    return Path(os.environ.get("GROUPWISE_CACHE", Path.home() / ".cache" / "groupwise"))


def warm_start_key(preset: str, task, cfg: ModelConfig) -> str:
    blob = json.dumps({"v": VERSION, "preset": preset, "task": task.name, "task_cfg": to_dict(task.cfg),
                       "steps": cfg.warm_start_steps, "lr": cfg.warm_start_lr, "batch": cfg.warm_start_batch},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_warm_start(preset: str, task, cfg: ModelConfig, progress=None) -> Path:
    if task is None or not hasattr(task, "sft_examples"):
        raise ValueError("a warm start needs a task with reference traces (sft_examples)")
    root = cache_root() / "warm_start"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{preset}-{warm_start_key(preset, task, cfg)}"
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "config.json").exists():
            return final
        if progress is not None:  # say why this run is slow once
            print(f"building the warm start for this config ({cfg.warm_start_steps} SFT steps); it will be cached "
                  f"in {final}", flush=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
        try:
            model, tokenizer = sft(preset, task, cfg, progress)
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            (tmp / "warm_start.json").write_text(json.dumps({"preset": preset, "task": to_dict(task.cfg),
                                                            "steps": cfg.warm_start_steps}, indent=1))
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def sft(preset: str, task, cfg: ModelConfig, progress=None):
    from groupwise.models import tiny

    tokenizer = tiny.build_tokenizer()
    model = tiny.build_model(preset, tokenizer, seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warm_start_lr, betas=(0.9, 0.95), weight_decay=0.0)
    steps = cfg.warm_start_steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * s / steps)).item()))
    rng = random.Random(0)
    for step in range(steps):
        examples = task.sft_examples(rng, cfg.warm_start_batch)
        prompts = [torch.tensor(tokenizer.encode(render_prompt(p, tokenizer), add_special_tokens=False))
                   for p, _ in examples]
        completions = [torch.tensor(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])
                       for _, text in examples]
        packed = pack(prompts, completions, tokenizer.pad_token_id)
        logprobs = completion_logprobs(model, packed).logprobs
        loss = -(logprobs * packed.completion_mask).sum() / packed.completion_mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if progress is not None:
            progress(step + 1, steps, loss.item())
    model.eval()
    return model, tokenizer
