"""Load the policy: any Hugging Face causal LM (``sources.py`` resolves ``model.path`` to a local directory:
a directory, a ``.gguf`` file, a hub id or an alias such as ``smollm2-135m-instruct``), or an embedded tiny
model.

``embedded:<preset>`` builds the tiny Llama + character tokenizer (``tiny.py``) and, when
``model.warm_start`` is on, starts from the cached SFT warm start on the task's traces (``warm_start.py``).
A local directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and nothing is downloaded; before
it loads, its parameter count (from the config, on the meta device) is checked against the memory available
(``sources.check_memory``: weights, and for full fine-tuning gradients and AdamW state). A directory that does
not load (a bad ``config.json``, a missing tokenizer) and a ``model.device`` this machine
does not have are one-line ``ConfigError``s naming the key. ``model.warm_start: true`` gives a pretrained model
a format warm-up first (SFT on the task's reference traces, cached; ``warm_start.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from groupwise.config import ModelConfig
from groupwise.log import Progress
from groupwise.models import lora, sources
from groupwise.registry import ConfigError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_pretrained(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sources.offline_by_default()
    path = sources.readable(Path(path))  # a mode-000 directory or weights file: one line with the real reason
    if lora.is_adapter_dir(path):  # a LoRA adapter (a LoRA run's checkpoint): its base, with the adapter on
        model, _ = load_pretrained(lora.base_path(path), dtype, device)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return prepare(lora.load_adapter_dir(model, path), tokenizer, dtype, device)
    if not (path / "config.json").exists():
        raise ConfigError(f"model.path: '{path}' is not a local Hugging Face model directory (no config.json); "
                          "use a local directory or embedded:lab-tiny / embedded:lab-small")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype], local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:  # bad config.json, unknown type, no tokenizer
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"model.path: '{path}' does not load as a Hugging Face causal LM "
                          f"({type(e).__name__}: {first}); allowed: a model directory saved by "
                          "save_pretrained, or embedded:lab-tiny / embedded:lab-small") from None
    return prepare(model, tokenizer, dtype, device)


def check_device(device: str) -> None:
    """``model.device`` exists on this machine (its syntax is checked when the config loads)."""
    d = torch.device(device)
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}.get(d.type)
    if available is not None and not available():
        raise ConfigError(f"model.device={device!r}: no {d.type} device on this machine; allowed: cpu"
                          + (", cuda" if torch.cuda.is_available() else ""))
    if d.type == "cuda" and d.index is not None and d.index >= torch.cuda.device_count():
        raise ConfigError(f"model.device={device!r}: this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s); allowed: cuda:0 .. cuda:{torch.cuda.device_count() - 1}")


def prepare(model, tokenizer, dtype: str, device: str):
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device=device, dtype=_DTYPES[dtype])
    return model, tokenizer


def load_model(cfg: ModelConfig, task=None, screen: Progress | None = None, seed: int = 0, train: bool = True):
    """The policy and its tokenizer, as the run config asks (see module docstring); with ``model.lora``, the
    policy carries a fresh LoRA adapter (``lora.py``), unless ``model.path`` already is an adapter.
    ``screen``: the run's (``log.Progress``), where a GGUF conversion or a warm start built on first use shows as
    its own phase (None: as plain lines).
    ``train``: the memory check counts gradients and optimizer state (false: the weights alone, for evals and
    teachers)."""
    model, tokenizer = _load_base(cfg, task, screen, train)
    if cfg.lora is not None and not lora.is_lora(model):
        model = lora.wrap(model, cfg.lora, seed)
    return model, tokenizer


def _pretrained_warm_start(cfg: ModelConfig, task, path: Path, screen: Progress | None) -> Path:
    from groupwise.models.warm_start import ensure_warm_start

    if lora.is_adapter_dir(path):
        raise ConfigError(f"model.warm_start: true with model.path '{cfg.path}', a LoRA adapter: a warm start "
                          "starts from a model's weights; allowed: model.warm_start: auto or false here")
    return ensure_warm_start(cfg.path, task, cfg, source=path, screen=screen)


def warm_start_dir(cfg: ModelConfig, task, screen: Progress | None = None) -> Path | None:
    """The directory of the warm start ``cfg`` starts from on ``task`` (built on a cache miss), embedded or
    pretrained; None where it has none (``cfg.warm_starts``). For a driver whose workers should share one warm start
    (FGRPO's clients: ``methods/fgrpo/federated.py``)."""
    if not cfg.warm_starts:
        return None
    if cfg.path.startswith("embedded:"):
        from groupwise.models.warm_start import ensure_warm_start

        return ensure_warm_start(cfg.path.split(":", 1)[1], task, cfg, screen=screen)
    return _pretrained_warm_start(cfg, task, sources.resolve(cfg.path, screen), screen)


def _load_base(cfg: ModelConfig, task, screen: Progress | None, train: bool = True):
    check_device(cfg.device)
    if not cfg.path.startswith("embedded:"):
        path = sources.resolve(cfg.path, screen)
        n = None if lora.is_adapter_dir(path) else sources.count_params(path)
        if n is not None:
            per_param = sources.training_bytes_per_param(cfg.dtype, cfg.lora is not None or not train)
            what = f"{'training' if train else 'loading'} '{cfg.path}' in {cfg.dtype}"
            sources.check_memory(n, per_param, what, "model.path", cfg.device)
        if cfg.warm_starts:  # a format warm-up (SFT): model.warm_start true, steps > 0
            path = _pretrained_warm_start(cfg, task, path, screen)
        return load_pretrained(path, cfg.dtype, cfg.device)
    from groupwise.models import tiny

    preset = cfg.path.split(":", 1)[1]
    if preset not in tiny.PRESETS:
        raise ConfigError(f"model.path: unknown embedded preset '{preset}'; valid: "
                          + ", ".join(f"embedded:{p}" for p in tiny.PRESETS))
    if cfg.warm_starts:  # auto or true, steps > 0
        from groupwise.models.warm_start import ensure_warm_start

        return load_pretrained(ensure_warm_start(preset, task, cfg, screen=screen), cfg.dtype, cfg.device)
    if cfg.lora is not None:
        raise ConfigError(f"model.lora with {cfg.path} and no warm start: the adapter needs saved base weights to "
                          "refer to; allowed: model.warm_start: true (with warm_start_steps > 0) or a model directory")
    tokenizer = tiny.build_tokenizer()
    return prepare(tiny.build_model(preset, tokenizer), tokenizer, cfg.dtype, cfg.device)


def save_model(model, tokenizer, path: str | Path, state_dict: dict | None = None) -> None:
    """Save in plain Hugging Face format (safetensors), loadable by transformers and vLLM (a LoRA policy saves
    its adapter only; ``lora.export`` merges it). ``state_dict``: the whole weights of a sharded model."""
    extra = {} if state_dict is None else {"state_dict": state_dict}
    model.save_pretrained(path, safe_serialization=True, **extra)
    tokenizer.save_pretrained(path)
