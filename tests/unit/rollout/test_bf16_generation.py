"""The ``hf`` generator's ``dtype: bf16`` and ``dtype: int8`` (standard/fused.py with bfloat16 or int8 GEMMs):
inexact by design, so the checks are bounds against the float32 model, and a check that the low precision actually
ran."""

import importlib.util
import types

import pytest
import torch
from test_fused_decode import adapted, llama, qwen3, requests
from transformers import GPT2Config, GPT2LMHeadModel

from groupwise.config import ConfigError, load
from groupwise.models.forward import completion_logprobs, pack, prefill
from groupwise.rollout.base import SamplingParams
from groupwise.standard import fused
from groupwise.standard.hf import HFConfig, HFGenerator, hf


def teacher_forced(model, tokenizer, outs, temperature):
    """The float32 trainer's log-probs of what was sampled, flat over the rows' tokens."""
    reqs = requests(tokenizer)
    packed = pack([r.prompt_ids for r in reqs], [o.completion_ids for o in outs], tokenizer.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(model.eval(), packed, temperature=temperature if temperature > 0 else 1.0).logprobs
    return torch.cat([lp[i, :len(o.completion_ids)] for i, o in enumerate(outs)])


# per dtype, measured: rows of 7 that match the float32 decode token for token at least (the embedded preset, the
# random models), and the bounds on the mean |log p_sampler - log p_trainer| per token (the preset, the random
# models; the floor shows the low precision ran: float32 ~1e-7)
CLOSE = {"bf16": ((6, 3), (0.005, 0.1), 2e-4), "int8": ((6, 1), (0.02, 0.3), 5e-4)}


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
@pytest.mark.parametrize("build", ["tiny", "llama", "qwen3", "lora"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_low_precision_decode_is_close_to_the_float32_model(dtype, build, temperature, tiny_model, tokenizer):
    if build == "lora":
        pytest.importorskip("peft")
    model = {"tiny": lambda: tiny_model, "llama": llama, "qwen3": qwen3, "lora": lambda: adapted(llama)}[build]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = SamplingParams(max_tokens=16, temperature=temperature)
    ref = HFGenerator(HFConfig(), model, tokenizer).generate(requests(tokenizer), params,
                                                              torch.Generator().manual_seed(0))
    gen = HFGenerator(HFConfig(dtype=dtype), model, tokenizer)
    out = gen.generate(requests(tokenizer), params, torch.Generator().manual_seed(0))
    assert gen.decode_path == f"fused ({dtype})"
    (same_tiny, same_random), (mean_tiny, mean_random), floor = CLOSE[dtype]
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # parameters never modified
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())
    # measured, rows that match the float32 decode token for token: bf16 the embedded preset 7/7, the random models
    # (initializer_range 0.3: logits far larger than a trained model's, so far more rounding) 4-6/7; int8 7/7 and
    # 1-7/7 (qwen3 greedy: 1)
    same = sum(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(ref, out))
    assert same >= (same_tiny if build == "tiny" else same_random)
    # the reported log-probs are the low-precision sampler's: near the float32 trainer's, and not equal to them.
    # Measured mean |Δ|: bf16 the preset 1.0e-3-1.4e-3, the random models 0.018-0.050 (the real model: 7e-3);
    # int8 the preset 2.3e-3-4.4e-3, the random models 0.083-0.144 (the real model: 0.08-0.12); float32 ~1e-7
    sampler = torch.cat([o.rollout_logprobs for o in out])
    delta = (teacher_forced(model, tokenizer, out, temperature) - sampler).abs()
    assert bool(torch.isfinite(delta).all())
    assert float(delta.mean()) < (mean_tiny if build == "tiny" else mean_random)
    assert float(delta.mean()) > floor  # the low precision ran


def test_bf16_decoder_holds_bf16_weights_and_kv(tokenizer):
    pytest.importorskip("peft")
    model = adapted(llama).eval()
    reqs = requests(tokenizer)
    cache, logits, attn = prefill(model, [r.prompt_ids for r in reqs], tokenizer.pad_token_id, "cpu")
    dec = fused.FusedDecoder(model, cache, attn, 4, torch.bfloat16)
    w_qkv, _, (w_o, _), w_gu, _, _, (w_down, _) = dec.w[0]
    assert {w_qkv.dtype, w_o.dtype, w_gu.dtype, w_down.dtype, dec.head[0].dtype, dec.kv.full_k.dtype,
            dec.kv.full_v.dtype} == {torch.bfloat16}
    # the folded bf16 weights are the float32 fold rounded (not the base weights: the adapter is in them)
    exact = fused.FusedDecoder(model, prefill(model, [r.prompt_ids for r in reqs], tokenizer.pad_token_id, "cpu")[0],
                               attn, 4)
    assert torch.equal(w_qkv, exact.w[0][0].to(torch.bfloat16))
    base = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.equal(w_qkv[:, :base.shape[0]], base.t().to(torch.bfloat16))
    width = attn.shape[1]  # (one row per request: the prompts copied in front of the generated keys)
    assert dec.kv.full_k[:, :, :, :width].float().sub(exact.kv.full_k[:, :, :, :width]).abs().max() < 0.05
    step = dec.step(torch.tensor([5] * len(reqs)), attn.sum(-1))
    assert step.dtype == torch.float32 and step.shape == logits.shape


def test_int8_decoder_holds_per_row_int8_packs(tokenizer):
    """Without input ranges, each GEMM's weight is the float32 fold rounded to int8 with one scale per output row,
    max |w_row| / 127 (so every entry within half a step of the fold, and each row's largest entry exactly +-127),
    and no input factor; the KV buffer and the logits stay float32."""
    pytest.importorskip("peft")
    model = adapted(llama).eval()
    reqs = requests(tokenizer)
    fresh = lambda: prefill(model, [r.prompt_ids for r in reqs], tokenizer.pad_token_id, "cpu")  # noqa: E731
    cache, logits, attn = fresh()
    dec = fused.FusedDecoder(model, cache, attn, 4, torch.qint8)
    exact = fused.FusedDecoder(model, fresh()[0], attn, 4)
    assert dec.int8 and dec.dtype is None and dec.kv.full_k.dtype == dec.kv.full_v.dtype == torch.float32
    for (packed, inv), fold in [(dec.w[0][0], exact.w[0][0].t()), (dec.w[0][2][0], exact.w[0][2][0]),
                                (dec.head[0], model.get_base_model().lm_head.weight)]:
        assert inv is None
        q, _ = torch.ops.quantized.linear_unpack(packed)
        scale = q.q_per_channel_scales().float()
        assert torch.allclose(scale, fold.abs().amax(1) / 127, rtol=1e-6)
        assert q.int_repr().abs().amax(1).eq(127).all()
        assert bool(((q.dequantize() - fold).abs() <= scale[:, None] / 2 * (1 + 1e-5)).all())
        assert not torch.equal(q.dequantize(), fold)
    step = dec.step(torch.tensor([5] * len(reqs)), attn.sum(-1))
    assert step.dtype == torch.float32 and step.shape == logits.shape


def test_smoothing_by_hand_and_against_an_outlier_channel():
    """``_pack`` with input ranges: s_j = amax_j^0.5 / max_i |w_ij|^0.5, the columns of w times s before the
    rounding, the input times 1/s (the same product exactly); and on an input whose channel 0 is 50x the others
    (the outliers of a down_proj input), the product's error falls."""
    w = torch.tensor([[0.5, -0.25], [0.125, 1.0]])
    amax = torch.tensor([4.0, 0.25])
    (packed, inv) = fused._pack(w, None, amax)
    s = torch.tensor([(4.0 / 0.5) ** 0.5, (0.25 / 1.0) ** 0.5])  # [2.828.., 0.5]
    assert torch.allclose(inv, 1 / s, rtol=1e-6)
    q, _ = torch.ops.quantized.linear_unpack(packed)
    smoothed = w * s
    assert torch.allclose(q.q_per_channel_scales().float(), smoothed.abs().amax(1) / 127, rtol=1e-6)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * 0.05
    x = torch.randn(32, 256, generator=g)
    x[:, 0] *= 50
    ref = x @ w.t()
    err = {name: float((fused._qlinear(x, fused._pack(w, None, a)) - ref).norm() / ref.norm())
           for name, a in (("plain", None), ("smoothed", x.abs().amax(0)))}
    assert err["smoothed"] < 0.5 * err["plain"], err


def test_the_int8_generator_smooths_with_the_prefill_ranges(tokenizer, monkeypatch):
    """The ``hf`` generator's int8 decoder gets the prefill's GEMM input ranges: every layer's four and the head's,
    the head's over every prompt position (the final norm's output), not only the last."""
    model = llama().eval()
    seen = {}
    orig = fused.FusedDecoder.__init__

    def spy(self, model, cache, attn, new_tokens, dtype=None, ranges=None, row=None):
        orig(self, model, cache, attn, new_tokens, dtype, ranges, row)
        seen["ranges"], seen["w"] = ranges, self.w

    monkeypatch.setattr(fused.FusedDecoder, "__init__", spy)
    HFGenerator(HFConfig(dtype="int8"), model, tokenizer).generate(
        requests(tokenizer), SamplingParams(max_tokens=4, temperature=1.0), torch.Generator().manual_seed(0))
    ranges, layers = seen["ranges"], len(model.model.layers)
    assert set(ranges) == {(i, k) for i in range(layers) for k in ("qkv", "o", "gu", "down")} | {"head"}
    assert ranges["head"].shape == (model.config.hidden_size,) and ranges[(0, "down")].shape == (
        model.config.intermediate_size,)
    reqs = requests(tokenizer)
    with torch.no_grad():
        hidden = model.model(input_ids=reqs[0].prompt_ids[None]).last_hidden_state[0]  # the final norm's output
    assert bool((ranges["head"] >= hidden.abs().amax(0) - 1e-5).all())  # every position of a prompt counted
    assert all(inv is not None for inv in (seen["w"][0][0][1], seen["w"][0][2][0][1]))


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_low_precision_needs_the_fused_decode(dtype, tokenizer):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=108, n_positions=64)).eval()
    env = types.SimpleNamespace(policy=gpt2, tokenizer=tokenizer)
    with pytest.raises(ConfigError) as e:
        hf(HFConfig(dtype=dtype), env)
    assert f"rollout.generator.dtype={dtype}" in str(e.value) and "gpt2" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="bfloat16 weights") as e:
        hf(HFConfig(dtype=dtype), types.SimpleNamespace(policy=llama().to(torch.bfloat16), tokenizer=tokenizer))
    assert "\n" not in str(e.value)
    assert isinstance(hf(HFConfig(dtype=dtype), types.SimpleNamespace(policy=llama(), tokenizer=tokenizer)),
                      HFGenerator)
    if importlib.util.find_spec("peft"):  # LoRA dropout: off in generate's eval mode, so not a reason at build
        policy = adapted(llama, dropout=0.1).train()
        assert isinstance(hf(HFConfig(dtype=dtype), types.SimpleNamespace(policy=policy, tokenizer=tokenizer)),
                          HFGenerator)
        assert policy.training
    assert HFConfig().dtype == "model"


