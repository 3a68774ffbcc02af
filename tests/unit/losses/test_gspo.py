"""``gspo`` (GSPO and GSPO-token), pinned by hand and against TRL's lines on the same inputs."""

import importlib.metadata
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from groupwise.config import load
from groupwise.losses.reduce import Normalizer, reduce
from groupwise.registry import ConfigError
from groupwise.standard.gspo import GSPOConfig, gspo
from groupwise.standard.ppo_clip import PPOClipConfig, ppo_clip
from groupwise.types import LossInputs

E = math.exp
WIDE = GSPOConfig(clip_low=0.2, clip_high=0.2)  # GRPO's range: the hand-computed cases clip visibly


def inputs(logprobs, old, adv, mask=None):
    lp = torch.tensor(logprobs, dtype=torch.float64, requires_grad=True)
    m = torch.ones_like(lp, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return LossInputs(logprobs=lp, old_logprobs=torch.tensor(old, dtype=torch.float64),
                      advantages=torch.tensor(adv, dtype=torch.float64), completion_mask=m,
                      rollout_logprobs=torch.full(lp.shape, math.nan))


def seq_mean(per_token, mask):
    rows = float(mask.any(-1).sum())
    return reduce(per_token, mask, Normalizer(tokens=float(mask.sum()), seqs=rows, const=1.0), "seq_mean_token_mean")


def test_gspo_pinned_by_hand():
    # row 0: log ratios 0.2, 0.4 → s = e^0.3 = 1.3499 > 1.2, A = +1 → −min(1.3499, 1.2) = −1.2 on both tokens
    # row 1: the loss token's log ratio −0.5 (the masked one's +2 is left out) → s = e^−0.5 = 0.6065 < 0.8, A = −1
    #        → −min(−0.6065, −0.8) = 0.8
    # row 2: log ratios 0.1, −0.1, 0 → s = 1, A = 0.5 → −0.5 (inside the range: the gradient flows)
    inp = inputs([[-1.0, -2.0, 0.0], [-0.5, -1.0, 0.0], [-1.0, -1.0, -1.0]],
                 [[-1.2, -2.4, 0.0], [0.0, -3.0, 0.0], [-1.1, -0.9, -1.0]],
                 [[1.0] * 3, [-1.0] * 3, [0.5] * 3], [[True, True, False], [True, False, False], [True] * 3])
    out = gspo(inp, WIDE)
    m = inp.completion_mask
    assert_close(out.per_token[m], torch.tensor([-1.2, -1.2, 0.8, -0.5, -0.5, -0.5], dtype=torch.float64),
                 rtol=0, atol=1e-12)
    assert out.metrics["loss/clip_frac_high"] == (2.0, 6.0) and out.metrics["loss/clip_frac_low"] == (1.0, 6.0)
    assert out.metrics["loss/ratio_mean"][0] == pytest.approx(2 * E(0.3) + E(-0.5) + 3.0, abs=1e-12)
    ((out.per_token * m).sum(-1) / m.sum(-1)).sum().backward()  # each row's loss: its token mean, −s·A
    # clipped rows: no gradient; row 2: d(−s·A)/dlogp_t = −A·s/|o| = −0.5/3 on each of its tokens
    want = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-0.5 / 3] * 3], dtype=torch.float64)
    assert_close(inp.logprobs.grad, want, rtol=0, atol=1e-12)


def test_gspo_token_has_gspos_value_and_a_per_token_gradient():
    # row 2 of the case above with advantages that vary along the row: w_t = sg[s]·π/sg[π], value s = 1;
    # d(−w_t·A_t)/dlogp_t = −s·A_t
    args = ([[-1.0, -1.0, -1.0]], [[-1.1, -0.9, -1.0]], [[0.5, -1.0, 2.0]])
    seq, tok = inputs(*args), inputs(*args)
    out_seq, out_tok = gspo(seq, WIDE), gspo(tok, GSPOConfig(clip_low=0.2, clip_high=0.2, level="sequence_token"))
    assert_close(out_tok.per_token, out_seq.per_token, rtol=0, atol=1e-12)
    out_tok.per_token.sum().backward()
    assert_close(tok.logprobs.grad, torch.tensor([[-0.5, 1.0, -2.0]], dtype=torch.float64), rtol=0, atol=1e-12)
    out_seq.per_token.sum().backward()  # GSPO spreads the row's summed advantage: −(0.5 − 1 + 2)/3 per token
    assert_close(seq.logprobs.grad, torch.full((1, 3), -1.5 / 3, dtype=torch.float64), rtol=0, atol=1e-12)


