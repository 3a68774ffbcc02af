"""The ``hf`` generator's fused decode step (standard/fused.py) against the model's own forward."""

import warnings

import pytest
import torch
from torch.testing import assert_close
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from groupwise.config import ConfigError, LoraConfig, load
from groupwise.models.forward import completion_logprobs, pack
from groupwise.rollout.base import Request, SamplingParams
from groupwise.standard import fused
from groupwise.standard.hf import HFConfig, HFGenerator

# initializer_range 0.3: at the usual 0.02 a random model's attention is so flat that masking the padding wrong
# moves log-probs by < 1e-5, and the comparison could not fail
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, vocab_size=108, pad_token_id=0, eos_token_id=1, bos_token_id=1,
             initializer_range=0.3)


def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SMALL)).eval()


def qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**SMALL)).eval()  # q/k/v with bias


def qwen3():
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=16)).eval()  # per-head q/k RMSNorm


def adapted(build, seed=1, **lora_kw):
    """``build()`` as a peft LoRA policy (every linear layer) whose adapter has trained: peft starts B at 0,
    which folds to nothing, so B is drawn at random here."""
    from groupwise.models import lora

    model = lora.wrap(build(), LoraConfig(r=4, alpha=8.0, **lora_kw))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed + len(n)))
    return model


def prompt(tokenizer, text):
    return torch.tensor(tokenizer.encode(text + "\n", add_special_tokens=False))


def requests(tokenizer):
    """Groups of repeated prompts of different lengths (left padding), a forced prefix and per-row caps (so
    finished rows are compacted away mid-decode)."""
    nt = tokenizer.convert_tokens_to_ids("<NT>")
    reqs = [Request(prompt(tokenizer, "3+5"), max_tokens=6)] * 3 + [Request(prompt(tokenizer, "1-2+7-4+9"))] * 3
    return reqs + [Request(prompt(tokenizer, "8-1"), prefix=[nt, nt], max_tokens=4)]


def both(model, tokenizer, params, seed=0, share_prefill=True):
    out = []
    for decode in ("model", "fused"):
        gen = HFGenerator(HFConfig(decode=decode, share_prefill=share_prefill), model, tokenizer)
        out.append(gen.generate(requests(tokenizer), params, torch.Generator().manual_seed(seed)))
    return out


