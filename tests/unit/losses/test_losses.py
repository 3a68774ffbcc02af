import math

import torch
from torch.testing import assert_close

from groupwise.losses.reduce import Normalizer, reduce
from groupwise.standard.kl import KLConfig, kl
from groupwise.standard.ppo_clip import PPOClipConfig, ppo_clip
from groupwise.types import LossInputs


def inputs(logprobs, old, adv, mask=None, ref=None):
    lp = torch.tensor(logprobs, dtype=torch.float64, requires_grad=True)
    m = torch.ones_like(lp, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return LossInputs(logprobs=lp, old_logprobs=torch.tensor(old, dtype=torch.float64),
                      advantages=torch.tensor(adv, dtype=torch.float64), completion_mask=m,
                      rollout_logprobs=torch.full(lp.shape, math.nan),
                      ref_logprobs=None if ref is None else torch.tensor(ref, dtype=torch.float64))


def test_ppo_clip_pinned():
    # tokens: ratio e^{0.5}=1.6487 (A=+1, clipped at 1.2 -> -1.2); ratio e^{-0.5}=0.6065 (A=-1: min(-0.6065, -0.8)
    # = -0.8 -> loss 0.8); ratio 1 (A=2 -> -2); ratio e^{0.1}=1.10517 (A=-1 -> min(-1.10517, -1.10517) -> 1.10517)
    inp = inputs([[0.5, -0.5], [0.0, 0.1]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, -1.0], [2.0, -1.0]])
    out = ppo_clip(inp, PPOClipConfig())
    assert_close(out.per_token, torch.tensor([[-1.2, 0.8], [-2.0, math.exp(0.1)]], dtype=torch.float64),
                 rtol=0, atol=1e-12)
    assert out.metrics["loss/clip_frac_high"] == (1.0, 4.0)
    assert out.metrics["loss/clip_frac_low"] == (1.0, 4.0)


def test_ppo_clip_higher_asymmetric():
    inp = inputs([[0.25]], [[0.0]], [[1.0]])  # ratio 1.284
    out = ppo_clip(inp, PPOClipConfig(clip_low=0.2, clip_high=0.28))
    assert_close(out.per_token, torch.tensor([[-1.28]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_ppo_clip_on_policy_gradient_is_minus_advantage():
    # ratio 1: d/dlogp [-(ratio·A)] = -A
    inp = inputs([[-1.3, -0.2, -2.0]], [[-1.3, -0.2, -2.0]], [[0.5, -2.0, 1.5]])
    ppo_clip(inp, PPOClipConfig()).per_token.sum().backward()
    assert_close(inp.logprobs.grad, torch.tensor([[-0.5, 2.0, -1.5]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_ppo_clip_clipped_token_has_no_gradient():
    inp = inputs([[0.5]], [[0.0]], [[1.0]])
    ppo_clip(inp, PPOClipConfig()).per_token.sum().backward()
    assert inp.logprobs.grad.item() == 0.0


def test_kl_estimators_pinned():
    # x = ref − logp = −0.5 - (−1.0) = 0.5
    inp = inputs([[-1.0]], [[-1.0]], [[0.0]], ref=[[-0.5]])
    assert_close(kl(inp, KLConfig(estimator="k1")).per_token, torch.tensor([[-0.5]], dtype=torch.float64))
    assert_close(kl(inp, KLConfig(estimator="k2")).per_token, torch.tensor([[0.125]], dtype=torch.float64))
    assert_close(kl(inp, KLConfig(estimator="k3")).per_token,
                 torch.tensor([[math.exp(0.5) - 1 - 0.5]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_kl_k3_gradient_matches_autograd_by_hand():
    # d/dlogp [exp(ref - logp) - 1 - (ref - logp)] = -exp(ref - logp) + 1
    inp = inputs([[-1.0, -2.0]], [[0, 0]], [[0, 0]], ref=[[-0.5, -2.5]])
    kl(inp, KLConfig()).per_token.sum().backward()
    expected = torch.tensor([[1 - math.exp(0.5), 1 - math.exp(-0.5)]], dtype=torch.float64)
    assert_close(inp.logprobs.grad, expected, rtol=0, atol=1e-12)


def test_reductions_pinned():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    norm = Normalizer(tokens=4.0, seqs=2.0, const=10.0)
    assert reduce(loss, mask, norm, "token_mean").item() == (1 + 2 + 3 + 4) / 4
    assert reduce(loss, mask, norm, "seq_mean_token_mean").item() == ((6 / 3) + 4) / 2
    assert reduce(loss, mask, norm, "seq_sum_const").item() == 10 / (2 * 10)


def test_reductions_are_micro_batch_invariant_and_padding_invariant():
    torch.manual_seed(0)
    loss = torch.randn(8, 6)
    mask = torch.rand(8, 6) > 0.3
    mask[3] = False  # a fully masked row counts in no denominator
    norm = Normalizer.from_masks(list(mask), const=6.0)
    assert norm.seqs == 7
    for mode in ("token_mean", "seq_mean_token_mean", "seq_sum_const"):
        full = reduce(loss, mask, norm, mode)
        parts = sum(reduce(loss[i:i + 2], mask[i:i + 2], norm, mode) for i in range(0, 8, 2))
        assert_close(full, parts, rtol=0, atol=1e-6)
        padded = reduce(torch.cat([loss, torch.randn(8, 3)], 1),
                        torch.cat([mask, torch.zeros(8, 3, dtype=torch.bool)], 1), norm, mode)
        assert_close(full, padded, rtol=0, atol=1e-6)
