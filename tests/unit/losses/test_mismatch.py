"""The sampler-trainer importance weight (``losses/mismatch.py``), pinned by hand and against TRL's lines."""

import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from groupwise.losses.mismatch import importance_weights, mismatch

E = math.exp
NAN = math.nan
# δ = old − sampler: row 0 [0.5, 0.2, NaN sampler → 0], row 1 [−0.8, 0.1, masked out]
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]])
SAMPLER = torch.tensor([[-1.5, -2.2, NAN], [-0.2, -1.1, -9.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
CAP = 1.5  # e^0.5 = 1.649 > cap > e^0.2 = 1.221; row 0's product e^0.7 = 2.014 > cap, row 1's e^−0.7 = 0.497


@pytest.mark.parametrize("mode, weight, clipped", [
    ("token_truncate", [[1.5, E(0.2), 1.0], [E(-0.8), E(0.1), 1.0]], [[1, 0, 0], [0, 0, 0]]),
    ("token_mask", [[0.0, E(0.2), 1.0], [E(-0.8), E(0.1), 1.0]], [[1, 0, 0], [0, 0, 0]]),
    ("sequence_truncate", [[1.5] * 3, [E(-0.7)] * 3], [[1, 1, 1], [0, 0, 0]]),
    ("sequence_mask", [[0.0] * 3, [E(-0.7)] * 3], [[1, 1, 1], [0, 0, 0]]),
])
def test_importance_weights_pinned_by_hand(mode, weight, clipped):
    w, c = importance_weights(OLD, SAMPLER, MASK, mode, CAP)
    assert_close(w, torch.tensor(weight), rtol=0, atol=1e-6)
    assert c.tolist() == [[bool(x) for x in r] for r in clipped]


def test_mismatch_metrics_pinned_by_hand():
    known = [0.5, 0.2, -0.8, 0.1]  # the loss tokens with a finite sampler log-prob
    none = mismatch(OLD, SAMPLER, MASK, "none", CAP)
    assert none.weight is None and none.max_abs_dlogp == pytest.approx(0.8, abs=1e-6)
    s, n = none.metrics["mismatch/kl"]
    assert n == 4 and s / n == pytest.approx(sum(E(d) - 1 - d for d in known) / 4, abs=1e-6)
    assert none.metrics["mismatch/is_weight_mean"][0] == pytest.approx(sum(E(d) for d in known), abs=1e-6)
    assert none.metrics["mismatch/clipped_frac"] == (0.0, 4.0)
    trunc = mismatch(OLD, SAMPLER, MASK, "token_truncate", CAP)
    w_sum = 1.5 + E(0.2) + E(-0.8) + E(0.1)
    assert trunc.metrics["mismatch/is_weight_mean"][0] == pytest.approx(w_sum, abs=1e-6)
    assert trunc.metrics["mismatch/clipped_frac"] == (1.0, 4.0)
    assert trunc.metrics["mismatch/kl"] == none.metrics["mismatch/kl"]  # the correction leaves the gap
    nothing = mismatch(OLD, torch.full_like(OLD, NAN), MASK, "token_mask", CAP)  # no sampler log-probs
    assert nothing.metrics == {} and nothing.max_abs_dlogp is None and bool((nothing.weight == 1).all())


def trl_importance_sampling_ratio(old_per_token_logps, sampling_per_token_logps, completion_mask, mode,
                                  clip_max, clip_min=None):
    """TRL 1.16.0, trl/trainer/grpo_trainer.py lines 2660-2708 (in ``_generate_and_score_completions``),
    verbatim but for ``self.`` → arguments (``tool_mask`` None) and line breaks; TRL has it inline, not as a
    function."""
    tool_mask = None
    mask = completion_mask if tool_mask is None else completion_mask * tool_mask
    per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)

    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    if sequence_level_is:
        per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
        logps_diff = per_sequence_logps_diff
    else:
        logps_diff = per_token_logps_diff

    vllm_importance_sampling_ratio = torch.exp(logps_diff)

    if mode in ["sequence_truncate", "token_truncate"]:
        vllm_importance_sampling_ratio = torch.clamp(
            vllm_importance_sampling_ratio,
            min=clip_min,
            max=clip_max,
        )
    elif mode in ["sequence_mask", "token_mask"]:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        invalid_mis_mask = (vllm_importance_sampling_ratio < min_val) | (
            vllm_importance_sampling_ratio > max_val
        )
        vllm_importance_sampling_ratio = vllm_importance_sampling_ratio.masked_fill(
            invalid_mis_mask, value=0.0
        )
    return vllm_importance_sampling_ratio


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_importance_weights_equal_trls_on_identical_inputs(mode):
    """TRL's own lines on the same random inputs (NaN sampler log-probs, padding, ratios both sides of the
    cap): the same weights exactly; and TRL's per-token product (grpo_trainer.py:3146-3147, ``per_token_loss
    * inputs["importance_sampling_ratio"]``) with its ``bnpo`` reduction (3159) equals our token_mean of
    w · loss."""
    trl = pytest.importorskip("trl")
    source = (Path(trl.__file__).parent / "trainer" / "grpo_trainer.py").read_text()
    for line in ("per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)",  # the lines copied
                 "invalid_mis_mask, value=0.0",
                 'per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]',
                 "loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)"):
        assert line in source, f"TRL {trl.__version__} changed: {line}"
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 9, generator=g) * 3
    sampler = old + torch.randn(6, 9, generator=g) * 0.4
    sampler[1, 2] = sampler[4, 0] = NAN
    mask = torch.ones(6, 9)
    mask[2, 5:] = mask[5, 3:] = 0
    ours, _ = importance_weights(old, sampler, mask.bool(), mode, 1.3)
    theirs = trl_importance_sampling_ratio(old, sampler, mask, mode, 1.3)
    assert_close(ours, theirs.expand_as(ours), rtol=0, atol=0)
    assert 0 < int((theirs == (0.0 if mode.endswith("mask") else 1.3)).sum()) < theirs.numel()
    per_token_loss = torch.randn(6, 9, generator=g)
    trl_loss = (per_token_loss * theirs * mask).sum() / mask.sum().clamp(min=1.0)
    assert_close((per_token_loss * ours * mask).sum() / mask.sum(), trl_loss, rtol=0, atol=1e-7)