@pytest.mark.parametrize("build", ["tiny", "llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("share_prefill", [True, False], ids=["prompts-shared", "prompts-copied"])
def test_fused_decode_equals_the_models_forward(build, temperature, share_prefill, tiny_model, tokenizer):
    """(``share_prefill: false``: every row its own prompt, so the fused decode copies it: ``fused.KV``'s other
    path.)"""
    model = {"tiny": lambda: tiny_model, "llama": llama, "qwen2": qwen2, "qwen3": qwen3}[build]()
    assert fused.unsupported(model, 64) is None
    a, b = both(model, tokenizer, SamplingParams(max_tokens=16, temperature=temperature), share_prefill=share_prefill)
    lengths = [len(x.completion_ids) for x in a]
    assert lengths == [len(y.completion_ids) for y in b] and max(lengths) > 6  # rows were compacted away mid-decode
    for x, y in zip(a, b):
        assert torch.equal(x.completion_ids, y.completion_ids)
        assert torch.equal(x.forced, y.forced) and x.finish_reason == y.finish_reason
        assert_close(x.rollout_logprobs, y.rollout_logprobs, rtol=1e-5, atol=1e-5)
    # and both are the teacher-forced log-probs of what was sampled
    reqs = requests(tokenizer)
    packed = pack([r.prompt_ids for r in reqs], [o.completion_ids for o in b], tokenizer.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(model, packed, temperature=temperature if temperature > 0 else 1.0).logprobs
    for i, o in enumerate(b):
        assert_close(lp[i, :len(o.completion_ids)], o.rollout_logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_the_lm_head_in_blocks_is_the_single_product(dtype, bias, monkeypatch):
    monkeypatch.setattr(fused, "HEAD_ROWS", 7)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 16, generator=g).to(dtype), torch.randn(45, 16, generator=g).to(dtype)  # a last block of 3
    b = torch.randn(45, generator=g).to(dtype) if bias else None
    got = fused._head(x, w, b)
    assert got.dtype == dtype and got.shape == (5, 45) and got.is_contiguous()
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # (bfloat16: one rounding of the output, in either order)
    assert_close(got, torch.nn.functional.linear(x, w, b), rtol=tol, atol=tol)


def test_fused_decode_with_the_lm_head_in_several_blocks_equals_the_models_forward(tokenizer, monkeypatch):
    monkeypatch.setattr(fused, "HEAD_ROWS", 40)  # the tiny vocabulary (108) in blocks of 40, 40 and 28
    calls, head = [], fused._head
    monkeypatch.setattr(fused, "_head", lambda *a: (calls.append(1), head(*a))[1])
    a, b = both(llama(), tokenizer, SamplingParams(max_tokens=16, temperature=1.0))
    assert calls, "the fused decode did not compute the head in blocks: the test would be vacuous"
    for x, y in zip(a, b):
        assert torch.equal(x.completion_ids, y.completion_ids)
        assert_close(x.rollout_logprobs, y.rollout_logprobs, rtol=1e-5, atol=1e-5)


def test_fused_decode_reads_the_current_weights(tokenizer):
    model = qwen2()
    gen = HFGenerator(HFConfig(decode="fused"), model, tokenizer)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    before = gen.generate(requests(tokenizer), params, torch.Generator())
    assert gen.decode_path == "fused"
    with torch.no_grad():  # an in-place update, as the optimizer does between generate calls
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    after = gen.generate(requests(tokenizer), params, torch.Generator())
    ref = HFGenerator(HFConfig(), model, tokenizer).generate(requests(tokenizer), params, torch.Generator())
    assert any(not torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(before, after))
    for x, y in zip(after, ref):
        assert torch.equal(x.completion_ids, y.completion_ids)


@pytest.mark.parametrize("build", [llama, qwen2])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fused_decode_folds_a_lora_adapter(build, temperature, tokenizer):
    pytest.importorskip("peft")
    model = adapted(build, dropout=0.1).train()  # as in training; generate runs in eval mode (no dropout)
    assert "LoRA dropout 0.1 in train mode" in fused.unsupported(model, 64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = SamplingParams(max_tokens=16, temperature=temperature)
    gen = HFGenerator(HFConfig(decode="fused"), model, tokenizer)
    b = gen.generate(requests(tokenizer), params, torch.Generator().manual_seed(0))
    assert gen.decode_path == "fused" and model.training
    a = HFGenerator(HFConfig(decode="model"), model, tokenizer).generate(
        requests(tokenizer), params, torch.Generator().manual_seed(0))
    base = HFGenerator(HFConfig(decode="model"), model.get_base_model(), tokenizer)
    with model.disable_adapter():
        plain = base.generate(requests(tokenizer), params, torch.Generator().manual_seed(0))
    assert any(not torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, plain))  # the adapter matters
    lengths = [len(x.completion_ids) for x in a]
    assert lengths == [len(y.completion_ids) for y in b] and max(lengths) > 6
    for x, y in zip(a, b):
        assert torch.equal(x.completion_ids, y.completion_ids)
        assert torch.equal(x.forced, y.forced) and x.finish_reason == y.finish_reason
        assert_close(x.rollout_logprobs, y.rollout_logprobs, rtol=1e-5, atol=1e-5)
    # the fold went into new tensors: the adapter is not merged and no parameter moved
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not any(getattr(m, "merged", False) for m in model.modules())
    reqs = requests(tokenizer)
    packed = pack([r.prompt_ids for r in reqs], [o.completion_ids for o in b], tokenizer.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(model.eval(), packed,
                                 temperature=temperature if temperature > 0 else 1.0).logprobs
    for i, o in enumerate(b):
        assert_close(lp[i, :len(o.completion_ids)], o.rollout_logprobs, rtol=1e-5, atol=1e-5)


def test_the_lora_fold_follows_the_adapters_updates(tokenizer):
    pytest.importorskip("peft")
    model = adapted(llama)
    gen = HFGenerator(HFConfig(decode="fused"), model, tokenizer)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    before = gen.generate(requests(tokenizer), params, torch.Generator())
    with torch.no_grad():  # an in-place update of the adapter only, as the optimizer does between generate calls
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.3)
    after = gen.generate(requests(tokenizer), params, torch.Generator())
    assert gen.decode_path == "fused"
    ref = HFGenerator(HFConfig(decode="model"), model, tokenizer).generate(requests(tokenizer), params,
                                                                           torch.Generator())
    assert any(not torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(before, after))
    for x, y in zip(after, ref):
        assert torch.equal(x.completion_ids, y.completion_ids)
        assert_close(x.rollout_logprobs, y.rollout_logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore:`lora_bias=True`")
def test_lora_settings_the_fold_does_not_cover_fall_back():
    peft = pytest.importorskip("peft")
    model = adapted(llama).eval()
    assert fused.unsupported(model, 64) is None
    with model.disable_adapter():  # the adapter switched off (lora.BaseView): the base weights, folded as is
        assert fused.unsupported(model, 64) is None
    model.add_adapter("second", peft.LoraConfig(r=2, target_modules=["q_proj"]))
    model.base_model.set_adapter(["default", "second"])
    assert "2 active LoRA adapters" in fused.unsupported(model, 64)
    for kw, reason in ((dict(use_dora=True), "LoRA variant DoRA"), (dict(lora_bias=True), "lora_bias")):
        other = peft.get_peft_model(llama(), peft.LoraConfig(r=4, target_modules=["v_proj"], **kw))
        assert reason in fused.unsupported(other, 64)
    merged = adapted(llama).eval()
    merged.merge_adapter()
    assert "merged" in fused.unsupported(merged, 64)
    saved = peft.get_peft_model(llama(), peft.LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["k_proj"]))
    assert "ModulesToSaveWrapper" in fused.unsupported(saved, 64)
    # bfloat16: the plain fused step runs, a LoRA fold would round W + scaling·BA to bfloat16 (not summation order)
    assert fused.unsupported(llama().to(torch.bfloat16), 64) is None
    assert "LoRA over bfloat16 weights" in fused.unsupported(adapted(llama).to(torch.bfloat16), 64)


def test_auto_decode_is_fused_where_it_runs_and_falls_back_silently(tokenizer):
    assert HFConfig().decode == "auto"
    params = SamplingParams(max_tokens=6, temperature=0.0)
    gen = HFGenerator(HFConfig(), llama(), tokenizer)
    gen.generate(requests(tokenizer), params, torch.Generator())
    assert gen.decode_path == "fused"
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=108, n_positions=64)).eval()
    gen = HFGenerator(HFConfig(), gpt2, tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gen.generate(requests(tokenizer), params, torch.Generator())
    assert gen.decode_path.startswith("model (model type 'gpt2'")
    off = HFGenerator(HFConfig(decode="model"), llama(), tokenizer)
    off.generate(requests(tokenizer), params, torch.Generator())
    assert off.decode_path == "model"


def test_unsupported_models_fall_back_with_one_warning(tokenizer):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=108, n_positions=64)).eval()
    assert "gpt2" in fused.unsupported(gpt2, 32)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    gen = HFGenerator(HFConfig(decode="fused"), gpt2, tokenizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = gen.generate(requests(tokenizer), params, torch.Generator())
        gen.generate(requests(tokenizer), params, torch.Generator())
    assert len([w for w in caught if "decode: fused falls back" in str(w.message)]) == 1
    assert gen.decode_path.startswith("model (model type 'gpt2'")
    b = HFGenerator(HFConfig(), gpt2, tokenizer).generate(requests(tokenizer), params, torch.Generator())
    assert all(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, b))


