import copy

import pytest
import support
import torch
from torch.testing import assert_close

from groupwise.types import Sample
from groupwise.update import plan_micro_batches


def make_samples(tokenizer, n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(2, 100, (3 + i % 4,), generator=g)
        c = torch.randint(2, 100, (2 + (i * 5) % 9,), generator=g)
        mask = torch.ones_like(c, dtype=torch.bool)
        if i == 2:
            mask[0] = False  # a forced (prefilled) token carries no loss
        out.append(Sample(prompt_ids=p, completion_ids=c, rollout_logprobs=torch.zeros(len(c)), loss_mask=mask,
                          finish_reason="stop"))
    return out


def grads_after_step(model, tokenizer, samples, advantages, overrides, ref=None, weights=None):
    model = copy.deepcopy(model)
    learner = support.learner(model, tokenizer, overrides, ref=ref)
    captured = {}
    real_step = learner.optimizer.step

    def capture(*a, **k):
        captured.update({n: p.grad.clone() for n, p in model.named_parameters()})
        return real_step(*a, **k)

    learner.optimizer.step = capture
    metrics = learner.step(support.rows(samples, advantages, weights=weights))
    return captured, metrics


@pytest.mark.parametrize("reduction", ["token_mean", "seq_mean_token_mean", "seq_sum_const"])
def test_micro_batch_invariance(tiny_model, tokenizer, reduction):
    samples = make_samples(tokenizer)
    adv = [torch.full((s.length,), float(i % 3) - 1.0) for i, s in enumerate(samples)]
    base = [f"loss.reduction={reduction}", "optim.grad_clip=0"]
    one, m1 = grads_after_step(tiny_model, tokenizer, samples, adv, [*base, "optim.micro_batch_tokens=100000"])
    many, m2 = grads_after_step(tiny_model, tokenizer, samples, adv, [*base, "optim.micro_batch_tokens=12"])
    assert m1["update/micro_batches"] == 1 and m2["update/micro_batches"] >= 4 and m1["update/skipped_rows"] == 3
    for k in one:
        assert_close(one[k], many[k], rtol=1e-4, atol=1e-7)
    assert m1["loss/total"] == pytest.approx(m2["loss/total"], abs=1e-6)


def test_zero_advantage_rows_are_skipped_without_changing_the_gradient(tiny_model, tokenizer):
    samples = make_samples(tokenizer)
    adv = [torch.full((s.length,), 0.0 if i % 2 else 1.0) for i, s in enumerate(samples)]
    skipped, m = grads_after_step(tiny_model, tokenizer, samples, adv, ["optim.grad_clip=0"])
    assert m["update/skipped_rows"] == 4
    # with a KL term every row matters, so nothing is skipped; at weight 1e-12 the gradient is the same
    ref = copy.deepcopy(tiny_model)
    full, m2 = grads_after_step(tiny_model, tokenizer, samples, adv,
                                ["optim.grad_clip=0", "loss.terms=[{name: ppo_clip}, {name: kl, weight: 1e-12}]"], ref)
    assert m2["update/skipped_rows"] == 0
    for k in skipped:
        assert_close(skipped[k], full[k], rtol=1e-4, atol=1e-7)
    # optim.skip_inert_rows=false (the benchmark's lever off) runs those rows: nothing skipped, the same gradient
    unskipped, m3 = grads_after_step(tiny_model, tokenizer, samples, adv, ["optim.grad_clip=0",
                                                                           "optim.skip_inert_rows=false"])
    assert m3["update/skipped_rows"] == 0 and m3["update/policy_forwards"] >= m["update/policy_forwards"]
    for k in skipped:
        assert_close(skipped[k], unskipped[k], rtol=1e-4, atol=1e-7)
    assert m["loss/total"] == pytest.approx(m3["loss/total"], abs=1e-6)


def test_gradient_matches_hand_written_objective(tiny_model, tokenizer):
    """On-policy ppo_clip with token_mean: grad = -Σ A_t ∇logp_t / tokens."""
    from groupwise.models.forward import completion_logprobs, pack

    samples = make_samples(tokenizer, n=3)
    adv = [torch.full((s.length,), a) for s, a in zip(samples, (1.0, -0.5, 2.0))]
    got, _ = grads_after_step(tiny_model, tokenizer, samples, adv, ["optim.grad_clip=0"])
    model = copy.deepcopy(tiny_model)
    packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], tokenizer.pad_token_id)
    lp = completion_logprobs(model, packed).logprobs
    mask = torch.zeros_like(lp, dtype=torch.bool)
    a = torch.zeros_like(lp)
    for i, s in enumerate(samples):
        mask[i, :s.length] = s.loss_mask
        a[i, :s.length] = adv[i]
    (-(a * lp * mask).sum() / mask.sum()).backward()
    for n, p in model.named_parameters():
        assert_close(got[n], p.grad, rtol=1e-4, atol=1e-7)


