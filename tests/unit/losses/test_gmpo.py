"""``gmpo``, pinned by hand and against TRL's GMPOTrainer lines on the same inputs."""

import math

import pytest
import torch
from test_gspo import assert_same_loss_and_gradient, assert_trl_still_has, batch_inputs, inputs, random_case, seq_mean
from torch.testing import assert_close

from groupwise.config import load
from groupwise.registry import ConfigError
from groupwise.standard.gmpo import GMPOConfig, gmpo
from groupwise.standard.gspo import GSPOConfig, gspo
from groupwise.types import LossInputs

E = math.exp


def row_means(per_token, mask):
    return (per_token * mask).sum(-1) / mask.sum(-1)  # each row's loss, as seq_mean_token_mean sees it


def test_gmpo_pinned_by_hand():
    # row 0, A = +1: x = 0.6, −0.1 → min(x, clamp(x, −0.4, 0.4)) = 0.4, −0.1 → w = e^0.15 → l = −e^0.15
    # row 1, A = −2: x = −0.5, 0.3 → max(x, clamp(x)) = −0.4, 0.3 → w = e^−0.05 → l = 2·e^−0.05
    inp = inputs([[-1.0, -1.0], [-2.0, -1.0]], [[-1.6, -0.9], [-1.5, -1.3]], [[1.0, 1.0], [-2.0, -2.0]])
    out = gmpo(inp, GMPOConfig())
    want = torch.tensor([[-E(0.15)] * 2, [2 * E(-0.05)] * 2], dtype=torch.float64)
    assert_close(out.per_token, want, rtol=0, atol=1e-12)
    assert out.metrics["loss/clip_frac_high"] == (1.0, 4.0) and out.metrics["loss/clip_frac_low"] == (1.0, 4.0)
    assert out.metrics["loss/ratio_mean"][0] == pytest.approx(2 * E(0.15) + 2 * E(-0.05), abs=1e-12)
    row_means(out.per_token, inp.completion_mask).sum().backward()
    # the clipped tokens are constants; the other: d(−w·A)/dlogp = −A·w/|o|
    grad = torch.tensor([[0.0, -E(0.15) / 2], [0.0, 2 * E(-0.05) / 2]], dtype=torch.float64)
    assert_close(inp.logprobs.grad, grad, rtol=0, atol=1e-12)


def trl_gmpo_loss(per_token_logps, old_per_token_logps, advantages, mask, epsilon_low, epsilon_high):
    """TRL 1.16.0, trl/experimental/gmpo/gmpo_trainer.py lines 82, 87, 90-95, 98, 102-105 and 120
    (``GMPOTrainer._compute_loss``, ``beta`` 0, no entropy mask), verbatim but for ``self.`` → arguments."""
    log_ratio = per_token_logps - old_per_token_logps
    clamped_log_ratio = torch.clamp(log_ratio, min=-epsilon_low, max=epsilon_high)
    advantages_col = advantages.unsqueeze(1)
    clipped_log_ratio = torch.where(
        advantages_col > 0,
        torch.minimum(log_ratio, clamped_log_ratio),
        torch.maximum(log_ratio, clamped_log_ratio),
    )
    seq_mask = mask
    log_importance_weights = (clipped_log_ratio * seq_mask).sum(-1) / seq_mask.sum(-1).clamp(min=1.0)  # (B,)
    coef = torch.exp(log_importance_weights)  # (B,) sequence-level (geometric-mean) importance weight

    per_sequence_loss = -coef * advantages  # (B,)
    loss = per_sequence_loss.mean()
    return loss


def test_gmpo_equals_trls_loss_and_gradient():
    assert_trl_still_has("experimental/gmpo/gmpo_trainer.py",
                         "clamped_log_ratio = torch.clamp(log_ratio, min=-self.epsilon_low, max=self.epsilon_high)",
                         "torch.maximum(log_ratio, clamped_log_ratio),",
                         "per_sequence_loss = -coef * advantages  # (B,)")
    lp, old, adv, mask = random_case(3, per_token_advantages=False)
    cfg = GMPOConfig(clip_low=0.3, clip_high=0.5)
    metrics = gmpo(batch_inputs(lp, old, adv, mask), cfg).metrics
    assert metrics["loss/clip_frac_high"][0] > 0 and metrics["loss/clip_frac_low"][0] > 0
    assert_same_loss_and_gradient(lambda x: seq_mean(gmpo(batch_inputs(x, old, adv, mask), cfg).per_token, mask),
                                  lambda x: trl_gmpo_loss(x, old, adv[:, 0], mask.double(), 0.3, 0.5), lp)


@pytest.mark.parametrize("on_policy", [True, False])
def test_unclipped_gmpo_is_unclipped_gspo(on_policy):
    """Both weigh a row by exp(mean log-ratio); they differ only in where they clip (GMPO per token in log space,
    GSPO the sequence ratio). On-policy that is −A·mean_t ∇logp_t for either, whatever the clip range."""
    lp, old, adv, mask = random_case(4, per_token_advantages=False)
    old = lp if on_policy else old
    wide = 1e9 if not on_policy else None
    grads, values = [], []
    for fn, cfg in ((gmpo, GMPOConfig() if wide is None else GMPOConfig(clip_low=wide, clip_high=wide)),
                    (gspo, GSPOConfig() if wide is None else GSPOConfig(clip_low=0.999, clip_high=wide))):
        x = lp.clone().requires_grad_()
        loss = seq_mean(fn(LossInputs(logprobs=x, old_logprobs=old, advantages=adv, completion_mask=mask,
                                      rollout_logprobs=torch.full_like(lp, math.nan)), cfg).per_token, mask)
        loss.backward()
        grads.append(x.grad)
        values.append(loss)
    assert_close(values[0], values[1], rtol=0, atol=1e-12)
    assert_close(grads[0], grads[1], rtol=0, atol=1e-12)


def test_bad_gmpo_settings_are_one_line_at_load():
    with pytest.raises(ConfigError, match=r"loss 'gmpo': GMPO's objective is a mean over sequences; "
                                          r"loss.reduction=seq_sum_const would weight each sequence by its length; "
                                          r"allowed: loss.reduction=seq_mean_token_mean$"):
        load(None, ["loss.terms=[gmpo]", "loss.reduction=seq_sum_const"])
    with pytest.raises(ConfigError, match=r"loss.terms.0: clip_low=-0.1 and clip_high=0.4 must be >= 0"):
        load(None, ["loss.terms=[{name: gmpo, clip_low: -0.1}]", "loss.reduction=seq_mean_token_mean"])
    assert load(None, ["loss.terms=[gmpo]", "loss.reduction=seq_mean_token_mean"]).loss.terms[0].cfg == GMPOConfig()
