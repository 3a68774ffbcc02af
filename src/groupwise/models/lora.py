"""LoRA adapters through ``peft``: wrap the policy, reload a saved adapter, the base model behind it, export.

With ``model.lora`` set, the policy is a ``peft.PeftModel`` over the loaded base (``wrap``): only the adapter's
A / B matrices train (the optimiser sees only parameters that require grad) and B = 0 at the start, so step 0
is the base model. Everything else runs unchanged: the HF generator, the teacher-forced forward and the loss
call the PeftModel like any causal LM.

- **Checkpoints** hold the adapter, not the model: ``model/`` is what ``PeftModel.save_pretrained`` writes
  (``adapter_config.json``, ``adapter_model.safetensors``) plus the tokenizer. ``adapter_config.json`` names
  the base (``base_model_name_or_path``: the local model directory, or the embedded model's warm-start
  directory), so the adapter directory alone loads (``load_adapter_dir``) for ``groupwise eval`` and export.
  A resumed run rebuilds the base from its config and loads the adapter weights into it (``load_weights``).
- **The reference model and a frozen teacher** are the policy with its adapter switched off (``BaseView``):
  the base weights never change, so they *are* the initial policy, and no second copy is kept in memory.
  (With an adapter directory as ``model.path``, that reference is the adapter's base.)
- **Export** (``groupwise export``): the adapter as saved, and the base with the adapter merged in
  (``merge_and_unload``) as a plain transformers model any tool loads.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

import torch

from groupwise.adapters import base_model, is_lora  # noqa: F401  (lora.base_model, lora.is_lora: also used as such)
from groupwise.config import LoraConfig
from groupwise.registry import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def require_peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora needs peft, which is not installed: pip install 'groupwise[lora]'") from None
    return peft


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def wrap(model: torch.nn.Module, cfg: LoraConfig, seed: int = 0) -> torch.nn.Module:
    """``model`` with a fresh LoRA adapter (B = 0: the same function as ``model``; A drawn from ``seed``, not
    from the global RNG, so a run and its resume are reproducible)."""
    peft = require_peft()
    targets: Any = "all-linear" if cfg.target_modules == ("all-linear",) else list(cfg.target_modules)
    lcfg = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                           task_type="CAUSAL_LM")
    try:
        with _quiet(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return peft.get_peft_model(model, lcfg)
    except ValueError as e:  # no module of the model matches target_modules
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        first = (str(e).strip().splitlines() or ["no module matched"])[0][:160]
        raise ConfigError(f"model.lora.target_modules={list(cfg.target_modules)}: {first}; allowed: this model's "
                          f"linear layers ({', '.join(names)}) or [all-linear]") from None


def base_path(adapter_dir: str | Path) -> Path:
    """The base model directory an adapter directory names (refused, naming the file, if it is not local)."""
    cfg_file = Path(adapter_dir) / ADAPTER_CONFIG
    base = json.loads(cfg_file.read_text()).get("base_model_name_or_path") or ""
    if not base or not (Path(base) / "config.json").is_file():
        raise ConfigError(f"{cfg_file}: base_model_name_or_path={base!r} is not a local model directory; "
                          "allowed: an adapter saved over a model directory on this machine")
    return Path(base)


def load_adapter_dir(model: torch.nn.Module, adapter_dir: str | Path) -> torch.nn.Module:
    """``model`` (the adapter's base, loaded) with the saved adapter on it, trainable."""
    peft = require_peft()
    with _quiet():
        return peft.PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)


@contextlib.contextmanager
def _quiet():
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` (a FutureWarning per model wrapped)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def load_weights(model: torch.nn.Module, adapter_dir: str | Path) -> None:
    """Load a checkpoint's adapter weights into the run's own (freshly wrapped) LoRA policy."""
    from safetensors.torch import load_file

    peft = require_peft()
    state = load_file(str(Path(adapter_dir) / ADAPTER_WEIGHTS), device=str(next(model.parameters()).device))
    result = peft.set_peft_model_state_dict(model, state)
    stray = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]  # saved, but no such layer here
    if stray:
        raise ConfigError(f"{adapter_dir}/{ADAPTER_WEIGHTS}: adapter weights {stray[:3]} do not fit this run's "
                          "model.lora settings")


class BaseView(torch.nn.Module):
    """The LoRA policy with its adapter switched off, in eval mode and without grad: the run's initial weights,
    sharing the base's memory. The policy is held outside the module tree, so ``.eval()`` or
    ``.requires_grad_(False)`` on the view leaves the trained adapter alone."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "lora_model", model)

    @torch.no_grad()
    def forward(self, **kwargs):
        m = self.lora_model
        was = m.training
        m.eval()
        try:
            with m.disable_adapter():
                return m(**kwargs)
        finally:
            m.train(was)

    def parameters(self, recurse: bool = True):  # the device and dtype of the weights it runs
        return self.lora_model.parameters(recurse)

    def requires_grad_(self, requires_grad: bool = True) -> BaseView:  # owns no weights of its own
        return self


@torch.no_grad()
def merged_weights(model: torch.nn.Module, merge: bool = True) -> dict[str, torch.Tensor]:
    """The adapted policy as plain checkpoint weights (the base's names, each LoRA layer's ``scale·B·A`` added to
    its base weight; ``merge=False``: the base alone), for engines that hold full weights (vLLM); the policy
    itself is left untouched (no ``merge_adapter`` / ``unmerge_adapter`` round trip, which would round the base
    weights)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out = {k: v for k, v in base.state_dict().items() if "lora_" not in k}
    layers = [(n, m) for n, m in base.named_modules() if isinstance(m, LoraLayer) and not m.merged] if merge else []
    for name, module in layers:
        key = f"{name}.base_layer.weight"
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                out[key] = out[key] + module.get_delta_weight(adapter)
    return {k.replace(".base_layer.", "."): v for k, v in out.items()}
