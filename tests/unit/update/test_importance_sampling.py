"""``loss.importance_sampling`` and the ``mismatch/*`` metrics through the update (``Learner``)."""

import copy
import math

import pytest
import torch
from test_update import grads_after_step, make_samples
from torch.testing import assert_close

from groupwise.config import ImportanceSamplingConfig, load
from groupwise.models.forward import completion_logprobs, pack
from groupwise.registry import ConfigError


def pinned_case(tokenizer):
    samples = make_samples(tokenizer, n=4)
    for i, s in enumerate(samples):
        s.rollout_logprobs = torch.linspace(-3.0, -0.5, s.length) + 0.1 * i
    return samples, [torch.full((s.length,), a) for s, a in zip(samples, (1.0, -0.5, 2.0, 0.5))]


@pytest.mark.parametrize("extra", [[], ["loss.importance_sampling.mode=none"]])
def test_mode_none_is_the_update_before_importance_sampling(tiny_model, tokenizer, extra):
    """Values recorded with the code before ``loss.importance_sampling`` existed (these samples, 2 epochs), bit for
    bit on the machine that recorded them; another machine's float32 kernels differ in the last bits (the gradient
    sum by 4e-8 relative on one seen here), hence rel 1e-6: far below what any change of the update moves."""
    samples, adv = pinned_case(tokenizer)
    over = ["optim.grad_clip=0", "optim.ppo_epochs=2", *extra]
    g, m = grads_after_step(tiny_model, tokenizer, samples, adv, over)
    recorded = {"loss/total": "-0x1.9982dd0000000p-2", "update/grad_norm": "0x1.1c3abf0000000p+2"}
    assert {k: m[k] for k in recorded} == pytest.approx({k: float.fromhex(v) for k, v in recorded.items()}, rel=1e-6)
    grad_sum = sum(float(v.double().abs().sum()) for v in g.values())
    assert grad_sum == pytest.approx(float.fromhex("0x1.979f2c5b923dcp+9"), rel=1e-6)


def trainer_logprobs(model, samples, tokenizer):
    packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                  tokenizer.pad_token_id)
    return completion_logprobs(copy.deepcopy(model), packed).logprobs.detach()


def with_offsets(model, samples, tokenizer, offsets):
    """Sampler log-probs = the trainer's − offset, so δ = old − sampler = offset (per row)."""
    lp = trainer_logprobs(model, samples, tokenizer)
    for i, s in enumerate(samples):
        s.rollout_logprobs = lp[i, :s.length] - offsets[i]
    return lp


def test_mismatch_metrics_are_logged_without_correcting(tiny_model, tokenizer):
    samples = make_samples(tokenizer, n=3)
    offsets = [0.3, -0.1, 0.05]
    with_offsets(tiny_model, samples, tokenizer, offsets)
    samples[1].rollout_logprobs[0] = math.nan  # a token the sampler did not sample: left out of the metrics
    adv = [torch.full((s.length,), a) for s, a in zip(samples, (1.0, -0.5, 2.0))]
    _, m = grads_after_step(tiny_model, tokenizer, samples, adv, ["optim.grad_clip=0"])
    per_token = [d for s, d in zip(samples, offsets) for t in range(s.length)
                 if s.loss_mask[t] and not math.isnan(float(s.rollout_logprobs[t]))]
    n = len(per_token)
    assert m["mismatch/kl"] == pytest.approx(sum(math.exp(d) - 1 - d for d in per_token) / n, abs=1e-6)
    assert m["mismatch/is_weight_mean"] == pytest.approx(sum(map(math.exp, per_token)) / n, abs=1e-6)
    assert m["mismatch/max_abs_dlogp"] == pytest.approx(0.3, abs=1e-5)
    assert m["mismatch/clipped_frac"] == 0.0


@pytest.mark.parametrize("mode, cap", [("token_truncate", 1.2), ("token_mask", 1.2),
                                       ("sequence_truncate", 1.5), ("sequence_mask", 1.5)])
def test_gradient_is_the_weighted_objective(tiny_model, tokenizer, mode, cap):
    """grad = −Σ w_t A_t ∇logp_t / tokens (on-policy ppo_clip, token_mean); every loss token stays in the
    denominator, a masked one too (TRL zeroes the weight, it does not drop the token)."""
    samples = make_samples(tokenizer, n=3)
    offsets = [0.3, -0.1, 0.05]  # per token e^0.3 = 1.35 > 1.2; row 0's product e^(0.3·len) > 1.5
    with_offsets(tiny_model, samples, tokenizer, offsets)
    adv = [torch.full((s.length,), a) for s, a in zip(samples, (1.0, -0.5, 2.0))]
    over = ["optim.grad_clip=0", f"loss.importance_sampling={{mode: {mode}, cap: {cap}}}"]
    got, m = grads_after_step(tiny_model, tokenizer, samples, adv, over)
    model = copy.deepcopy(tiny_model)
    packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                  tokenizer.pad_token_id)
    lp = completion_logprobs(model, packed).logprobs
    mask = torch.zeros_like(lp, dtype=torch.bool)
    a, w = torch.zeros_like(lp), torch.zeros_like(lp)
    for i, s in enumerate(samples):
        mask[i, :s.length], a[i, :s.length] = s.loss_mask, adv[i]
        r = math.exp(offsets[i] * (float(s.loss_mask.sum()) if mode.startswith("sequence") else 1.0))
        w[i] = min(r, cap) if mode.endswith("truncate") else (0.0 if r > cap else r)
    (-(w * a * lp * mask).sum() / mask.sum()).backward()
    for n, p in model.named_parameters():
        assert_close(got[n], p.grad, rtol=1e-4, atol=1e-7)
    clipped = float(samples[0].loss_mask.sum()) / float(mask.sum())  # only row 0 is over the cap
    assert m["mismatch/clipped_frac"] == pytest.approx(clipped, abs=1e-9)


