import copy
import math

import pytest
import support
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.garl.advantage import GARLConfig, amplification, garl, ln_q
from groupwise.registry import ConfigError, NoConfig
from groupwise.standard.grpo import GRPOConfig, grpo, rloo
from groupwise.types import Group, Problem, Sample, ScoredBatch, TokenBatch


def batch(correct, mask=None, rewards=None) -> ScoredBatch:
    c = torch.tensor(correct, dtype=torch.bool)
    m = torch.ones_like(c) if mask is None else torch.tensor(mask)
    r = c.to(torch.float64) if rewards is None else torch.tensor(rewards, dtype=torch.float64)
    return ScoredBatch([], r * m, c & m, torch.zeros_like(r), m)


# ------------------------------------------------------------------------------------------ ln_q
def test_ln_q_pinned_and_limits():
    u = torch.tensor([0.25, 0.5, 1.0, 2.0], dtype=torch.float64)
    assert_close(ln_q(u, 0.0), u - 1, rtol=0, atol=1e-15)
    # q = 0.5: (u^0.5 − 1)/0.5 → 0.25: (0.5 − 1)/0.5 = −1
    assert_close(ln_q(u, 0.5)[0], torch.tensor(-1.0, dtype=torch.float64), rtol=0, atol=1e-15)
    for q in (1 - 1e-6, 1 + 1e-6):  # continuous at q → 1
        assert_close(ln_q(u, q), torch.log(u), rtol=0, atol=1e-6)
    assert torch.equal(ln_q(u, 1.0), torch.log(u))


