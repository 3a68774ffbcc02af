"""What the stages below the models (``groupwise.models``) need to know of a model (this module imports nothing of
groupwise): whether it is a LoRA adapter over a base, and that base."""

from __future__ import annotations

from typing import Any


def is_lora(model: Any) -> bool:
    """A peft model: an adapter over a base model (``models/lora.py``)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def base_model(model: Any) -> Any:
    """The transformers model under a LoRA policy's adapter (its config, forward signature); ``model`` itself
    otherwise."""
    return model.get_base_model() if is_lora(model) else model