def trl_grpo_loss(per_token_logps, old_per_token_logps, advantages, mask, importance_sampling_level, epsilon_low,
                  epsilon_high):
    """TRL 1.16.0, trl/trainer/grpo_trainer.py lines 3083-3088, 3095, 3113-3120 and 3154 (``_compute_loss``,
    ``loss_type="grpo"``), verbatim but for ``self.`` → arguments (``args.delta`` None) and the ``else: raise``
    of 3089-3093."""
    log_ratio = per_token_logps - old_per_token_logps
    if importance_sampling_level == "token":
        log_importance_weights = log_ratio
    elif importance_sampling_level == "sequence":
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)

    coef_1 = torch.exp(log_importance_weights)

    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages
    per_token_loss2 = coef_2 * advantages
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    return loss


def trl_gspo_token_log_importance_weights(per_token_logps, log_ratio, mask):
    """TRL v1.9.0-26-gf2cd5771 (huggingface/trl@f2cd57710ae345ea6428ae95363267fcf38a3dc8),
    trl/experimental/gspo_token/grpo_trainer.py lines 78-82 (``importance_sampling_level == "sequence_token"``),
    verbatim; the rest of that ``_compute_loss`` (91-100, 111-112) is ``trl_grpo_loss``'s. TRL 1.16 no longer ships
    ``trl.experimental.gspo_token``."""
    # GSPO-token: sg[si(θ)] * πθ(yi,t)/sg[πθ(yi,t)]
    seq_level_log_weight = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    seq_level_log_weight = seq_level_log_weight.detach().unsqueeze(-1)  # Stop gradient
    log_importance_weights = per_token_logps - per_token_logps.detach() + seq_level_log_weight
    return log_importance_weights


def random_case(seed, per_token_advantages):
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    old = logprobs + torch.randn(6, 9, generator=g, dtype=torch.float64) * 0.5
    mask = torch.ones(6, 9, dtype=torch.bool)
    mask[2, 5:] = mask[5, 3:] = False
    adv = torch.randn(6, 9 if per_token_advantages else 1, generator=g, dtype=torch.float64).expand(6, 9)
    return logprobs, old, adv.contiguous(), mask


def assert_trl_still_has(relative, *lines):
    """Where TRL is installed, the lines copied from its file ``relative`` are still its own (read, not imported);
    without TRL the copies are compared all the same."""
    spec = importlib.util.find_spec("trl")
    if spec is None or spec.origin is None:
        return
    source = (Path(spec.origin).parent / relative).read_text()
    for line in lines:
        assert line in source, f"TRL {importlib.metadata.version('trl')} changed: {line}"


def batch_inputs(logprobs, old, adv, mask):
    return LossInputs(logprobs=logprobs, old_logprobs=old, advantages=adv, completion_mask=mask,
                      rollout_logprobs=torch.full_like(old, math.nan))


def assert_same_loss_and_gradient(ours, theirs, logprobs, rtol=0.0):
    """``ours(x)`` and ``theirs(x)``, two scalar losses of the log-probs x, agree in value and in gradient."""
    x, y = logprobs.clone().requires_grad_(), logprobs.clone().requires_grad_()
    a, b = ours(x), theirs(y)
    assert_close(a, b, rtol=rtol, atol=1e-12)
    a.backward()
    b.backward()
    assert_close(x.grad, y.grad, rtol=rtol, atol=1e-12)