@pytest.mark.parametrize("q", [0.0, 0.3, 0.75, 1.0])
def test_ln_q_increasing_with_derivative_u_to_minus_q(q):
    u = torch.linspace(0.05, 3.0, 40, dtype=torch.float64, requires_grad=True)
    y = ln_q(u, q)
    assert bool((y[1:] > y[:-1]).all())
    y.sum().backward()
    assert_close(u.grad, u.detach() ** (-q), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------ garl
def test_garl_pinned_on_rloo():
    b = batch([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    base = rloo(b, NoConfig())  # row 0: [1, −1/3, −1/3, −1/3]; row 1: [2/3, 2/3, −2/3, −2/3]
    out = garl(b, base, GARLConfig(q=0.5))
    # P̂ = 0.25 → 0.25^−0.5 = 2;  P̂ = 0.5 → √2;  all-wrong → base 0;  all-correct → amp 1, base 0
    expected = torch.tensor([[2, -2 / 3, -2 / 3, -2 / 3],
                             [math.sqrt(2) * 2 / 3, math.sqrt(2) * 2 / 3, -math.sqrt(2) * 2 / 3, -math.sqrt(2) * 2 / 3],
                             [0, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    assert_close(out, expected, rtol=0, atol=1e-12)


def test_garl_amp_max_caps_and_padding_is_zero():
    # group of 3 real samples [1, 0, 0] + one pad: P̂ = 1/3, q = 1 → amp 3, capped at 2.5
    b = batch([[1, 0, 0, 0]], mask=[[True, True, True, False]])
    base = torch.tensor([[1.0, -0.5, -0.5, 7.0]], dtype=torch.float64)
    assert_close(garl(b, base, GARLConfig(q=1.0)), torch.tensor([[3.0, -1.5, -1.5, 0.0]], dtype=torch.float64),
                 rtol=0, atol=1e-12)
    assert_close(garl(b, base, GARLConfig(q=1.0, amp_max=2.5)),
                 torch.tensor([[2.5, -1.25, -1.25, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_amplification_floor_clips_p_to_zero():
    # P̂ = 0 is floored at 1/M: amp = M^q = 8^0.75 = 4.7568
    amp = amplification(torch.tensor([[0.0]], dtype=torch.float64), torch.tensor([[8.0]], dtype=torch.float64), 0.75)
    assert_close(amp, torch.tensor([[8 ** 0.75]], dtype=torch.float64), rtol=0, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.data(), st.floats(0, 1))
def test_amplification_lies_in_1_to_m_to_the_q(m, data, q):
    k = data.draw(st.integers(0, m))
    amp = amplification(torch.tensor([[k / m]], dtype=torch.float64), torch.tensor([[float(m)]], dtype=torch.float64),
                        q)
    assert 1 - 1e-12 <= amp.item() <= m ** q + 1e-9


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=5))
def test_q0_is_the_identity_on_any_base_advantage(rows):
    b = batch(rows)
    for base in (grpo(b, GRPOConfig()), rloo(b, NoConfig())):
        assert torch.equal(garl(b, base, GARLConfig(q=0.0)), base)


def test_success_from_graded_reward_and_its_range_check():
    # rewards [0.5, 0, 0, 0] → P̂ = 0.125, q = 1 → amp 8, but M = 4 floors P̂ at 0.25 → amp 4
    b = batch([[0, 0, 0, 0]], rewards=[[0.5, 0, 0, 0]])
    out = garl(b, torch.ones(1, 4, dtype=torch.float64), GARLConfig(q=1.0, success="reward"))
    assert_close(out, torch.full((1, 4), 4.0, dtype=torch.float64), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"rewards in \[0, 1\]"):
        garl(batch([[0, 0]], rewards=[[1.5, 0]]), torch.ones(1, 2), GARLConfig(success="reward"))


def test_bias_of_the_amplification_shrinks_with_m_and_grows_with_q():
    """E[max(P̂, 1/M)^−q]/P^−q − 1 over Binomial(M, P) draws (exact enumeration, the floor included):
    delta method q(q+1)(1−P)/(2MP) (spec property 5)."""
    def rel_bias(m, p, q):
        ks = range(0, m + 1)
        probs = [math.comb(m, k) * p**k * (1 - p) ** (m - k) for k in ks]
        amps = amplification(torch.tensor([k / m for k in ks], dtype=torch.float64),
                             torch.full((m + 1,), float(m), dtype=torch.float64), q)
        return sum(pr * a for pr, a in zip(probs, amps.tolist())) / p ** (-q) - 1

    for q in (0.5, 0.75, 1.0):
        biases = [rel_bias(m, 0.3, q) for m in (8, 16, 32, 64, 128)]
        assert all(a > b > 0 for a, b in zip(biases, biases[1:]))
        assert 1.9 < biases[-2] / biases[-1] < 2.2  # ≈ 1/M at large M
        assert biases[-1] == pytest.approx(q * (q + 1) * 0.7 / (2 * 128 * 0.3), rel=0.1)
    assert rel_bias(32, 0.3, 0.5) < rel_bias(32, 0.3, 0.75) < rel_bias(32, 0.3, 1.0)


def test_escape_time_scaling_under_gradient_flow():
    """Gradient flow on one logit z, p = σ(z), objective ln_q(p): dp/dt = σ'(z)·d ln_q(σ(z))/dz (autograd).
    Time from p0 to 1/2 = ∫ dp / (dp/dt); the ratio for p0 = 1e-3 vs 1e-2 is ≈ 9.4, 3.1, 2.0, 1.4 at
    q = 0, 0.5, 0.75, 1 (spec property 6): Ω(1/p0) at q = 0, Θ(log 1/p0) at q = 1."""
    def time_to_half(p0, q):
        p = torch.logspace(math.log10(p0), math.log10(0.5), 20001, dtype=torch.float64)
        z = torch.logit(p).requires_grad_(True)
        (dz,) = torch.autograd.grad(ln_q(torch.sigmoid(z), q).sum(), z)
        rate = p * (1 - p) * dz
        return torch.trapezoid(1 / rate, p).item()

    ratios = [time_to_half(1e-3, q) / time_to_half(1e-2, q) for q in (0.0, 0.5, 0.75, 1.0)]
    for got, want in zip(ratios, (9.4, 3.1, 2.0, 1.4)):
        assert abs(got - want) < 0.1, ratios


def test_bad_q_fails_at_load_with_one_line():
    with pytest.raises(ConfigError, match=r"advantage_transforms\.0: q=1\.5: the J_Q continuum needs 0 <= q <= 1"):
        load(None, ["advantage_transforms=[{name: garl, q: 1.5}]"])
    with pytest.raises(ValueError, match="amp_max"):
        GARLConfig(amp_max=0.5)
    cfg = load(None, ["advantage.name=rloo", "advantage_transforms=[{name: garl, q: 0.75}]"])
    assert cfg.advantage_transforms[0].cfg == GARLConfig(q=0.75)


# --------------------------------------------------------------------------- through the update
def make_groups(n_groups=3, g=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    patterns = [[1, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0]]
    groups = []
    for i in range(n_groups):
        samples = []
        for j in range(g):
            c = torch.randint(2, 100, (2 + (i * 3 + j * 5) % 7,), generator=gen)
            ok = bool(patterns[i % 4][j])
            samples.append(Sample(prompt_ids=torch.randint(2, 100, (3 + i,), generator=gen), completion_ids=c,
                                  rollout_logprobs=torch.zeros(len(c)), loss_mask=torch.ones_like(c, dtype=torch.bool),
                                  finish_reason="stop", correct=ok, reward=float(ok)))
        groups.append(Group(Problem(id=f"p{i}", prompt="x", answer="1"), samples))
    return groups


def learner_grads(model, tokenizer, groups, adv, overrides=()):
    model = copy.deepcopy(model)
    learner = support.learner(model, tokenizer, ["optim.grad_clip=0", *overrides])
    captured = {}
    real = learner.optimizer.step

    def capture(*a, **k):
        captured.update({n: p.grad.clone() for n, p in model.named_parameters()})
        return real(*a, **k)

    learner.optimizer.step = capture
    learner.step(TokenBatch.build(groups, adv))
    return captured


def test_q0_gradient_equals_grpo_through_the_learner(tiny_model, tokenizer):
    groups = make_groups()
    b = ScoredBatch.from_groups(groups)
    plain = grpo(b, GRPOConfig())
    with_garl = garl(b, plain, GARLConfig(q=0.0))
    g1 = learner_grads(tiny_model, tokenizer, groups, plain)
    g2 = learner_grads(tiny_model, tokenizer, groups, with_garl)
    for k in g1:
        assert torch.equal(g1[k], g2[k]), k


def test_garl_gradient_matches_the_amplified_objective(tiny_model, tokenizer):
    """On-policy ppo_clip + token_mean: grad = −Σ_rows amp_i (r_m − b_m) Σ_t ∇log π / tokens."""
    from groupwise.models.forward import completion_logprobs, pack

    groups = make_groups()
    b = ScoredBatch.from_groups(groups)
    adv = garl(b, rloo(b, NoConfig()), GARLConfig(q=0.75))
    got = learner_grads(tiny_model, tokenizer, groups, adv)
    # hand-written: group 0 P̂ = 1/4 → amp 4^0.75; group 1 P̂ = 3/4 → (4/3)^0.75; group 2 all wrong → 0
    loo = [[1, -1 / 3, -1 / 3, -1 / 3], [1 / 3, 1 / 3, -1, 1 / 3], [0, 0, 0, 0]]
    amps = [4**0.75, (4 / 3) ** 0.75, 0.0]
    model = copy.deepcopy(tiny_model)
    samples = [s for g in groups for s in g.samples]
    packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], tokenizer.pad_token_id)
    lp = completion_logprobs(model, packed).logprobs
    weights = torch.tensor([amps[i] * loo[i][j] for i in range(3) for j in range(4)], dtype=lp.dtype)
    mask = torch.zeros_like(lp, dtype=torch.bool)
    for k, s in enumerate(samples):
        mask[k, :s.length] = True
    (-(weights[:, None] * lp * mask).sum() / mask.sum()).backward()
    for n, p in model.named_parameters():
        assert_close(got[n], p.grad, rtol=1e-4, atol=1e-7)