def test_stored_old_logprobs_set_the_ratio(tiny_model, tokenizer):
    samples = make_samples(tokenizer, n=2)
    for s in samples:
        s.old_logprobs = torch.full((s.length,), -50.0)  # ratio = exp(logp + 50) >> 1.2: every A>0 token clips
    adv = [torch.ones(s.length) for s in samples]
    _, m = grads_after_step(tiny_model, tokenizer, samples, adv, [])
    assert m["loss/clip_frac_high"] == 1.0


def test_plan_respects_budget_and_covers_rows(tokenizer):
    samples = make_samples(tokenizer, n=9)
    plan = plan_micro_batches(samples, 40)
    assert sorted(i for mb in plan for i in mb) == list(range(9))
    for mb in plan:
        width = max(samples[i].prompt_ids.numel() for i in mb) + max(samples[i].completion_ids.numel() for i in mb)
        assert len(mb) == 1 or len(mb) * width <= 40


def test_loss_weights_scale_every_term_per_token(tiny_model, tokenizer):
    """grad = −Σ w_t A_t ∇logp_t / tokens for ppo_clip, and w also scales a KL term; the denominator keeps
    counting every loss token (a weight is not a mask)."""
    from groupwise.models.forward import completion_logprobs, pack

    samples = make_samples(tokenizer, n=3)
    adv = [torch.full((s.length,), a) for s, a in zip(samples, (1.0, -0.5, 2.0))]
    weights = [torch.linspace(0.0, 2.0, s.length) for s in samples]
    ref = copy.deepcopy(tiny_model)
    over = ["optim.grad_clip=0", "loss.terms=[{name: ppo_clip}, {name: kl, weight: 0.5, estimator: k2}]"]
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01)
    got, _ = grads_after_step(tiny_model, tokenizer, samples, adv, over, ref=ref, weights=weights)
    model = copy.deepcopy(tiny_model)
    packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], tokenizer.pad_token_id)
    lp = completion_logprobs(model, packed).logprobs
    with torch.no_grad():
        lr = completion_logprobs(ref, packed).logprobs
    mask = torch.zeros_like(lp, dtype=torch.bool)
    a, w = torch.zeros_like(lp), torch.zeros_like(lp)
    for i, s in enumerate(samples):
        mask[i, :s.length], a[i, :s.length] = s.loss_mask, adv[i]
        w[i, :s.length] = weights[i]
    per_token = -a * lp + 0.5 * 0.5 * (lr - lp) ** 2
    ((w * per_token * mask).sum() / mask.sum()).backward()
    for n, p in model.named_parameters():
        assert_close(got[n], p.grad, rtol=1e-4, atol=1e-7)


def test_rows_with_zero_loss_weight_are_skipped_without_changing_the_gradient(tiny_model, tokenizer):
    samples = make_samples(tokenizer)
    adv = [torch.full((s.length,), float(i % 3) - 1.0) for i, s in enumerate(samples)]
    ones = [torch.ones(s.length) for s in samples]
    zero_first = [torch.zeros(s.length) if i == 0 else torch.ones(s.length) for i, s in enumerate(samples)]
    base = ["optim.grad_clip=0", "loss.terms=[{name: ppo_clip}, {name: kl, weight: 1e-3}]"]  # nothing advantage-only
    ref = copy.deepcopy(tiny_model)
    full, m_full = grads_after_step(tiny_model, tokenizer, samples, adv, base, ref=ref, weights=ones)
    assert m_full["update/skipped_rows"] == 0
    rest, m = grads_after_step(tiny_model, tokenizer, samples[1:], adv[1:], base, ref=ref)
    skipped, m_skip = grads_after_step(tiny_model, tokenizer, samples, adv, base, ref=ref, weights=zero_first)
    assert m_skip["update/skipped_rows"] == 1 and m_skip["update/loss_tokens"] == m_full["update/loss_tokens"]
    # row 0 carries no loss but still counts in the token denominator: rest's gradient scaled by its share
    share = (m["update/loss_tokens"]) / m_skip["update/loss_tokens"]
    for k in skipped:
        assert_close(skipped[k], rest[k] * share, rtol=1e-4, atol=1e-7)
