"""``cispo``, pinned by hand and against TRL's and NeMo-RL's lines on the same inputs."""

import math

import pytest
import torch
from test_gspo import assert_same_loss_and_gradient, assert_trl_still_has, batch_inputs, inputs
from torch.testing import assert_close

from groupwise.config import load
from groupwise.losses.reduce import Normalizer, reduce
from groupwise.registry import ConfigError
from groupwise.standard.cispo import CISPOConfig, cispo
from groupwise.standard.ppo_clip import PPOClipConfig, ppo_clip
from groupwise.types import LossInputs

E = math.exp


def test_cispo_pinned_by_hand():
    # r = e^0.5 = 1.6487 → 1.2, e^−1 = 0.3679 → 0.8, 1 → 1 (clip 0.2 / 0.2); l = −w·A·logp:
    # −1.2·1·(−1) = 1.2, −0.8·(−1)·(−2) = −1.6, −1·2·(−0.5) = 1.0; gradient −w·A = −1.2, 0.8, −2
    inp = inputs([[-1.0, -2.0, -0.5]], [[-1.5, -1.0, -0.5]], [[1.0, -1.0, 2.0]])
    out = cispo(inp, CISPOConfig(clip_low=0.2, clip_high=0.2))
    assert_close(out.per_token, torch.tensor([[1.2, -1.6, 1.0]], dtype=torch.float64), rtol=0, atol=1e-12)
    assert out.metrics["loss/clip_frac_high"] == (1.0, 3.0) and out.metrics["loss/clip_frac_low"] == (1.0, 3.0)
    assert out.metrics["loss/ratio_mean"][0] == pytest.approx(E(0.5) + E(-1.0) + 1.0, abs=1e-12)
    out.per_token.sum().backward()
    assert_close(inp.logprobs.grad, torch.tensor([[-1.2, 0.8, -2.0]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_a_clipped_token_keeps_its_gradient_and_on_policy_cispo_is_ppo_clip():
    clipped = inputs([[0.5]], [[0.0]], [[1.0]])  # r = e^0.5: PPO's clip zeroes its gradient, CISPO bounds it
    cispo(clipped, CISPOConfig(clip_low=0.2, clip_high=0.2)).per_token.sum().backward()
    assert clipped.logprobs.grad.item() == pytest.approx(-1.2, abs=1e-12)
    lp = -torch.rand(4, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    adv = torch.randn(4, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads, every = [], torch.ones_like(lp, dtype=torch.bool)
    for fn, cfg in ((cispo, CISPOConfig()), (ppo_clip, PPOClipConfig())):
        x = lp.clone().requires_grad_()
        fn(LossInputs(logprobs=x, old_logprobs=lp, advantages=adv, completion_mask=every,
                      rollout_logprobs=torch.full_like(lp, math.nan)), cfg).per_token.sum().backward()
        grads.append(x.grad)
    assert_close(grads[0], grads[1], rtol=0, atol=1e-12)  # ρ = 1: −A·∇logp for both


def trl_cispo_loss(per_token_logps, old_per_token_logps, advantages, mask, epsilon_high):
    """TRL 1.16.0, trl/trainer/grpo_trainer.py lines 3083-3085, 3095, 3110-3111 and 3173 (``_compute_loss``,
    ``loss_type="cispo"``, ``importance_sampling_level="token"``), verbatim but for ``self.`` → arguments; the
    normalizer of 3170-3172 is ``num_items_in_batch`` (the step's loss tokens) in one process and one
    accumulation window."""
    log_ratio = per_token_logps - old_per_token_logps
    log_importance_weights = log_ratio
    coef_1 = torch.exp(log_importance_weights)
    clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
    per_token_loss = -clamped_ratios * advantages * per_token_logps
    normalizer = mask.sum()
    loss = (per_token_loss * mask).sum() / normalizer
    return loss


def nemo_cispo_loss(curr_logprobs, prev_logprobs, advantages, mask, ratio_clip_min, ratio_clip_max):
    """NeMo-RL (NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909), nemo_rl/algorithms/loss/loss_functions.py
    lines 527, 537-540, 546 (``ClippedPGLossFn.__call__`` with ``use_cispo``, token-level ratios) and 679-683
    (``LossType.TOKEN_LEVEL``, no IS correction: weights 1), with ``masked_mean`` of nemo_rl/algorithms/utils.py
    lines 219-224; verbatim but for ``self.`` → arguments."""
    log_ratios = curr_logprobs - prev_logprobs
    ratios = log_ratios.exp()
    ratios_clamped = ratios.clamp(
        1.0 - ratio_clip_min, 1.0 + ratio_clip_max
    )
    clip_loss = -advantages * ratios_clamped.detach() * curr_logprobs
    importance_weights_to_use = torch.ones_like(prev_logprobs)
    global_valid_toks = mask.sum()
    actor_loss = masked_mean(
        importance_weights_to_use * clip_loss,
        mask,
        global_normalization_factor=global_valid_toks,
    )
    return actor_loss


def masked_mean(values, mask, dim=None, global_normalization_factor=None):
    normalization_factor = (
        torch.sum(mask, dim=dim)
        if global_normalization_factor is None
        else global_normalization_factor
    )
    return torch.sum(values * mask, dim=dim) / (normalization_factor + 1e-8)


def random_case():
    g = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    old = logprobs + torch.randn(6, 9, generator=g, dtype=torch.float64) * 1.2
    mask = torch.ones(6, 9, dtype=torch.bool)
    mask[2, 5:] = mask[5, 3:] = False
    return logprobs, old, torch.randn(6, 9, generator=g, dtype=torch.float64), mask


@pytest.mark.parametrize("ref", ["trl", "nemo"])
def test_cispo_equals_the_references_loss_and_gradient(ref):
    """TRL's one cap ε_max = 5 is clip_low 1, clip_high 4; NeMo-RL's ratio_clip_min / _max are clip_low / _high."""
    if ref == "trl":
        assert_trl_still_has("trainer/grpo_trainer.py",
                             "clamped_ratios = torch.clamp(coef_1, max=self.epsilon_high).detach()",
                             "per_token_loss = -clamped_ratios * advantages * per_token_logps")
    lp, old, adv, mask = random_case()
    cfg = CISPOConfig(clip_low=1.0, clip_high=4.0) if ref == "trl" else CISPOConfig(clip_low=0.3, clip_high=0.5)
    metrics = cispo(batch_inputs(lp, old, adv, mask), cfg).metrics
    assert 0 < metrics["loss/clip_frac_high"][0] < float(mask.sum())  # the cap bites on some tokens only
    assert ref == "trl" or metrics["loss/clip_frac_low"][0] > 0
    norm = Normalizer(tokens=float(mask.sum()), seqs=6.0, const=1.0)
    theirs = ((lambda x: trl_cispo_loss(x, old, adv, mask.double(), 5.0)) if ref == "trl"
              else (lambda x: nemo_cispo_loss(x, old, adv, mask.double(), 0.3, 0.5)))
    assert_same_loss_and_gradient(lambda x: reduce(cispo(batch_inputs(x, old, adv, mask), cfg).per_token, mask, norm,
                                                   "token_mean"), theirs, lp,
                                  rtol=0 if ref == "trl" else 1e-9)  # NeMo-RL adds 1e-8 to its 48 tokens: 2e-10


def test_bad_cispo_settings_are_one_line_at_load():
    with pytest.raises(ConfigError, match=r"^override 'loss.terms=\[\{name: cispo, clip_low: 1.5\}\]': loss.terms.0: "
                                          r"clip_low=1.5 must be in \[0, 1\] and clip_high=4.0 >= 0 \(the weight is "
                                          r"clipped to \[1 - clip_low, 1 \+ clip_high\]\)$"):
        load(None, ["loss.terms=[{name: cispo, clip_low: 1.5}]"])
    assert load(None, ["loss.terms=[cispo]"]).loss.terms[0].cfg == CISPOConfig(clip_low=1.0, clip_high=4.0)