def test_unsupported_reasons():
    model = qwen2()
    model.model.layers[0].self_attn.q_proj = torch.nn.Sequential(model.model.layers[0].self_attn.q_proj)
    assert "Sequential" in fused.unsupported(model, 16)
    cfg = Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    windowed = Qwen2ForCausalLM(cfg)
    assert "sliding window 8 < 16" in fused.unsupported(windowed, 16)
    assert fused.unsupported(windowed, 8) is None


def test_bad_decode_value_is_a_one_line_error(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: x\ntask: lab\nrollout: {generator: {name: hf, decode: compiled}}\n")
    with pytest.raises(ConfigError) as e:
        load(str(recipe), [])
    assert "decode" in str(e.value) and "fused" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("exact", [True, False], ids=["flash-sdpa", "gemms"])
@pytest.mark.parametrize("shared", [True, False], ids=["cascade", "copied"])
def test_kv_attention_is_attention_over_each_rows_whole_sequence(exact, shared):
    """``fused.KV.attend`` against ``scaled_dot_product_attention`` over a buffer with every row's prompt copied in
    front of its generated keys. Shared prompts (the cascade: each prompt's keys once, joined with each row's
    generated keys by their log-sum-exps): rows in no order, groups of 3, 2 and 1 rows; none shared (the copied
    buffer); left-padded prompts, 2 kv heads of 3 query heads each, and again after dropping rows (the grid left with
    holes); float32 at a tight tolerance on both paths (``exact``: torch's attention kernels; else GEMMs around a
    float32 softmax, the bfloat16 decode's), and bfloat16 rounded."""
    g = torch.Generator().manual_seed(0)
    kv, per, d, w, n = 2, 3, 8, 7, 5
    row = torch.tensor([1, 0, 2, 0, 1, 0]) if shared else torch.tensor([1, 0, 2, 3, 5, 4])
    lens = torch.tensor([7, 3, 5, 6, 2, 7])[:int(row.max()) + 1]
    mask = torch.arange(w)[None] >= (w - lens)[:, None]  # [U, W] left padding
    keys, values = torch.randn(len(lens), kv, w, d, generator=g) * 2, torch.randn(len(lens), kv, w, d, generator=g)
    k, v, q = (torch.randn(6, kv, n, d, generator=g) * 2, torch.randn(6, kv, n, d, generator=g),
               torch.randn(6, kv, per, d, generator=g))

    def build(dtype):
        cache = fused.KV([keys.to(dtype)], [values.to(dtype)], mask, row, n + 2, exact=exact)
        for j in range(n):  # the generated keys, written as the decode writes them
            cache.write(0, k[:, :, j].to(dtype), v[:, :, j].to(dtype))
            cache.n += 1
        cache.n -= 1  # attend reads n + 1 positions: this step's included
        return cache

    def reference(rows):
        full_k, full_v = torch.cat([keys[row[rows]], k[rows]], 2), torch.cat([values[row[rows]], v[rows]], 2)
        m = torch.cat([mask[row[rows]], torch.ones(len(rows), n, dtype=torch.bool)], 1)[:, None, None]
        o = torch.nn.functional.scaled_dot_product_attention(q[rows].reshape(len(rows), kv * per, 1, d), full_k,
                                                             full_v, attn_mask=m, scale=0.3, enable_gqa=True)
        return o.reshape(len(rows), kv, per, d)

    cache = build(torch.float32)
    assert cache.shared == shared
    assert_close(cache.attend(0, q, 0.3), reference(torch.arange(6)), rtol=1e-5, atol=1e-6)
    keep = torch.tensor([0, 3, 5])  # shared: prompt 0 keeps one of its three rows, prompt 2 none
    cache.keep(keep)
    assert_close(cache.attend(0, q[keep], 0.3), reference(keep), rtol=1e-5, atol=1e-6)
    if not exact:  # bfloat16 keys and values (the bf16 decode): the same function, rounded
        out = build(torch.bfloat16).attend(0, q.bfloat16(), 0.3)
        assert out.dtype == torch.bfloat16 and float((out.float() - reference(torch.arange(6))).abs().max()) < 0.1
