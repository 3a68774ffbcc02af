"""A tiny Qwen2 saved as a local Hugging Face directory, with the embedded model's character tokenizer."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from groupwise.models.load import save_model
from groupwise.models.tiny import build_tokenizer


@pytest.fixture
def tiny_qwen(tmp_path):
    def make(max_positions: int = 128):
        tok = build_tokenizer()
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=max_positions, pad_token_id=tok.pad_token_id,
                                             eos_token_id=tok.eos_token_id))
        save_model(model, tok, tmp_path / "base")
        return tmp_path / "base"
    return make
