"""A fused decode step for Llama-family models: the ``hf`` generator's ``decode: fused`` (issue 12's lever).

One decode step of transformers' eager Llama is ~45 small ops per layer around seven skinny GEMMs, and its
``DynamicCache`` grows every layer's keys and values with a ``torch.cat`` per token. The fused step computes
the same function with

  * one GEMM for q, k and v and one for gate and up (the weights concatenated once per generate call, so the
    step always uses the current parameters: the optimizer updates them in place between calls);
  * a peft LoRA policy's adapter folded into those weights, once per generate call: ``W + scaling · B A`` for
    every adapted projection (o_proj and down_proj included), computed into new tensors, so the model's own
    parameters are never touched (no ``merge_adapter``: the trainer's forward stays the unmerged adapter, and
    the next call folds the adapter the optimizer has since updated);
  * each distinct prompt's keys and values held once (the prefill's cache, one row per prompt: ``KV``), and
    a preallocated buffer ``[layers, rows, kv_heads, new tokens, head_dim]`` of each request's generated ones,
    written in place, finished rows dropped by an index;
  * a cascade attention (``KV.attend``): a prompt's queries (its requests', a group's G samples) attend to
    its keys in one product (left padding masked), each row to its generated keys, the two joined by their
    log-sum-exps; grouped-query attention without repeating K/V. A call whose rows share no prompt (a greedy
    pass) copies each prompt in front of its row's generated keys instead, one buffer and one attention;

Everything that carries a model's own numerics is the model's own module, called as is: the embedding, every
RMSNorm (Qwen3's per-head q/k norms included), the rotary embedding (so scaled RoPE variants work), the final
norm and an adapted, ``modules_to_save`` or hooked LM head. A plain ``nn.Linear`` head (tied or not) is its own weight
in blocks of ``HEAD_ROWS`` vocabulary rows (``_head``: the same dot products; 1.14-1.30x faster than one call over
SmolLM2's 49,152 rows on this CPU). The prefill is the model's own forward
(``forward.prefill_distinct``, one pass per distinct prompt); its cache is the prompts' keys. Outputs equal the
model's decode up to float summation order (the fused GEMMs add the same products in another order, and the
LoRA fold computes ``x W + scaling · (x A) B`` as one product): tests/unit/rollout/test_fused_decode.py. The fold
is limited to float32 weights: in bfloat16, rounding ``W + scaling · B A`` to bfloat16 is a coarser change than
summation order (it changed sampled tokens of a tiny llama where the plain fused step matched bit for bit).

Supported (``unsupported(model, length)`` says why not, and the generator then runs the model's own forward):
model types llama, mistral, qwen2, qwen3 with SiLU MLPs; projections that are plain ``nn.Linear``, or peft
``lora.Linear`` over one with plain LoRA in float32 (more than one active adapter, DoRA or another variant,
``lora_bias``, an adapter merged in place, bfloat16 / float16 adapted weights, a ``modules_to_save`` copy of a
projection, and LoRA dropout left active in train mode fall back; generation runs in eval mode, so a recipe's
``model.lora.dropout`` does not); plain-tensor weights (a sharded DTensor falls back); no tensor-parallel
pretraining split; and no sliding-window layer whose window is shorter than the generation's total length.

``dtype=torch.bfloat16`` (the ``hf`` generator's ``dtype: bf16``; inexact by design, for speed on CPUs with bf16
matmul units): the folded weights and a copy of the LM head's are cast to bfloat16 once per generate call (the
model's parameters are untouched), every GEMM of the step (fused q/k/v, o_proj, fused gate/up, down_proj, the LM
head) runs in bfloat16, the KV buffer is bfloat16 (the prefill's cache, which the ``hf`` generator computes under
autocast, rounded to bfloat16), and the attention is bfloat16 GEMMs around a float32 softmax (``KV.attend``:
``scaled_dot_product_attention``'s CPU kernel is slower in bfloat16 than in float32). The residual stream stays
float32: the embedding, every RMSNorm (the model's own modules, on the float32 residual; Qwen3's q/k norms upcast
as they do), the rotary embedding (applied in float32, then rounded) and the residual adds; a GEMM's input is
rounded to bfloat16 and its bfloat16 output added to the float32 residual. The logits are the head GEMM's
bfloat16 output cast to float32 (so they carry bfloat16 rounding, ~0.4% of a logit); sampling and the reported
log-probs are the float32 log-softmax of exactly those logits, i.e. the log-probs of the distribution the tokens
were drawn from. With it the LM head must be a plain ``nn.Linear`` or a plain LoRA
one, and the weights float32 (``unsupported(model, length, dtype)``).

``dtype=torch.qint8`` (the ``hf`` generator's ``dtype: int8``; inexact by design, CPU only): the folded weights and
the LM head's are rounded to int8 once per generate call, one symmetric scale per output row, and prepacked for
fbgemm (``_pack``); every GEMM of the step is ``quantized::linear_dynamic``, which rounds its float32 input to 7 bits
with one scale over the whole input tensor, multiplies in int8 with int32 accumulation and returns float32 (VNNI
kernels on AVX512 CPUs). One scale over the input cannot resolve the outlier channels of an LM's activations (on
SmolLM2 down_proj's input carries the largest share of the error), so each GEMM is smoothed as in SmoothQuant: the
``hf`` generator records each GEMM input's per-channel range during its prefill (``ActRanges``, the model's own
float32 forward over the prompts) and ``_pack`` moves a share (``SMOOTH_ALPHA``) of it into the weights before the
rounding; the decode multiplies each GEMM's input by the inverse factor (one element-wise product). Everything else
is the float32 step: the KV buffer, attention, the residual stream, norms, rotary and the prefill. The logits are
the int8 head's, and sampling and the reported log-probs are the log-softmax of exactly those. The sampler's
mismatch against the float32 trainer stays 4.5-30x bf16's (``mismatch/kl`` 3e-3 to 1.4e-2 a token on SmolLM2;
docs/benchmarks.md, "Lever: int8 generation").
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING

from groupwise.adapters import base_model
from groupwise.lazy import no_grad, torch

if TYPE_CHECKING:
    from torch import Tensor

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def _layers(model: torch.nn.Module):
    inner = getattr(model, "model", None)
    return getattr(inner, "layers", None)


def unsupported(model: torch.nn.Module, length: int, dtype: torch.dtype | None = None) -> str | None:
    """None when the fused step computes ``model``'s decode exactly (up to summation order) for sequences of
    ``length`` tokens, or with ``dtype`` (bfloat16, or ``torch.qint8``: int8 GEMMs) runs it in that precision; else
    a one-line reason."""
    model = base_model(model)  # a peft LoRA policy: the transformers model under it (its adapted layers checked below)
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
            reason = _projection_unsupported(lin)
            if reason:
                return reason
    if dtype is not None:
        head = getattr(model, "lm_head", None)
        reason = _projection_unsupported(head) if head is not None else "no lm_head"
        if reason:
            return f"LM head: {reason}"
        weights = {p.dtype for p in model.parameters()}
        if dtype == torch.qint8:
            devices = {p.device.type for p in model.parameters()}
            if devices != {"cpu"}:
                return f"the int8 decode runs on CPU (fbgemm / qnnpack), the model is on {'/'.join(sorted(devices))}"
            if torch.backends.quantized.engine == "none" or not hasattr(torch.ops.quantized, "linear_dynamic"):
                return "no quantized dynamic linear in this torch build (torch.backends.quantized.supported_engines)"
        if weights != {torch.float32}:
            return (f"{'/'.join(sorted(str(d)[6:] for d in weights))} weights (a {str(dtype)[6:]} decode casts a "
                    "float32 model's)")
    return None


def _is_lora(lin: torch.nn.Module) -> bool:
    """A peft ``lora.Linear`` (exactly: its quantized and other subclasses compute something else)."""
    layer = sys.modules.get("peft.tuners.lora.layer")  # imported when a LoRA model exists; never imported here
    return layer is not None and type(lin) is layer.Linear


def _adapters(lin) -> list[str]:
    """The adapters a peft LoRA layer's forward adds (none while they are disabled)."""
    return [] if lin.disable_adapters else [a for a in lin.active_adapters if a in lin.lora_A]


