import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.lampo.advantage import LamPOConfig, lampo, sequence_scores
from groupwise.registry import ConfigError, NoConfig
from groupwise.standard.grpo import rloo
from groupwise.types import Group, Problem, Sample, ScoredBatch


def sample(reward, logprobs, mask=None):
    lp = torch.tensor(logprobs, dtype=torch.float32)
    m = torch.ones(len(logprobs), dtype=torch.bool) if mask is None else torch.tensor(mask)
    return Sample(prompt_ids=torch.tensor([1]), completion_ids=torch.arange(2, 2 + len(logprobs)), rollout_logprobs=lp,
                  loss_mask=m, finish_reason="stop", correct=reward == 1, reward=float(reward))


def batch(rows) -> ScoredBatch:
    """rows: per group, a list of (reward, per-token rollout log-probs)."""
    return ScoredBatch.from_groups([Group(Problem(id=f"p{i}", prompt="x", answer="1"), [sample(r, lp) for r, lp in row])
                                    for i, row in enumerate(rows)])


def test_lampo_pinned():
    # mean scores s = [−1, −2, −0.5]; R = [1, 0, 0]; β = 1
    # w01 = σ(−1·(+1)·(−1 − (−2))) = σ(−1) = 0.2689414;  w02 = σ(−(−1 + 0.5)) = σ(0.5) = 0.6224593; pair (1,2) tie
    # A0 = (2/2)(w01 + w02) = 0.8914007;  A1 = −w01;  A2 = −w02
    b = batch([[(1, [-0.5, -1.5]), (0, [-2.0, -2.0, -2.0]), (0, [-0.5])]])
    s1, s2 = 1 / (1 + math.exp(1)), 1 / (1 + math.exp(-0.5))
    assert_close(lampo(b, LamPOConfig(beta=1.0)), torch.tensor([[s1 + s2, -s1, -s2]], dtype=torch.float64),
                 rtol=0, atol=1e-7)


def test_score_sum_and_skipped_tokens():
    # sum scores: [−2, −6, −0.5] → w01 = σ(−4), w02 = σ(1.5)
    b = batch([[(1, [-0.5, -1.5]), (0, [-2.0, -2.0, -2.0]), (0, [-0.5])]])
    w01, w02 = 1 / (1 + math.exp(4)), 1 / (1 + math.exp(-1.5))
    assert_close(lampo(b, LamPOConfig(beta=1.0, score="sum")),
                 torch.tensor([[w01 + w02, -w01, -w02]], dtype=torch.float64), rtol=0, atol=1e-7)
    # prefilled (loss_mask False) and edited (NaN) tokens do not count; a sample with none known is unknown
    g = Group(Problem(id="p", prompt="x", answer="1"),
              [sample(1, [-9.0, -1.0, math.nan], [False, True, True]), sample(0, [math.nan, math.nan])])
    s, known = sequence_scores(ScoredBatch.from_groups([g]), "mean")
    assert s[0, 0].item() == -1.0 and known.tolist() == [[True, False]]


def test_unknown_scores_give_half_weights():
    g = Group(Problem(id="p", prompt="x", answer="1"), [sample(1, [-3.0]), sample(0, [math.nan])])
    b = ScoredBatch.from_groups([g])
    assert_close(lampo(b, LamPOConfig(beta=10.0)), rloo(b, NoConfig()), rtol=0, atol=1e-12)


def random_batch(seed, n=4, g=6, binary=False):
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        row = []
        for _ in range(g):
            r = float(torch.rand((), generator=gen) < 0.4) if binary else round(float(torch.rand((), generator=gen)), 2)
            row.append((r, (-torch.rand(1 + int(torch.randint(0, 5, (), generator=gen)), generator=gen) * 3).tolist()))
        rows.append(row)
    return rows


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0, 10))
def test_zero_sum_equivariance_and_beta0_is_rloo(seed, beta):
    rows = random_batch(seed)
    b = batch(rows)
    adv = lampo(b, LamPOConfig(beta=beta))
    assert adv.sum(-1).abs().max() < 1e-9
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(seed))
    permuted = lampo(batch([[row[k] for k in perm.tolist()] for row in rows]), LamPOConfig(beta=beta))
    assert_close(permuted, adv[:, perm], rtol=0, atol=1e-12)
    assert_close(lampo(b, LamPOConfig(beta=0.0)), rloo(b, NoConfig()), rtol=0, atol=1e-12)  # G/(G−1)(R − R̄)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.1, 10))
def test_binary_mixed_groups_have_the_sign_of_correctness(seed, beta):
    b = batch(random_batch(seed, binary=True))
    adv = lampo(b, LamPOConfig(beta=beta))
    r = b.rewards
    mixed = (r.max(-1).values > r.min(-1).values)[:, None].expand_as(r)
    assert bool((torch.sign(adv[mixed]) == torch.sign(r[mixed] - 0.5)).all())
    assert bool((adv[~mixed] == 0).all())


def test_degenerate_groups_and_padding():
    rows = [[(1, [-1.0]), (1, [-2.0]), (1, [-3.0])], [(0.5, [-1.0])]]  # all equal; singleton (padded to 3)
    assert torch.equal(lampo(batch(rows), LamPOConfig()), torch.zeros(2, 3, dtype=torch.float64))


def test_surprising_wrong_sample_gets_more_weight():
    """Spec property 6: raising s_j of a wrong response j raises A_i of every correct i and lowers A_j."""
    base = [(1, [-1.0]), (1, [-1.5]), (0, [-2.0]), (0, [-2.5])]
    lifted = [*base[:2], (0, [-0.8]), base[3]]
    a, b = lampo(batch([base]), LamPOConfig()), lampo(batch([lifted]), LamPOConfig())
    assert bool((b[0, :2] > a[0, :2]).all()) and b[0, 2] < a[0, 2] and b[0, 3] == a[0, 3]


def test_std_norm():
    # β = 0, R = [1, 0, 0, 0]: rloo [1, −1/3, ...] over std (ddof 1) 0.5 + 1e-4
    b = batch([[(1, [-1.0]), (0, [-1.0]), (0, [-1.0]), (0, [-1.0])]])
    assert_close(lampo(b, LamPOConfig(beta=0.0, std_norm=True)),
                 torch.tensor([[1, -1 / 3, -1 / 3, -1 / 3]], dtype=torch.float64) / 0.5001, rtol=0, atol=1e-12)


def test_bad_config_fails_at_load():
    with pytest.raises(ConfigError, match=r"advantage: beta=-1\.0: the confidence temperature must be finite and >= 0"):
        load(None, ["advantage={name: lampo, beta: -1.0}"])
    with pytest.raises(ConfigError, match="advantage.score"):
        load(None, ["advantage={name: lampo, score: median}"])
    assert load(None, ["advantage={name: lampo, beta: 1}"]).advantage.cfg == LamPOConfig(beta=1.0)
