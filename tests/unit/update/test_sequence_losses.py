"""``gspo``, ``gmpo`` and ``cispo`` through the update: micro-batch invariant also off-policy."""

import pytest
import torch
from test_importance_sampling import trainer_logprobs
from test_update import grads_after_step, make_samples
from torch.testing import assert_close


@pytest.mark.parametrize("term, reduction", [
    ("{name: gspo, clip_low: 0.2, clip_high: 0.2}", "seq_mean_token_mean"),
    ("{name: gspo, clip_low: 0.2, clip_high: 0.2, level: sequence_token}", "token_mean"),
    ("gmpo", "seq_mean_token_mean"),
    ("{name: cispo, clip_low: 0.2, clip_high: 0.2}", "token_mean"),
])
def test_off_policy_update_is_micro_batch_invariant(tiny_model, tokenizer, term, reduction):
    """Rows that carry behaviour log-probs away from the policy's (as replayed rows do), so the ratios leave 1 and
    some clip: the same gradient from one micro-batch and from many, each row's sequence ratio taken within its
    micro-batch."""
    samples = make_samples(tokenizer)
    lp = trainer_logprobs(tiny_model, samples, tokenizer)
    g = torch.Generator().manual_seed(0)
    for i, s in enumerate(samples):
        s.old_logprobs = lp[i, :s.length] + 0.3 * (i % 5 - 2) + 0.1 * torch.randn(s.length, generator=g)
    adv = [torch.full((s.length,), float(i % 3) - 1.0) for i, s in enumerate(samples)]
    base = [f"loss.terms=[{term}]", f"loss.reduction={reduction}", "optim.grad_clip=0"]
    one, m1 = grads_after_step(tiny_model, tokenizer, samples, adv, [*base, "optim.micro_batch_tokens=100000"])
    many, m2 = grads_after_step(tiny_model, tokenizer, samples, adv, [*base, "optim.micro_batch_tokens=12"])
    assert m1["update/micro_batches"] == 1 and m2["update/micro_batches"] >= 4
    assert abs(m1["loss/ratio_mean"] - 1) > 1e-3 and m1["loss/clip_frac_low"] + m1["loss/clip_frac_high"] > 0
    for k in one:
        assert_close(one[k], many[k], rtol=1e-4, atol=1e-7)
    for key in ("loss/total", "loss/ratio_mean", "loss/clip_frac_low", "loss/clip_frac_high"):
        assert m1[key] == pytest.approx(m2[key], abs=1e-6)
