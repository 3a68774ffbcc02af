"""``maxrl``, pinned by hand and against prime-rl's lines on the same groups."""

import torch
from test_grpo import batch
from torch.testing import assert_close

from groupwise.registry import NoConfig
from groupwise.standard.grpo import dr_grpo
from groupwise.standard.maxrl import maxrl


def test_maxrl_pinned_by_hand():
    # [1, 0, 0, 0]: mean 0.25 → (1 − .25)/.25 = 3, (0 − .25)/.25 = −1 (prime-rl's test_max_rl_mean_normalized);
    # [0.5, 1, 0]: mean 0.5 → 0, 1, −1; [1, 0 | pad, pad]: mean 0.5 → 1, −1, and 0 on padding
    adv = maxrl(batch([[1, 0, 0, 0], [0.5, 1, 0, 0], [1, 0, 0, 0]],
                      mask=[[True] * 4, [True, True, True, False], [True, True, False, False]]), NoConfig())
    want = torch.tensor([[3.0, -1.0, -1.0, -1.0], [0.0, 1.0, -1.0, 0.0], [1.0, -1.0, 0.0, 0.0]], dtype=torch.float64)
    assert_close(adv, want, rtol=0, atol=1e-12)


def test_maxrl_groups_without_signal_are_zero():
    # no success (mean 0), all successes (constant), a singleton, a constant 0.1 group (float mean ≠ 0.1 exactly),
    # and a group with mean <= 0 (negative rewards: prime-rl's mean <= 0 rule)
    adv = maxrl(batch([[0, 0, 0], [1, 1, 1], [0.7, 0, 0], [0.1, 0.1, 0.1], [-1.0, 0.5, 0.5]],
                      mask=[[True] * 3, [True] * 3, [True, False, False], [True] * 3, [True] * 3]), NoConfig())
    assert torch.equal(adv, torch.zeros(5, 3, dtype=torch.float64))


def test_maxrl_is_dr_grpo_over_the_pass_rate():
    """A = (r − mean)/mean: for 0/1 rewards at pass rate p a success gets (1 − p)/p, ~1/p on hard problems."""
    g = torch.Generator().manual_seed(0)
    r = (torch.rand(8, 6, generator=g) < torch.linspace(0.1, 0.9, 8)[:, None]).double()
    b = batch(r.tolist())
    mean = r.mean(-1, keepdim=True)
    signal = (mean > 0) & (mean < 1)
    assert 0 < int(signal.sum()) < 8
    assert_close(maxrl(b, NoConfig()) * torch.where(signal, mean, 1.0), dr_grpo(b, NoConfig()), rtol=0, atol=1e-12)


def prime_rl_max_rl(rewards):
    """prime-rl (PrimeIntellect-ai/prime-rl@559b44772e471d1538537b8805cc77f3824a5e64),
    src/prime_rl/orchestrator/algo/max_rl.py lines 24-26 (``MaxRLAlgorithm.score_group``), verbatim but for the
    rewards given as a list instead of read from the episodes' traces."""
    rewards = torch.tensor(rewards, dtype=torch.float32)
    mean = rewards.mean()
    advantages = torch.zeros_like(rewards) if mean <= 0 else (rewards - mean) / mean
    return advantages


def test_maxrl_equals_prime_rls_on_identical_groups():
    """prime-rl computes in float32 (and a constant group's float mean may leave it ~1e-8 off zero, where ours is
    exactly 0): equal within float32 rounding on 0/1, graded, all-fail, all-pass and negative-mean groups."""
    g = torch.Generator().manual_seed(1)
    groups = [*(torch.rand(8, generator=g) < p for p in (0.1, 0.3, 0.5, 0.9)), torch.rand(8, generator=g),
              torch.zeros(8), torch.ones(8), torch.rand(8, generator=g) - 0.9]
    rewards = torch.stack([x.double() for x in groups]).float().double()  # values float32 holds exactly
    ours = maxrl(batch(rewards.tolist()), NoConfig())
    theirs = torch.stack([prime_rl_max_rl(row.tolist()) for row in rewards]).double()
    assert float(ours.abs().max()) > 1  # not a vacuous comparison of zeros
    assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
