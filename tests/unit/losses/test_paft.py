import copy
import math

import pytest
import support
import torch
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.garl.advantage import GARLConfig, PAFTConfig, garl
from groupwise.methods.garl.advantage import paft as paft_weights
from groupwise.methods.garl.loss import PAFTLossConfig, paft
from groupwise.registry import ConfigError
from groupwise.types import Group, LossInputs, Problem, Sample, ScoredBatch, TokenBatch

PAIRED = ["advantage={name: paft, resample: expected}", "loss.terms=[paft]"]


def batch(correct, mask=None, step=0, rewards=None) -> ScoredBatch:
    c = torch.tensor(correct, dtype=torch.bool)
    m = torch.ones_like(c) if mask is None else torch.tensor(mask)
    r = c.to(torch.float64) if rewards is None else torch.tensor(rewards, dtype=torch.float64)
    return ScoredBatch([], r * m, c & m, torch.zeros_like(r), m, step)


# ------------------------------------------------------------------------- resampling weights
def test_expected_weights_pinned():
    # w_m = P̂^{1−q}·M·r_m/Σr = P̂^{−q}·r_m.  q = 0.75: P̂ = 1/4 → 4^0.75 = 2.828427; P̂ = 1/2 → 2^0.75 = 1.681793
    out = paft_weights(batch([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]),
                       PAFTConfig(q=0.75, resample="expected"))
    a, b = 4**0.75, 2**0.75
    expected = torch.tensor([[a, 0, 0, 0], [b, b, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    assert_close(out, expected, rtol=0, atol=1e-12)


def test_q1_is_sft_on_successes_with_weight_1_over_p_and_q0_is_plain_reward():
    b = batch([[1, 0, 0, 0, 1, 0, 0, 0]])
    assert_close(paft_weights(b, PAFTConfig(q=1.0, resample="expected")),  # 1/P̂ = 4
                 torch.tensor([[4, 0, 0, 0, 4, 0, 0, 0]], dtype=torch.float64), rtol=0, atol=1e-12)
    assert_close(paft_weights(b, PAFTConfig(q=0.0, resample="expected")), b.rewards, rtol=0, atol=1e-12)


def test_sampled_weights_are_resample_counts():
    b = batch([[1, 0, 1, 0, 0, 0, 1, 0], [0] * 8, [1] * 8], step=7)
    cfg = PAFTConfig(q=0.5)
    w = paft_weights(b, cfg)
    assert torch.equal(w, paft_weights(b, cfg))  # seeded from (step, group, problem): deterministic
    p_hat = torch.tensor([3 / 8, 0, 1], dtype=torch.float64)
    counts = w * 8 / (p_hat[:, None] ** 0.5 * 8).clamp(min=1e-12)  # c_m = w_m·K_r/(P̂^{1−q}·M), K_r = M = 8
    assert_close(counts, counts.round(), rtol=0, atol=1e-9)
    assert_close(counts.sum(-1), torch.tensor([8.0, 0.0, 8.0], dtype=torch.float64), rtol=0, atol=1e-9)
    assert bool((w[0][~b.correct[0]] == 0).all()) and bool((w[1] == 0).all())  # only successes are drawn
    assert not torch.equal(w, paft_weights(batch(b.correct.tolist(), step=8), cfg))


def test_k_r_sets_the_number_of_draws_and_the_mean_matches_the_expectation():
    cfg = PAFTConfig(q=0.75, k_r=3)
    rows = [paft_weights(batch([[1, 1, 0, 1]], step=s), cfg) for s in range(3000)]
    # each draw gives P̂^{1−q}·M/K_r = 0.75^0.25·4/3 to one success
    unit = 0.75**0.25 * 4 / 3
    assert_close(rows[0].sum() / unit, torch.tensor(3.0, dtype=torch.float64), rtol=0, atol=1e-9)
    mean = torch.stack(rows).mean(0)
    assert_close(mean, paft_weights(batch([[1, 1, 0, 1]]), PAFTConfig(q=0.75, resample="expected")), rtol=0,
                 atol=0.05)


def test_padding_and_graded_success():
    # rewards [0.5, 0.25, 0, pad]: M = 3, P̂ = 0.25, expected w = P̂^{−q}·r = 2·r at q = 0.5
    b = batch([[0, 0, 0, 0]], mask=[[True, True, True, False]], rewards=[[0.5, 0.25, 0, 9]])
    out = paft_weights(b, PAFTConfig(q=0.5, success="reward", resample="expected"))
    assert_close(out, torch.tensor([[1.0, 0.5, 0, 0]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_expected_paft_equals_garl_without_baseline():
    """Spec property 3: P̂^−q·(1/M)Σ r_m ∇log π(z_m) = P̂^{1−q}·mean_{m: r_m=1} ∇log π(z_m), per group."""
    torch.manual_seed(0)
    correct = (torch.rand(6, 8) < 0.3).tolist()
    b = batch(correct)
    grads = torch.randn(6, 8, 5, dtype=torch.float64)  # ∇log π(z_m), random stand-ins
    w = paft_weights(b, PAFTConfig(q=0.75, resample="expected"))  # per-row SFT weight (× 1/M under token_mean)
    garl_no_baseline = garl(b, b.rewards, GARLConfig(q=0.75))
    assert_close((w[..., None] * grads).mean(1), (garl_no_baseline[..., None] * grads).mean(1), rtol=0, atol=1e-12)
    r = b.rewards
    p_hat = r.mean(-1, keepdim=True)
    posterior_mean = (r[..., None] * grads).sum(1) / r.sum(-1, keepdim=True).clamp(min=1)
    assert_close((w[..., None] * grads).mean(1), p_hat ** 0.25 * posterior_mean, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------- loss term
def test_paft_loss_pinned_gradient_and_metric():
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=torch.float64, requires_grad=True)
    inp = LossInputs(logprobs=lp, old_logprobs=lp.detach(), completion_mask=torch.tensor([[True, True], [True, False]]),
                     advantages=torch.tensor([[2.0, 2.0], [0.0, 0.0]], dtype=torch.float64),
                     rollout_logprobs=torch.full((2, 2), math.nan))
    out = paft(inp, PAFTLossConfig())
    assert_close(out.per_token, torch.tensor([[2.0, 4.0], [0.0, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12)
    out.per_token.sum().backward()
    assert_close(lp.grad, torch.tensor([[-2.0, -2.0], [0.0, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12)
    assert out.metrics["loss/paft_nll"] == (3.0, 2.0)  # NLL of the fine-tuned row's tokens: (1 + 2) over 2


def make_groups():
    gen = torch.Generator().manual_seed(1)
    groups = []
    for i, pattern in enumerate(([1, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0])):
        samples = []
        for j, ok in enumerate(pattern):
            c = torch.randint(2, 100, (2 + (i * 3 + j * 5) % 7,), generator=gen)
            samples.append(Sample(prompt_ids=torch.randint(2, 100, (3 + i,), generator=gen), completion_ids=c,
                                  rollout_logprobs=torch.zeros(len(c)), loss_mask=torch.ones_like(c, dtype=torch.bool),
                                  finish_reason="stop", correct=bool(ok), reward=float(ok)))
        groups.append(Group(Problem(id=f"p{i}", prompt="x", answer="1"), samples))
    return groups


def learner_step(model, tokenizer, groups, adv, overrides):
    model = copy.deepcopy(model)
    learner = support.learner(model, tokenizer, ["optim.grad_clip=0", *overrides])
    captured = {}
    real = learner.optimizer.step
    learner.optimizer.step = lambda *a, **k: captured.update(
        {n: p.grad.clone() for n, p in model.named_parameters()}) or real(*a, **k)
    return captured, learner.step(TokenBatch.build(groups, adv))


def test_paft_update_equals_on_policy_pg_with_garl_no_baseline_and_skips_unpicked_rows(tiny_model, tokenizer):
    groups = make_groups()
    b = ScoredBatch.from_groups(groups)
    w = paft_weights(b, PAFTConfig(q=0.75, resample="expected"))
    g_paft, m = learner_step(tiny_model, tokenizer, groups, w, PAIRED)
    assert m["update/skipped_rows"] == 8  # the 3 + 1 + 4 failures carry weight 0
    assert m["loss/paft_nll"] > 0
    g_pg, _ = learner_step(tiny_model, tokenizer, groups, garl(b, b.rewards, GARLConfig(q=0.75)), [])
    for k in g_paft:
        assert_close(g_paft[k], g_pg[k], rtol=1e-5, atol=1e-7)


def test_pairing_and_ranges_fail_at_load():
    assert load(None, PAIRED).advantage.name == "paft"
    with pytest.raises(ConfigError,
                       match=r"loss.terms.0: loss 'paft' requires 'paft_weights'.*allowed: add advantage 'paft'"):
        load(None, ["loss.terms=[paft]"])
    with pytest.raises(ConfigError,
                       match=r"advantage: advantage 'paft' requires 'paft_loss'.*allowed: add loss 'paft'"):
        load(None, ["advantage.name=paft"])
    with pytest.raises(ConfigError, match=r"advantage 'paft' cannot run with advantage transform 'garl' "
                                          r"\(advantage_transforms.0\): both 'q_weighting'"):
        load(None, [*PAIRED, "advantage_transforms=[garl]"])
    with pytest.raises(ConfigError, match=r"advantage: q=-0\.5: the J_Q continuum"):
        load(None, ["advantage={name: paft, q: -0.5}", "loss.terms=[paft]"])
    with pytest.raises(ValueError, match="k_r=-1"):
        PAFTConfig(k_r=-1)