def _projection_unsupported(lin: torch.nn.Module) -> str | None:
    tensors = []
    if _is_lora(lin):
        names = _adapters(lin)
        if lin.merged:
            return "a LoRA adapter merged into its base weights (fused decode folds an unmerged one)"
        if len(names) > 1:
            return f"{len(names)} active LoRA adapters (fused decode folds one)"
        for a in names:
            if a in lin.lora_variant or lin.use_dora.get(a):
                kind = "DoRA" if lin.use_dora.get(a) else type(lin.lora_variant[a]).__name__
                return f"LoRA variant {kind} (fused decode folds plain LoRA)"
            if lin.lora_bias.get(a):
                return "LoRA with lora_bias (fused decode folds plain LoRA)"
            drop = lin.lora_dropout[a]
            if drop.training and getattr(drop, "p", 0) > 0:
                return f"LoRA dropout {drop.p} in train mode"
            ab = (lin.lora_A[a], lin.lora_B[a])
            if any(type(m) is not torch.nn.Linear for m in ab):
                return f"LoRA factors of type {type(ab[0]).__name__} (fused decode needs nn.Linear)"
            tensors += [m.weight for m in ab]
            dtypes = {t.dtype for t in (lin.base_layer.weight, *tensors)}
            if dtypes - {torch.float32, torch.float64} or len(dtypes) > 1:  # the fold rounds W + scaling·BA once
                return (f"LoRA over {'/'.join(sorted(str(d)[6:] for d in dtypes))} weights (folding the adapter "
                        "rounds differently from the model's two products; fused decode folds float32)")
        lin = lin.base_layer
    if type(lin) is not torch.nn.Linear:
        return f"projection of type {type(lin).__name__} (fused decode needs plain nn.Linear or peft lora.Linear)"
    for t in [lin.weight, *tensors]:
        if type(t.data) is not torch.Tensor:  # e.g. an FSDP2 shard (DTensor) outside full_weights()
            return f"parameters of type {type(t.data).__name__} (fused decode needs plain tensors)"
    return None