def test_int8_runs_on_cpu_only(tokenizer):
    with pytest.raises(ConfigError, match="int8 decode runs on CPU") as e:
        hf(HFConfig(dtype="int8"), types.SimpleNamespace(policy=llama().to("meta"), tokenizer=tokenizer))
    assert "meta" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("generator, words", [
    ("{name: hf, dtype: bf16, decode: model}", ("dtype=bf16", "decode=auto or fused")),
    ("{name: hf, dtype: int8, decode: model}", ("dtype=int8", "decode=auto or fused")),
    ("{name: hf, dtype: fp16}", ("dtype", "bf16")),
])
def test_bf16_config_errors_are_one_line(tmp_path, generator, words):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: x\ntask: lab\nrollout: {{generator: {generator}}}\n")
    with pytest.raises(ConfigError) as e:
        load(str(recipe), [])
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value)


ARGS = ["model.warm_start=false", "trainer.threads=1", "trainer.record_groups=0", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_completion_tokens=8", "optim.lr=1e-2", "optim.ppo_epochs=2",
        "reward.terms=[{name: length_penalty, max_length: 8}]", "loss.importance_sampling={mode: token_truncate}"]


@pytest.mark.parametrize("dtype, tol", [("bf16", 5e-2), ("int8", 0.25)])
def test_a_low_precision_run_logs_the_mismatch_and_keeps_ppo_exact(tmp_path, dtype, tol):
    """The sync probe's default tolerance is the sampler's precision's (with float32's 1e-3 the probe of a bf16
    or int8 sampler would stop the run), the mismatch metrics are logged, and PPO's ratio is still 1 at the first
    epoch (π_old is the update's own forward, not the sampler's log-probs)."""
    from groupwise.loop.setup import build
    from groupwise.loop.trainer import rl_step

    p = build(load(None, [*ARGS, f"rollout.generator={{name: hf, dtype: {dtype}}}", f"out_dir={tmp_path}"]), io=False)
    assert p.generator.check.tol == tol
    metrics = [rl_step(p, s) for s in range(2)]
    assert p.generator.inner.decode_path == f"fused ({dtype})"
    assert all(m["sync/failures"] == 0 for m in metrics)
    ran = [m for m in metrics if m["update/micro_batches"]]  # (a step whose groups all tie trains no row)
    assert ran
    for m in ran:
        assert 1e-7 < m["mismatch/kl"] < 1e-2 and 1e-4 < m["mismatch/max_abs_dlogp"] < 1.0
        assert m["mismatch/is_weight_mean"] == pytest.approx(1.0, abs=0.05)
    assert all(m["update/grad_norm"] > 0 for m in ran)


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_the_async_snapshot_generator_samples_in_low_precision(tmp_path, dtype):
    from groupwise.loop.setup import build
    from groupwise.loop.trainer import lagged_step

    p = build(load(None, [*ARGS, f"rollout.generator={{name: hf, dtype: {dtype}}}", "rollout.max_async_level=1",
                          f"out_dir={tmp_path}"]), io=False)
    metrics = [lagged_step(p, s) for s in range(2)]
    assert p.lag.view.generator.inner is not p.generator.inner  # its own generator, on the snapshot
    assert p.lag.view.generator.inner.decode_path == f"fused ({dtype})"
    ran = [m for m in metrics if m["update/micro_batches"]]
    assert ran and all(m["mismatch/kl"] > 1e-7 for m in ran)