def test_gspo_equals_trls_sequence_level_loss_and_gradient():
    assert_trl_still_has("trainer/grpo_trainer.py",
                         "log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)",
                         "coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)",
                         "loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()")
    lp, old, adv, mask = random_case(0, per_token_advantages=False)
    metrics = gspo(batch_inputs(lp, old, adv, mask), WIDE).metrics
    assert 0 < metrics["loss/clip_frac_high"][0] + metrics["loss/clip_frac_low"][0] < float(mask.sum())  # both
    assert_same_loss_and_gradient(lambda x: seq_mean(gspo(batch_inputs(x, old, adv, mask), WIDE).per_token, mask),
                                  lambda x: trl_grpo_loss(x, old, adv[:, :1], mask.double(), "sequence", 0.2, 0.2), lp)


@pytest.mark.parametrize("reduction", ["seq_mean_token_mean", "token_mean"])
def test_gspo_token_equals_trls_gspo_token(reduction):
    lp, old, adv, mask = random_case(1, per_token_advantages=True)
    norm = Normalizer(tokens=float(mask.sum()), seqs=6.0, const=1.0)
    cfg = GSPOConfig(clip_low=0.2, clip_high=0.2, level="sequence_token")

    def theirs(x):
        coef_1 = torch.exp(trl_gspo_token_log_importance_weights(x, x - old, mask.double()))
        per_token_loss = -torch.min(coef_1 * adv, torch.clamp(coef_1, 1 - 0.2, 1 + 0.2) * adv)  # trl_grpo_loss's
        return reduce(per_token_loss, mask, norm, reduction)

    assert_same_loss_and_gradient(lambda x: reduce(gspo(batch_inputs(x, old, adv, mask), cfg).per_token, mask, norm,
                                                   reduction), theirs, lp)


def test_on_policy_gspo_is_ppo_clip():
    """At ρ = 1 (one epoch) GSPO-token's gradient is ppo_clip's for any advantages, GSPO's for row-constant ones;
    and a one-token row is ppo_clip's case exactly, in value too."""
    lp, _, adv, mask = random_case(2, per_token_advantages=True)
    row = adv[:, :1].expand_as(adv)
    grads = {}
    cases = (("ppo", ppo_clip, PPOClipConfig(), adv), ("ppo_row", ppo_clip, PPOClipConfig(), row),
             ("token", gspo, GSPOConfig(level="sequence_token"), adv), ("seq", gspo, GSPOConfig(), row))
    for name, fn, cfg, a in cases:
        x = lp.clone().requires_grad_()
        out = fn(LossInputs(logprobs=x, old_logprobs=lp, advantages=a, completion_mask=mask,
                            rollout_logprobs=torch.full_like(lp, math.nan)), cfg)
        seq_mean(out.per_token, mask).backward()
        grads[name] = x.grad
    assert_close(grads["token"], grads["ppo"], rtol=0, atol=1e-12)
    assert_close(grads["seq"], grads["ppo_row"], rtol=0, atol=1e-12)
    one = inputs([[-0.7], [-0.1]], [[-1.0], [0.2]], [[1.0], [-2.0]])  # ratios e^0.3 (clipped), e^−0.3 (clipped)
    assert_close(gspo(one, WIDE).per_token, ppo_clip(one, PPOClipConfig()).per_token, rtol=0, atol=1e-12)


def test_bad_gspo_settings_are_one_line_at_load():
    with pytest.raises(ConfigError, match=r"loss 'gspo': level sequence is a mean over sequences; "
                                          r"loss.reduction=token_mean would weight each sequence by its length; "
                                          r"allowed: loss.reduction=seq_mean_token_mean, or level sequence_token$"):
        load(None, ["loss.terms=[gspo]"])
    with pytest.raises(ConfigError, match=r"loss.terms.0: clip_low=1.5 must be in \[0, 1\)"):
        load(None, ["loss.terms=[{name: gspo, clip_low: 1.5}]", "loss.reduction=seq_mean_token_mean"])
    with pytest.raises(ConfigError, match=r"loss.terms.0.level: 'token' is not allowed; allowed: sequence, "
                                          r"sequence_token"):
        load(None, ["loss.terms=[{name: gspo, level: token}]"])
    assert load(None, ["loss.terms=[{name: gspo, level: sequence_token}]"]).loss.terms[0].cfg.level == "sequence_token"
