"""The embedded tiny model: a standard transformers Llama config and a character tokenizer built locally.

Nothing is downloaded. The tokenizer maps every printable ASCII character to one token and keeps a few
tags (``<think>``, ``<answer>``, mode tags, hint delimiters) as single added tokens that decoding keeps.
It is saved as a normal ``tokenizer.json`` so that ``AutoTokenizer`` (and vLLM) load it from the model dir.
"""

from __future__ import annotations

import string

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, EOS = "<pad>", "<eos>"
TAGS = ("<think>", "</think>", "<answer>", "</answer>", "<NT>", "<SH>", "<LG>", "<ref>", "</ref>")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% if not loop.last %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n' }}{% endif %}"
)

PRESETS = {
    # ~0.8M parameters: fast enough for a 5-minute CPU demo
    "lab-tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=384),
    # ~4.8M parameters: the size TRL was measured at in CPU-NOTES
    "lab-small": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=768),
}


def build_tokenizer() -> PreTrainedTokenizerFast:
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(PAD, special=True), AddedToken(EOS, special=True)])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, padding_side="left", chat_template=CHAT_TEMPLATE,
    )


def build_model(preset: str, tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    import torch

    if preset not in PRESETS:
        raise ValueError(f"unknown embedded preset '{preset}'; valid: {', '.join(PRESETS)}")
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id, rms_norm_eps=1e-5, **PRESETS[preset],
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model