def _cast(w: Tensor, b: Tensor | None, dtype: torch.dtype | None) -> tuple[Tensor, Tensor | None]:
    """``(w, b)`` as is (``dtype`` None), or copies in ``dtype``."""
    if dtype is None:
        return w, b
    return w.to(dtype, copy=True), None if b is None else b.to(dtype, copy=True)


def _weight(lin: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    """(weight [out, in], bias) of the function a projection computes: a LoRA layer's adapter folded in,
    ``W + scaling · B A`` (float32: ``unsupported``), into a new tensor."""
    if not _is_lora(lin):
        return lin.weight, lin.bias
    base, names = lin.base_layer, _adapters(lin)  # at most one (unsupported)
    if not names:
        return base.weight, base.bias
    a = names[0]
    return torch.addmm(base.weight, lin.lora_B[a].weight, lin.lora_A[a].weight, alpha=lin.scaling[a]), base.bias


def _fused(*lins: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    """The projections side by side, transposed for ``x @ w`` ([in, sum of out]), each LoRA adapter folded into
    its columns in place (one copy of the weights), and their biases (zeros for a projection without one)."""
    bases = [lin.base_layer if _is_lora(lin) else lin for lin in lins]
    w = torch.cat([b.weight.t() for b in bases], dim=1)
    start = 0
    for lin, b in zip(lins, bases):
        for a in _adapters(lin) if lin is not b else ():  # (x W^T: the transposed fold, A^T B^T)
            w[:, start:start + b.out_features].addmm_(lin.lora_A[a].weight.t(), lin.lora_B[a].weight.t(),
                                                       alpha=lin.scaling[a])
        start += b.out_features
    if all(b.bias is None for b in bases):
        return w, None
    return w, torch.cat([b.bias if b.bias is not None else b.weight.new_zeros(b.out_features) for b in bases])


class FusedDecoder:
    """The decode state of one generate call: fused weights, each distinct prompt's keys and values (the prefill's
    cache, one row per prompt) and each request's own generated ones; with ``dtype`` (bfloat16) the weights, the
    head's copy and the keys and values in that precision, or (``torch.qint8``) the weights and the head's as int8
    packs, smoothed by ``ranges`` (``ActRanges.amax``) where given (module docstring). ``row`` [B]: each request's
    row of ``cache`` / ``attn`` (None: one cache row per request)."""

    @no_grad
    def __init__(self, model: torch.nn.Module, cache, attn: Tensor, new_tokens: int,
                 dtype: torch.dtype | None = None, ranges: dict | None = None, row: Tensor | None = None):
        self.model = base_model(model)
        self.int8 = dtype == torch.qint8  # the GEMMs in int8 (fbgemm's dynamic linear), all else float32
        self.dtype = None if self.int8 else dtype  # the GEMMs', attention's and KV buffer's low precision (bf16)
        self.layers = list(_layers(self.model))
        att0 = self.layers[0].self_attn
        self.head_dim, self.scaling = att0.head_dim, att0.scaling
        self.heads = att0.q_proj.out_features // self.head_dim  # a peft lora.Linear has its base's sizes
        self.kv_heads = att0.k_proj.out_features // self.head_dim
        self.w = []  # per layer: (qkv^T, its bias, o_proj, gate|up^T, its bias, intermediate size, down_proj)
        for i, layer in enumerate(self.layers):
            a, m = layer.self_attn, layer.mlp
            qkv, gu = _fused(a.q_proj, a.k_proj, a.v_proj), _fused(m.gate_proj, m.up_proj)
            if self.int8:  # (packs of [out, in]; the bias inside the pack; smoothed by the input ranges if known)
                r = (ranges or {}).get
                self.w.append((_pack(qkv[0].t(), qkv[1], r((i, "qkv"))), None,
                               (_pack(*_weight(a.o_proj), r((i, "o"))),), _pack(gu[0].t(), gu[1], r((i, "gu"))), None,
                               m.up_proj.out_features, (_pack(*_weight(m.down_proj), r((i, "down"))),)))
            else:
                self.w.append((*_cast(*qkv, dtype), _cast(*_weight(a.o_proj), dtype), *_cast(*gu, dtype),
                               m.up_proj.out_features, _cast(*_weight(m.down_proj), dtype)))
        # the LM head: a copy of its (folded) weight in dtype, or its pack; without dtype a plain nn.Linear's own
        # weight (computed in vocabulary blocks, ``_head``), any other head module called as is
        lm = self.model.lm_head
        if dtype is not None:
            head = _weight(lm)
            self.head = (_pack(*head, (ranges or {}).get("head")),) if self.int8 else _cast(*head, dtype)
        else:
            self.head = (lm.weight, lm.bias) if _plain_head(lm) else None
        row = torch.arange(len(attn), device=attn.device) if row is None else row.to(attn.device)
        low = self.dtype or cache.layers[0].keys.dtype
        self.kv = KV([c.keys.to(low) for c in cache.layers], [c.values.to(low) for c in cache.layers], attn.bool(),
                     row, new_tokens, exact=self.dtype is None)

    def keep(self, rows: Tensor) -> None:
        """Drop finished rows (``rows``: the indices to keep)."""
        self.kv.keep(rows)

    @no_grad
    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        """Logits [rows, V] after feeding ``tok`` [rows] at positions ``pos`` [rows] (float32 with ``dtype``)."""
        F = torch.nn.functional
        b, d = tok.shape[0], self.head_dim
        inner = self.model.model
        h = inner.embed_tokens(tok)  # [B, E]
        lo = self.dtype or h.dtype  # the GEMMs' precision (``.to(lo)`` is a no-op without ``dtype``)
        cos, sin = inner.rotary_emb(h[:, None], pos[:, None])  # [B, 1, D]
        cos, sin = cos[:, :, None], sin[:, :, None]  # against [B, 1, heads, D]
        qn, kn = self.heads * d, self.kv_heads * d
        for i, (layer, (w_qkv, b_qkv, w_o, w_gu, b_gu, inter, w_down)) in enumerate(zip(self.layers, self.w)):
            a = layer.self_attn
            x = layer.input_layernorm(h).to(lo)
            qkv = self._mm(x, w_qkv, b_qkv)
            q, k, v = qkv.split([qn, kn, kn], dim=-1)
            q, k = q.view(b, 1, self.heads, d), k.view(b, 1, self.kv_heads, d)
            if hasattr(a, "q_norm"):  # Qwen3: RMSNorm over each head before RoPE
                q, k = a.q_norm(q), a.k_norm(k)
            q = (q * cos + _rotate_half(q) * sin).to(lo)  # (in cos's dtype, the residual's)
            k = k * cos + _rotate_half(k) * sin
            self.kv.write(i, k[:, 0], v.view(b, self.kv_heads, d))
            o = self.kv.attend(i, q.view(b, self.kv_heads, self.heads // self.kv_heads, d), self.scaling)
            h = h + self._linear(o.reshape(b, qn), w_o)  # what o_proj computes (nn.Linear: the same call)
            x = layer.post_attention_layernorm(h).to(lo)
            gu = self._mm(x, w_gu, b_gu)
            g, u = gu.split([inter, inter], dim=-1)
            h = h + self._linear(F.silu(g) * u, w_down)
        self.kv.n += 1
        x = inner.norm(h).to(lo)
        if self.head is None:
            return self.model.lm_head(x)
        if self.int8:
            return _qlinear(x, self.head[0])
        return _head(x, *self.head) if self.dtype is None else _head(x, *self.head).float()

    def _mm(self, x: Tensor, w, b: Tensor | None) -> Tensor:
        """``x @ w + b`` for a fused projection (``w`` [in, out]), or its int8 pack's product."""
        if self.int8:
            return _qlinear(x, w)
        return x @ w if b is None else torch.addmm(b, x, w)

    def _linear(self, x: Tensor, wb: tuple) -> Tensor:
        """``F.linear(x, w, b)`` (what an ``nn.Linear`` computes), or its int8 pack's product."""
        return _qlinear(x, wb[0]) if self.int8 else torch.nn.functional.linear(x, *wb)


HEAD_ROWS = 1024
"""Output rows (vocabulary entries) per GEMM of the decode's LM head (``_head``)."""


def _plain_head(lm: torch.nn.Module) -> bool:
    """An LM head ``_head`` computes as its module would: a plain ``nn.Linear`` of plain tensors that no forward
    hook changes (a hook, e.g. a logit bias, runs only when the module itself is called)."""
    from torch.nn.modules import module as m

    hooks = (lm._forward_hooks, lm._forward_pre_hooks, m._global_forward_hooks, m._global_forward_pre_hooks)
    return type(lm) is torch.nn.Linear and type(lm.weight.data) is torch.Tensor and not any(hooks)


def _head(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """``F.linear(x, w, b)`` for the LM head, ``HEAD_ROWS`` rows of ``w`` at a time, each block's product written
    into its columns of one [B, V] output. Every logit is the same dot product over the hidden size, so the result
    is the single call's wherever the BLAS kernel sums a block's columns as it sums the whole (bitwise on this CPU in
    float32 at the row counts ``benchmarks/decode_paths.py --head-cost`` checks, and in a check of bfloat16 and 1-128
    rows not kept; the tests pin it to rounding); the blocks only change how the [B, V] product walks memory. On
    SmolLM2-135M's head (576 -> 49,152) at 64 rows, one thread, after a decode step's other GEMMs: the single call
    67.4 ms, the blocks 52.0 ms (``decode_paths.py --head-cost``; docs/benchmarks.md, "Lever: the decode's LM head
    in blocks")."""
    out = x.new_empty(x.shape[0], w.shape[0])
    for i in range(0, w.shape[0], HEAD_ROWS):
        o, wi = out[:, i:i + HEAD_ROWS], w[i:i + HEAD_ROWS].t()
        if b is None:
            torch.mm(x, wi, out=o)
        else:
            torch.addmm(b[i:i + HEAD_ROWS], x, wi, out=o)
    return out


SMOOTH_ALPHA = 0.5
"""The migration strength of the int8 decode's smoothing (SmoothQuant's α; its paper's default). Measured on
SmolLM2-135M (smollm2_math, 32 rows x 48 tokens, ``mismatch/kl`` per token, the ranges of the prompts and one float32
sample of them): none 4.2e-2, α 0.35 2.0e-2, 0.5 8.8e-3, 0.75 1.7e-2; with the prefill's ranges alone (what the
generator records) α 0.5 gave 1.4e-2 on 64 rows (docs/benchmarks.md, "Lever: int8 generation")."""


class ActRanges:
    """Records, while a forward of the model's own modules runs inside it (the generator's prefill), each GEMM input's
    per-channel max |x| over every token: the input of q_proj (q/k/v's), o_proj, gate_proj (gate/up's) and
    down_proj of every layer, and the final norm's output (the LM head's input at every position: the prefill's
    head runs on the last one only). ``amax`` maps ``(layer, "qkv" | "o" | "gu" | "down")`` and ``"head"`` to a
    float32 vector; a recorded ``FusedDecoder`` smooths its int8 GEMMs with them (``_pack``)."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.amax, self._hooks = base_model(model), {}, []

    def __enter__(self) -> ActRanges:
        for i, layer in enumerate(_layers(self.model)):
            a, m = layer.self_attn, layer.mlp
            for key, mod in (((i, "qkv"), a.q_proj), ((i, "o"), a.o_proj), ((i, "gu"), m.gate_proj),
                             ((i, "down"), m.down_proj)):
                self._hooks.append(mod.register_forward_pre_hook(lambda _, inp, key=key: self._see(key, inp[0])))
        self._hooks.append(self.model.model.norm.register_forward_hook(lambda _, __, out: self._see("head", out)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _see(self, key, x: Tensor) -> None:
        m = x.detach().reshape(-1, x.shape[-1]).abs().amax(0).float()
        self.amax[key] = m if key not in self.amax else torch.maximum(self.amax[key], m)


def _pack(w: Tensor, b: Tensor | None, amax: Tensor | None = None):
    """``w`` [out, in] (float32) rounded to int8 with one symmetric scale per output row (max |w_row| / 127) and
    prepacked for fbgemm's dynamic linear, with ``b`` (float32) inside the pack; and the factor its input is
    multiplied by first (None: 1). With ``amax`` (the input's per-channel max |x|, ``ActRanges``), SmoothQuant's
    smoothing: input channel j is divided by s_j = amax_j^α / max_i |w_ij|^(1-α) (α = SMOOTH_ALPHA) and column j of
    ``w`` multiplied by it before the rounding, the same product in exact arithmetic, so that the outlier channels
    that one per-tensor 7-bit scale of the input cannot resolve move into the weights' per-row scales."""
    w, inv = w.detach(), None
    if amax is not None:
        s = (amax.clamp_min(1e-5) ** SMOOTH_ALPHA / w.abs().amax(0).clamp_min(1e-5) ** (1 - SMOOTH_ALPHA)).clamp_min(
            1e-5)
        w, inv = w * s, 1.0 / s
    scale = (w.abs().amax(1).clamp_min(1e-12) / 127).double()
    with warnings.catch_warnings():  # (quantized tensors are deprecated in torch; the op is in the pinned 2.13)
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None if b is None else b.detach()), inv


def _qlinear(x: Tensor, pack) -> Tensor:
    """``x @ w^T + b`` with ``_pack``'s int8 ``w`` (``pack``: the prepacked weight and its input factor): fbgemm
    quantizes ``x`` (times the factor) per call to 7-bit unsigned with one scale and zero point over the whole
    tensor (``reduce_range`` on x86: the 16-bit pairwise sums of AVX2's int8 multiply cannot saturate; qnnpack, on
    ARM, takes 8 bits), multiplies in int8 with int32 accumulation, and returns float32."""
    packed, inv = pack
    return torch.ops.quantized.linear_dynamic(x if inv is None else x * inv, packed,
                                              torch.backends.quantized.engine != "qnnpack")


_FLASH = "_scaled_dot_product_flash_attention_for_cpu"  # torch's CPU flash attention, which returns the logsumexp


class KV:
    """The keys and values of one generate call. Where rows share prompts (a group's G samples), each distinct
    prompt's keys and values are held once (the prefill's cache, one row per prompt), each row's generated ones in a
    buffer of their own, and a decode step's attention is a cascade: each prompt's queries (its rows' query heads, laid
    out on a ``[prompts, slots]`` grid) attend to its keys in one product, each row to its generated keys, and the two
    softmaxes are joined by their log-sum-exps, so every query sees ``softmax`` over [its prompt's keys | its
    generated keys], the same function as one attention over a buffer with the prompt copied into every row, up to
    float summation order. What it saves: that copy (its zeroing, and its copy at each compaction of finished rows),
    reading a prompt's keys once per row, and padding the generated keys to the widest prompt. On SmolLM2-135M's lab
    decode (64 rows = 8 prompts x 8 of 78-237 tokens, 128 new tokens, one thread) a generate call took 1.11x less CPU
    time and 1.2 GB less memory at its peak (docs/benchmarks.md, "Lever: shared-prompt attention"). Where no two rows
    share a prompt (a greedy pass, ``group_size: 1``, ``share_prefill: false``) the cascade has nothing to share and
    still pays its joins, so such a call copies, as the decode did before: one buffer ``[layers, rows, kv heads,
    width + new tokens, D]``, the prompt in front of the generated keys, a key mask for the left padding (end to end
    the two layouts were within noise there: docs/benchmarks.md).

    ``exact`` (float32): the attention in ``scaled_dot_product_attention`` (copied buffer) or with the prompts' part
    in torch's CPU flash attention, which returns the log-sum-exp (cascade; elsewhere two GEMMs around a float32
    softmax); else (bfloat16) GEMMs around a float32 softmax, ``scaled_dot_product_attention``'s CPU kernel in
    bfloat16 having run 3.3x slower than float32 at the real model's decode shapes (12.3 against 3.8 ms a call)."""

    def __init__(self, keys: list[Tensor], values: list[Tensor], mask: Tensor, row: Tensor, new_tokens: int,
                 exact: bool = True):
        self.u, width = mask.shape
        dev, (_, kv, _, d) = mask.device, keys[0].shape
        counts = torch.bincount(row, minlength=self.u)
        self.slots, self.exact, self.n = int(counts.max()), exact, 0  # n: generated positions written
        self.shared = self.slots > 1
        shape = (len(keys), len(row), kv, new_tokens + (0 if self.shared else width), d)
        k, v = torch.empty(shape, dtype=keys[0].dtype, device=dev), torch.empty(shape, dtype=keys[0].dtype, device=dev)
        if not self.shared:  # the copied buffer: every written position is read, none needs zeroing
            for i, (pk, pv) in enumerate(zip(keys, values)):
                k[i, :, :, :width], v[i, :, :, :width] = pk[row], pv[row]
            self.width, self.full_k, self.full_v = width, k, v
            self.full_mask = torch.cat([mask[row], mask.new_ones(len(row), new_tokens)], dim=1)
            self.k, self.v = k[:, :, :, width:], v[:, :, :, width:]
            return
        self.keys, self.values = keys, values  # per layer [U, kv heads, W, D]
        self.k, self.v = k, v  # every generated position is written for every live row: no mask, no zeroing
        self.mask = mask[:, None, None, :]  # [U, 1, 1, W]: left padding (and a common prefix's layout) masked
        self.bias = torch.zeros(self.mask.shape, device=dev).masked_fill_(~self.mask, float("-inf"))
        self.flash = exact and dev.type == "cpu" and hasattr(torch.ops.aten, _FLASH)
        # row b's queries sit in slot (row[b], j) of the grid, j its rank among the rows of its prompt
        order = torch.argsort(row, stable=True)
        rank = torch.empty_like(row)
        rank[order] = torch.arange(len(row), device=dev) - (counts.cumsum(0) - counts)[row[order]]
        self.grid = row * self.slots + rank

    def keep(self, rows: Tensor) -> None:
        """Drop finished rows (``rows``: the indices to keep)."""
        if self.shared:
            self.k, self.v, self.grid = self.k[:, rows], self.v[:, rows], self.grid[rows]
            return
        self.full_k, self.full_v, self.full_mask = self.full_k[:, rows], self.full_v[:, rows], self.full_mask[rows]
        self.k, self.v = self.full_k[:, :, :, self.width:], self.full_v[:, :, :, self.width:]

    def write(self, i: int, k: Tensor, v: Tensor) -> None:
        """Layer ``i``'s key and value [B, kv heads, D] at this step's generated position."""
        self.k[i, :, :, self.n], self.v[i, :, :, self.n] = k, v

    def attend(self, i: int, q: Tensor, scale: float) -> Tensor:
        """Layer ``i``'s attention output [B, kv heads, heads per kv head, D] for queries ``q`` of the same shape
        (query head j reads kv head j // heads per kv head, as ``enable_gqa``), over each row's prompt and its
        generated keys so far, this step's included."""
        n = self.n + 1
        if not self.shared:
            keys, m = self.width + n, self.full_mask[:, None, None, :self.width + n]
            return _attend(q, self.full_k[i, :, :, :keys], self.full_v[i, :, :, :keys], m, scale, self.exact)
        k, v = self.k[i, :, :, :n], self.v[i, :, :, :n]
        s = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # [B, kv, per, n]
        grid = self._grid(q)  # [U, kv, slots * per, D]
        if self.flash:
            o_p, lse_p = getattr(torch.ops.aten, _FLASH)(grid, self.keys[i], self.values[i], attn_mask=self.bias,
                                                         scale=scale)
        else:
            s_p = (torch.matmul(grid, self.keys[i].transpose(-1, -2)).float() * scale).masked_fill_(~self.mask,
                                                                                                    float("-inf"))
            lse_p = torch.logsumexp(s_p, -1)
        lse_rows = self._rows(lse_p)  # [B, kv, per]
        lse = torch.logaddexp(lse_rows, torch.logsumexp(s, -1))  # over the prompt's keys and the generated ones
        out = torch.matmul(s.sub_(lse[..., None]).exp_().to(v.dtype), v)
        if self.flash:
            return out + self._rows(o_p) * (lse_rows - lse).exp_()[..., None]
        w_p = s_p.sub_(self._grid(lse)[..., None]).exp_().to(v.dtype)
        return out + self._rows(torch.matmul(w_p, self.values[i]))

    def _grid(self, x: Tensor) -> Tensor:
        """[B, kv, per, ...] -> [U, kv, slots * per, ...] (empty slots 0)."""
        _, kv, per, *rest = x.shape
        g = x.new_zeros((self.u * self.slots, kv, per, *rest)).index_copy_(0, self.grid, x)
        return g.view(self.u, self.slots, kv, per, *rest).transpose(1, 2).reshape(self.u, kv, self.slots * per, *rest)

    def _rows(self, x: Tensor) -> Tensor:
        """``_grid``'s inverse: [U, kv, slots * per, ...] -> [B, kv, per, ...]."""
        _, kv, width, *rest = x.shape
        per = width // self.slots
        r = x.view(self.u, kv, self.slots, per, *rest).transpose(1, 2).reshape(self.u * self.slots, kv, per, *rest)
        return r.index_select(0, self.grid)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, exact: bool) -> Tensor:
    """One query per head and row against a copied buffer: ``q`` [B, kv heads, per, D], ``k``/``v`` [B, kv heads,
    keys, D], ``mask`` [B, 1, 1, keys]; ``exact``: ``scaled_dot_product_attention``, else GEMMs in ``v``'s dtype whose
    scores are scaled, masked and soft-maxed in float32, the weights rounded to ``v``'s dtype for the product."""
    b, kv, per, d = q.shape
    if exact:
        o = torch.nn.functional.scaled_dot_product_attention(q.reshape(b, kv * per, 1, d), k, v, attn_mask=mask,
                                                             scale=scale, enable_gqa=per > 1)
        return o.view(b, kv, per, d)
    s = (torch.matmul(q, k.transpose(-1, -2)).float() * scale).masked_fill_(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1).to(v.dtype), v)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