def test_bad_importance_sampling_config_is_one_line_at_load():
    with pytest.raises(ConfigError, match=r"^override 'loss.importance_sampling.cap=1': "
                                          r"loss.importance_sampling: cap=1.0: allowed > 1 \(.*\)$"):
        load(None, ["loss.importance_sampling.cap=1"])
    with pytest.raises(ConfigError, match=r"loss.importance_sampling.mode: 'token_clip' is not allowed; "
                                          r"allowed: none, token_truncate, token_mask, sequence_truncate, "
                                          r"sequence_mask, geometric_mask, seq_mask_tis$"):
        load(None, ["loss.importance_sampling.mode=token_clip"])
    with pytest.raises(ConfigError, match=r"^loss.importance_sampling.mode=token_mask: generator 'fake' "
                                          r"returns no sampling log-probs; allowed: mode none, or a "
                                          r"generator that does \(hf, vllm\)$"):
        load(None, ["loss.importance_sampling.mode=token_mask", "rollout.generator.name=fake"])
    assert load(None, ["rollout.generator.name=fake"]).loss.importance_sampling.mode == "none"
    is_cfg = load(None, ["loss.importance_sampling={mode: sequence_mask, cap: 2}"]).loss.importance_sampling
    assert (is_cfg.mode, is_cfg.cap) == ("sequence_mask", 2.0)
    band = load(None, ["loss.importance_sampling={mode: seq_mask_tis, clip_min: 0.99, cap: 1.01}"])
    assert band.loss.importance_sampling == ImportanceSamplingConfig(mode="seq_mask_tis", cap=1.01, clip_min=0.99)


@pytest.mark.parametrize("override, error", [
    ("clip_min=1", r"clip_min=1.0: allowed null or in \[0, 1\) \(w = 1 is no mismatch; a bound at or above it "
                   r"raises or masks matching tokens\)"),
    ("clip_min=0.5", r"clip_min=0.5: mode none applies no weight; allowed: clip_min null, or a mode other than none"),
    ("mode=geometric_mask", r"mode=geometric_mask needs the band's lower bound; allowed: clip_min in \[0, 1\) "
                            r"\(SkyRL 0.99, NeMo-RL 0.999\) with cap \(SkyRL 1.01, NeMo-RL 1.002\)"),
])
def test_bad_band_is_one_line_at_load(override, error):
    with pytest.raises(ConfigError, match=rf"^override 'loss.importance_sampling.{override}': "
                                          rf"loss.importance_sampling: {error}$"):
        load(None, [f"loss.importance_sampling.{override}"])


@pytest.mark.parametrize("mode", ["geometric_mask", "seq_mask_tis"])
def test_geometric_modes_through_the_update(tiny_model, tokenizer, mode):
    """Per-row offsets δ make each row's geometric mean e^δ: row 0's e^0.3 leaves the band [0.9, 1.1], rows 1
    and 2 stay. The gradient is the weighted objective (−Σ w A ∇logp / tokens, row 0 still in the denominator),
    and the drop fraction and ESS are the same from one micro-batch as from many."""
    samples = make_samples(tokenizer, n=3)
    offsets = [0.3, -0.1, 0.05]
    with_offsets(tiny_model, samples, tokenizer, offsets)
    adv = [torch.full((s.length,), a) for s, a in zip(samples, (1.0, -0.5, 2.0))]
    base = ["optim.grad_clip=0", f"loss.importance_sampling={{mode: {mode}, clip_min: 0.9, cap: 1.1}}"]
    got, m = grads_after_step(tiny_model, tokenizer, samples, adv, [*base, "optim.micro_batch_tokens=100000"])
    _, split = grads_after_step(tiny_model, tokenizer, samples, adv, [*base, "optim.micro_batch_tokens=12"])
    model = copy.deepcopy(tiny_model)
    packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], tokenizer.pad_token_id)
    logp = completion_logprobs(model, packed).logprobs
    mask = torch.zeros_like(logp, dtype=torch.bool)
    a, w = torch.zeros_like(logp), torch.zeros_like(logp)
    for i, s in enumerate(samples):
        mask[i, :s.length], a[i, :s.length] = s.loss_mask, adv[i]
        w[i] = 0.0 if i == 0 else (1.0 if mode == "geometric_mask" else math.exp(offsets[i]))
    (-(w * a * logp * mask).sum() / mask.sum()).backward()
    for n, p in model.named_parameters():
        assert_close(got[n], p.grad, rtol=1e-4, atol=1e-7)
    assert split["update/micro_batches"] > m["update/micro_batches"] == 1
    known = [float(s.loss_mask.sum()) for s in samples]
    weights = [(wi, k) for wi, k in zip(w[:, 0].tolist(), known)]
    ess = sum(x * k for x, k in weights) ** 2 / (sum(known) * sum(x * x * k for x, k in weights))
    for metrics in (m, split):
        assert metrics["mismatch/masked_seq_frac"] == pytest.approx(1 / 3, abs=1e-9)
        assert metrics["mismatch/clipped_frac"] == pytest.approx(known[0] / sum(known), abs=1e-9)
        assert metrics["mismatch/ess"] == pytest.approx(ess, abs=1e-6)
        assert "mismatch/is_weight_sq_mean" not in metrics
