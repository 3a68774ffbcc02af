"""A fused decode step for Llama-family models: the ``hf`` generator's ``decode: fused`` (issue 12's lever).

One decode step of transformers' eager Llama is ~45 small ops per layer around seven skinny GEMMs, and its
``DynamicCache`` grows every layer's keys and values with a ``torch.cat`` per token. The fused step computes
the same function with

  * one GEMM for q, k and v and one for gate and up (the weights concatenated once per generate call, so the
    step always uses the current parameters: the optimizer updates them in place between calls);
  * a preallocated KV buffer ``[layers, rows, kv_heads, width + new tokens, head_dim]`` written in place, with
    a boolean key mask (left padding of the prompts stays masked), and finished rows dropped by an index;
  * grouped-query attention in ``scaled_dot_product_attention(enable_gqa=True)`` instead of repeating K/V.

Everything that carries a model's own numerics is the model's own module, called as is: the embedding, every
RMSNorm (Qwen3's per-head q/k norms included), the rotary embedding (so scaled RoPE variants work), the final
norm and the LM head. The prefill is the model's own forward (``forward.prefill``, one pass per distinct
prompt); its cache is copied into the buffer. Outputs equal the model's decode up to float summation order
(the fused GEMMs add the same products in another order): tests/unit/rollout/test_fused_decode.py.

Supported (``unsupported(model, length)`` says why not, and the generator then runs the model's own forward):
model types llama, mistral, qwen2, qwen3 with SiLU MLPs, plain ``nn.Linear`` projections (a peft LoRA
policy's wrapped projections fall back), plain-tensor weights (a sharded DTensor falls back), no tensor-parallel
pretraining split, and no sliding-window layer whose window is shorter than the generation's total length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def _layers(model: torch.nn.Module):
    inner = getattr(model, "model", None)
    return getattr(inner, "layers", None)


def unsupported(model: torch.nn.Module, length: int) -> str | None:
    """None when the fused step computes ``model``'s decode exactly (up to summation order) for sequences of
    ``length`` tokens; else a one-line reason."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in MODEL_TYPES:
        return f"model type {kind!r} (fused decode covers {', '.join(MODEL_TYPES)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (fused decode covers silu)"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    window = getattr(cfg, "sliding_window", None)
    sliding = any(t == "sliding_attention" for t in (getattr(cfg, "layer_types", None) or [])) or (
        window is not None and getattr(cfg, "use_sliding_window", True) and kind == "mistral")
    if sliding and window is not None and window < length:
        return f"sliding window {window} < {length} tokens"
    layers = _layers(model)
    if layers is None:
        return "no model.model.layers"
    for layer in layers:
        att, mlp = layer.self_attn, layer.mlp
        for lin in (att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            if type(lin) is not torch.nn.Linear:
                return f"projection of type {type(lin).__name__} (fused decode needs plain nn.Linear)"
            if type(lin.weight.data) is not torch.Tensor:  # e.g. an FSDP2 shard (DTensor) outside full_weights()
                return f"parameters of type {type(lin.weight.data).__name__} (fused decode needs plain tensors)"
    return None


def _cat_bias(*lins: torch.nn.Linear) -> Tensor | None:
    if all(lin.bias is None for lin in lins):
        return None
    return torch.cat([lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in lins])


class FusedDecoder:
    """The decode state of one generate call: fused weights, the KV buffer and its key mask."""

    @torch.no_grad()
    def __init__(self, model: torch.nn.Module, cache, attn: Tensor, new_tokens: int):
        self.model, self.layers = model, list(_layers(model))
        att0 = self.layers[0].self_attn
        self.head_dim, self.scaling = att0.head_dim, att0.scaling
        self.heads = att0.q_proj.out_features // self.head_dim
        self.kv_heads = att0.k_proj.out_features // self.head_dim
        self.w = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            self.w.append((torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).t().contiguous(),
                           _cat_bias(a.q_proj, a.k_proj, a.v_proj),
                           torch.cat([m.gate_proj.weight, m.up_proj.weight]).t().contiguous(),
                           _cat_bias(m.gate_proj, m.up_proj), m.gate_proj.out_features))
        rows, width = attn.shape
        first = cache.layers[0].keys
        shape = (len(self.layers), rows, self.kv_heads, width + new_tokens, self.head_dim)
        self.k = first.new_zeros(shape)
        self.v = first.new_zeros(shape)
        for i, layer_cache in enumerate(cache.layers):
            self.k[i, :, :, :width] = layer_cache.keys
            self.v[i, :, :, :width] = layer_cache.values
        self.valid = torch.zeros((rows, width + new_tokens), dtype=torch.bool, device=attn.device)
        self.valid[:, :width] = attn.bool()
        self.n = width  # filled key positions

    def keep(self, rows: Tensor) -> None:
        """Drop finished rows (``rows``: the indices to keep)."""
        self.k, self.v, self.valid = self.k[:, rows], self.v[:, rows], self.valid[rows]

    @torch.no_grad()
    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        """Logits [rows, V] after feeding ``tok`` [rows] at positions ``pos`` [rows]."""
        b, n, d = tok.shape[0], self.n, self.head_dim
        inner = self.model.model
        h = inner.embed_tokens(tok)  # [B, E]
        cos, sin = inner.rotary_emb(h[:, None], pos[:, None])  # [B, 1, D]
        cos, sin = cos[:, :, None], sin[:, :, None]  # against [B, 1, heads, D]
        self.valid[:, n] = True
        mask = self.valid[:, None, None, :n + 1]  # [B, 1, 1, keys]
        qn, kn = self.heads * d, self.kv_heads * d
        for i, (layer, (w_qkv, b_qkv, w_gu, b_gu, inter)) in enumerate(zip(self.layers, self.w)):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            qkv = x @ w_qkv if b_qkv is None else torch.addmm(b_qkv, x, w_qkv)
            q, k, v = qkv.split([qn, kn, kn], dim=-1)
            q, k = q.view(b, 1, self.heads, d), k.view(b, 1, self.kv_heads, d)
            if hasattr(a, "q_norm"):  # Qwen3: RMSNorm over each head before RoPE
                q, k = a.q_norm(q), a.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.k[i, :, :, n] = k[:, 0]
            self.v[i, :, :, n] = v.view(b, self.kv_heads, d)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), self.k[i, :, :, :n + 1], self.v[i, :, :, :n + 1],
                                               attn_mask=mask, scale=self.scaling,
                                               enable_gqa=self.heads != self.kv_heads)
            h = h + a.o_proj(o.reshape(b, qn))
            x = layer.post_attention_layernorm(h)
            gu = x @ w_gu if b_gu is None else torch.addmm(b_gu, x, w_gu)
            g, u = gu.split([inter, inter], dim=-1)
            h = h + layer.mlp.down_proj(F.silu(g) * u)
        self.n = n + 1
        return self.model.lm_head(inner.norm(h))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
