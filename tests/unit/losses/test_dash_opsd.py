import math

import pytest
import torch
from torch.testing import assert_close

from groupwise.methods.opsd.dash_opsd import DASHConfig, dash_opsd, gates, horizon_weights
from groupwise.methods.opsd.loss import OPSDConfig, opsd
from groupwise.types import LossInputs, TeacherOutput


def rows(b=2, t=5, v=4, seed=0, mask=None):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(b, t, v, generator=g, dtype=torch.float64), -1).requires_grad_(True)
    lq = torch.log_softmax(torch.randn(b, t, v, generator=g, dtype=torch.float64), -1)
    m = torch.ones(b, t, dtype=torch.bool) if mask is None else torch.tensor(mask)
    teacher = TeacherOutput(lq[..., 0], vocab_logprobs=lq)
    return LossInputs(logprobs=lp[..., 0], old_logprobs=torch.zeros(b, t), advantages=torch.zeros(b, t),
                      completion_mask=m, rollout_logprobs=torch.zeros(b, t), teacher=teacher, vocab_logprobs=lp), lp


def test_zero_lambda_is_vanilla_opsd_bit_for_bit():
    inp, _ = rows()
    a = dash_opsd(inp, DASHConfig(gate="fixed", fixed_lambda=0.0)).per_token
    assert torch.equal(a, opsd(inp, OPSDConfig(beta=0.0)).per_token)


def test_constant_lambda_gives_the_geometric_horizon():
    lam = torch.full((1, 6), 0.5, dtype=torch.float64)
    w = horizon_weights(lam, torch.ones(1, 6, dtype=torch.bool))
    # w_k = (1 − 0.5^k) / 0.5 = 1, 1.5, 1.75, 1.875, 1.9375, 1.96875
    assert_close(w, torch.tensor([[1, 1.5, 1.75, 1.875, 1.9375, 1.96875]], dtype=torch.float64), rtol=0, atol=1e-12)


def backward_recursion_loss(r, lam, mask):
    """The paper's form for one row: A_T = r_T, A_t = r_t + λ_t A_{t+1}, L = Σ_t A_t over loss tokens."""
    total = r.new_zeros(())
    for b in range(r.shape[0]):
        idx = torch.nonzero(mask[b]).flatten().tolist()
        nxt = r.new_zeros(())
        for t in reversed(idx):
            nxt = r[b, t] + lam[b, t] * nxt
            total = total + nxt
    return total


def test_forward_weights_equal_the_backward_recursion_in_value_and_gradient():
    inp, lp = rows(mask=[[True, True, False, True, True], [True, True, True, False, False]])
    cfg = DASHConfig()
    out = dash_opsd(inp, cfg)
    (out.per_token * inp.completion_mask).sum().backward()
    g_forward = lp.grad.clone()
    inp2, lp2 = rows(mask=[[True, True, False, True, True], [True, True, True, False, False]])
    r = opsd(inp2, OPSDConfig(beta=0.0)).per_token
    lam = gates(r, inp2.completion_mask, cfg)
    loss = backward_recursion_loss(r, lam, inp2.completion_mask)
    assert loss.item() == pytest.approx((out.per_token * inp.completion_mask).sum().item(), abs=1e-12)
    loss.backward()
    assert_close(g_forward, lp2.grad, rtol=0, atol=1e-12)


def test_gate_properties():
    inp, _ = rows(mask=[[True, True, True, True, False]] * 2)
    r = opsd(inp, OPSDConfig(beta=0.0)).per_token
    lam = gates(r, inp.completion_mask, DASHConfig())
    assert not lam.requires_grad
    m = inp.completion_mask
    mean = (r.detach() * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)
    expected = torch.sigmoid(-5.0 * (r.detach() - mean))
    assert_close(lam, expected, rtol=0, atol=0)
    # λ = ½ exactly where r_t = r̄; an inverted gate is 1 − λ
    flat = gates(torch.full((1, 3), 0.2, dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool), DASHConfig())
    assert torch.equal(flat, torch.full((1, 3), 0.5, dtype=torch.float64))
    inv = gates(r, m, DASHConfig(gate_sign=-1))
    assert_close(inv, 1 - lam, rtol=0, atol=1e-12)
    w = horizon_weights(lam, m)
    k = torch.cumsum(m.double(), -1)
    assert ((w >= 1 - 1e-12) | ~m).all() and ((w <= k + 1e-12) | ~m).all() and (w[~m] == 0).all()


def test_scale_matched_uniform_divergence_is_vanilla_opsd():
    # identical per-token distributions in a row: r_t is the same for every t, so every gate is ½ and the
    # weights rise 1, 1.5, 1.75, ...; normalised to mean 1 they leave the row's token mean unchanged
    lp = torch.log(torch.tensor([[0.5, 0.5]] * 4, dtype=torch.float64)).unsqueeze(0)
    lq = torch.log(torch.tensor([[0.9, 0.1]] * 4, dtype=torch.float64)).unsqueeze(0)
    m = torch.ones(1, 4, dtype=torch.bool)
    inp = LossInputs(logprobs=lp[..., 0], old_logprobs=torch.zeros(1, 4), advantages=torch.zeros(1, 4),
                     completion_mask=m, rollout_logprobs=torch.zeros(1, 4),
                     teacher=TeacherOutput(lq[..., 0], vocab_logprobs=lq), vocab_logprobs=lp)
    dash = dash_opsd(inp, DASHConfig(scale_match=True, token_clip=math.inf)).per_token
    vanilla = opsd(inp, OPSDConfig(beta=0.0, token_clip=math.inf)).per_token
    assert dash.mean().item() == pytest.approx(vanilla.mean().item(), abs=1e-12)
    assert not torch.allclose(dash, vanilla)  # the profile differs, the scale does not


def test_config():
    with pytest.raises(ValueError, match="fixed_lambda=1.0"):
        DASHConfig(fixed_lambda=1.0)
    assert DASHConfig().beta == 0.0 and DASHConfig().kappa == 5.0 and DASHConfig().token_clip == 0.05
