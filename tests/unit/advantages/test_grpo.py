import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from groupwise.registry import NoConfig
from groupwise.standard.grpo import GRPOConfig, dr_grpo, grpo, rloo
from groupwise.types import ScoredBatch


def batch(rewards, mask=None) -> ScoredBatch:
    r = torch.tensor(rewards, dtype=torch.float64)
    m = torch.ones_like(r, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return ScoredBatch([], r * m, torch.zeros_like(m), torch.zeros_like(r), m)


def test_grpo_one_success_in_four():
    # mean 0.25; ddof=1 var = (0.75² + 3·0.25²)/3 = 0.25 → std 0.5; A = (r − .25)/(.5 + 1e-4)
    adv = grpo(batch([[1, 0, 0, 0]]), GRPOConfig())
    assert_close(adv, torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64) / 0.5001, rtol=0, atol=1e-12)


def test_grpo_population_std_and_eps():
    # ddof=0: std = sqrt(0.1875) = 0.4330127; eps 1e-6
    adv = grpo(batch([[1, 0, 0, 0]]), GRPOConfig(ddof=0, eps=1e-6))
    assert_close(adv[0, 0], torch.tensor(0.75 / (math.sqrt(0.1875) + 1e-6), dtype=torch.float64), rtol=0, atol=1e-12)


def test_grpo_degenerate_groups_are_zero():
    adv = grpo(batch([[1, 1, 1, 1], [0, 0, 0, 0], [0.3, 0.3, 0.3, 0.3]]), GRPOConfig())
    assert torch.equal(adv, torch.zeros(3, 4, dtype=torch.float64))


def test_grpo_singleton_and_padding():
    # group 0 has one real sample (singleton -> 0); group 1 has 3 real samples [1, 0, 0] and one pad.
    adv = grpo(batch([[1, 0, 0], [1, 0, 0]], mask=[[True, False, False], [True, True, True]]), GRPOConfig())
    # group 1: mean 1/3, ddof=1 var = (4/9 + 1/9 + 1/9)/2 = 1/3 → std 0.57735
    std = math.sqrt(1 / 3)
    expected = torch.tensor([[0, 0, 0], [(2 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4)]],
                            dtype=torch.float64)
    assert_close(adv, expected, rtol=0, atol=1e-12)


def test_dr_grpo_and_rloo_pinned():
    b = batch([[1, 0, 0, 0]])
    assert_close(dr_grpo(b, NoConfig()), torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64))
    # rloo: 1 − mean(0,0,0) = 1; 0 − mean(1,0,0) = −1/3
    assert_close(rloo(b, NoConfig()), torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]], dtype=torch.float64))


def test_rloo_singleton_is_zero():
    assert torch.equal(rloo(batch([[5.0]]), NoConfig()), torch.zeros(1, 1, dtype=torch.float64))


def test_grpo_equals_dr_grpo_over_std():
    b = batch([[0.2, 0.9, 0.4, 0.0, 1.0]])
    std = torch.tensor([0.2, 0.9, 0.4, 0.0, 1.0], dtype=torch.float64).std()
    assert_close(grpo(b, GRPOConfig(eps=0.0)), dr_grpo(b, NoConfig()) / std, rtol=0, atol=1e-12)


rewards = st.lists(st.lists(st.floats(-5, 5, allow_nan=False), min_size=4, max_size=4), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(rewards, st.floats(-3, 3), st.floats(0.1, 10))
def test_properties_zero_mean_shift_and_scale(r, shift, scale):
    b = batch(r)
    for fn, cfg in ((grpo, GRPOConfig()), (dr_grpo, NoConfig()), (rloo, NoConfig())):
        adv = fn(b, cfg)
        assert adv.sum(-1).abs().max() < 1e-9  # zero mean per group
        assert_close(fn(batch([[x + shift for x in row] for row in r]), cfg), adv, rtol=0, atol=1e-9)
    # std-normalised advantages are scale invariant up to eps
    a1 = grpo(b, GRPOConfig(eps=0.0))
    a2 = grpo(batch([[x * scale for x in row] for row in r]), GRPOConfig(eps=0.0))
    assert_close(a1, a2, rtol=1e-6, atol=1e-6)


def test_bad_config():
    with pytest.raises(ValueError, match="ddof"):
        GRPOConfig(ddof=2)


@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_constant_group_whose_float_std_is_not_zero_gives_exactly_zero(eps):
    # six rewards of 0.1: their float mean is not exactly 0.1, so the computed std is ~1e-17 > 0; before the
    # fix, eps = 0 turned that round-off into advantages of about ±0.9 (docs/conventions.md promises 0)
    b = batch([[0.1] * 6, [0.1] * 5 + [0.0]])
    from groupwise.advantages.stats import group_std

    assert float(group_std(b.rewards, b.mask)[0]) > 0  # the premise: round-off, not a true spread
    adv = grpo(b, GRPOConfig(eps=eps))
    assert torch.equal(adv[0], torch.zeros(6, dtype=torch.float64))
    assert adv[1].abs().max() > 0.4  # a real spread still gives a signal
    for fn in (dr_grpo, rloo):
        assert torch.equal(fn(b, NoConfig())[0], torch.zeros(6, dtype=torch.float64))
