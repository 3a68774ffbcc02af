"""The sampler-trainer importance weight (``losses/mismatch.py``), pinned by hand and against TRL's lines."""

import math
from pathlib import Path

import pytest
import torch
from test_cispo import masked_mean as nemo_masked_mean
from torch.testing import assert_close

from groupwise.losses.mismatch import effective_sample_size, importance_weights, mismatch

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


@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_importance_weights_equal_trls_on_identical_inputs(mode, lower):
    """TRL's own lines on the same random inputs (NaN sampler log-probs, padding, ratios both sides of the
    cap; with ``lower``, a lower bound too: TRL's two-sided clip): the same weights exactly; and TRL's per-token
    product (grpo_trainer.py:3146-3147, ``per_token_loss * inputs["importance_sampling_ratio"]``) with its
    ``bnpo`` reduction (3159) equals our token_mean of w · loss."""
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
    clip_min = (0.8 if mode.startswith("token") else 0.3) if lower else None  # the rows' products: 0.07 to 13
    ours, _ = importance_weights(old, sampler, mask.bool(), mode, 1.3, clip_min)
    theirs = trl_importance_sampling_ratio(old, sampler, mask, mode, 1.3, clip_min)
    assert_close(ours, theirs.expand_as(ours), rtol=0, atol=0)
    assert 0 < int((theirs == (0.0 if mode.endswith("mask") else 1.3)).sum()) < theirs.numel()
    if lower:  # the lower bound changes some weights, not all
        upper_only, _ = importance_weights(old, sampler, mask.bool(), mode, 1.3)
        assert 0 < int((ours != upper_only).sum()) < int((ours != 1.0).sum())
    per_token_loss = torch.randn(6, 9, generator=g)
    trl_loss = (per_token_loss * theirs * mask).sum() / mask.sum().clamp(min=1.0)
    assert_close((per_token_loss * ours * mask).sum() / mask.sum(), trl_loss, rtol=0, atol=1e-7)


# the band [0.6, 1.5]: e^−0.8 = 0.449 falls under it, row 1's product e^−0.7 = 0.497 too
@pytest.mark.parametrize("mode, weight, clipped", [
    ("token_truncate", [[1.5, E(0.2), 1.0], [0.6, E(0.1), 1.0]], [[1, 0, 0], [1, 0, 0]]),
    ("token_mask", [[0.0, E(0.2), 1.0], [0.0, E(0.1), 1.0]], [[1, 0, 0], [1, 0, 0]]),
    ("sequence_truncate", [[1.5] * 3, [0.6] * 3], [[1, 1, 1], [1, 1, 0]]),
    ("sequence_mask", [[0.0] * 3, [0.0] * 3], [[1, 1, 1], [1, 1, 0]]),
])
def test_clip_min_pinned_by_hand(mode, weight, clipped):
    w, c = importance_weights(OLD, SAMPLER, MASK, mode, CAP, clip_min=0.6)
    assert_close(w, torch.tensor(weight), rtol=0, atol=1e-6)
    assert c.tolist() == [[bool(x) for x in r] for r in clipped]


# geometric means over the loss tokens (the NaN one counts as δ = 0): row 0 e^(0.7/3) = 1.263, row 1 e^(−0.7/2) = 0.705
@pytest.mark.parametrize("clip_min, cap, masked", [(0.6, 1.5, [False, False]), (0.6, 1.2, [True, False]),
                                                   (0.9, 1.5, [False, True]), (0.9, 1.1, [True, True])])
def test_geometric_modes_pinned_by_hand(clip_min, cap, masked):
    tokens = [[E(0.5), E(0.2), 1.0], [E(-0.8), E(0.1), 1.0]]  # seq_mask_tis keeps the untruncated token weights
    for mode, kept in (("geometric_mask", [[1.0] * 3] * 2), ("seq_mask_tis", tokens)):
        w, c = importance_weights(OLD, SAMPLER, MASK, mode, cap, clip_min)
        want = [[0.0] * 3 if out else row for row, out in zip(kept, masked)]
        assert_close(w, torch.tensor(want), rtol=0, atol=1e-6)
        assert c.tolist() == [[out and bool(m) for m in row] for row, out in zip(MASK.tolist(), masked)]


def test_drop_fraction_and_effective_sample_size_pinned_by_hand():
    # seq_mask_tis in the band [0.6, 1.2]: row 0 is dropped, row 1 keeps e^−0.8, e^0.1 on its known tokens
    out = mismatch(OLD, SAMPLER, MASK, "seq_mask_tis", 1.2, 0.6)
    assert out.metrics["mismatch/masked_seq_frac"] == (1.0, 2.0)
    assert out.metrics["mismatch/clipped_frac"] == (2.0, 4.0)  # row 0's two tokens with a sampler log-prob
    w = [0.0, 0.0, E(-0.8), E(0.1)]  # the known tokens
    step = {k: s / n for k, (s, n) in out.metrics.items()}
    effective_sample_size(step)
    assert "mismatch/is_weight_sq_mean" not in step
    assert step["mismatch/ess"] == pytest.approx(sum(w) ** 2 / (4 * sum(x * x for x in w)), abs=1e-6)  # 0.424
    none = {k: s / n for k, (s, n) in mismatch(OLD, SAMPLER, MASK, "none", CAP).metrics.items()}
    effective_sample_size(none)
    r = [E(0.5), E(0.2), E(-0.8), E(0.1)]
    assert none["mismatch/ess"] == pytest.approx(sum(r) ** 2 / (4 * sum(x * x for x in r)), abs=1e-6)
    assert none["mismatch/masked_seq_frac"] == 0.0
    everything = {k: s / n for k, (s, n) in mismatch(OLD, SAMPLER, MASK, "token_mask", 1.01, 0.99).metrics.items()}
    effective_sample_size(everything)  # no weight survives: ESS 0, not 0/0
    assert everything["mismatch/ess"] == 0.0 and everything["mismatch/masked_seq_frac"] == 1.0


def verl_effective_sample_size(rollout_is_weights, response_mask, rollout_is_threshold):
    """verl (volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7), verl/trainer/ppo/rollout_corr_helper.py
    lines 632 and 689-694 (``compute_is_metrics``), with ``verl_F.masked_mean`` of verl/utils/torch_functional.py
    lines 300-301 (``masked_sum`` = (values * mask).sum(axis)); verbatim but for the returned value."""
    rollout_is_threshold_lower: float = 1.0 / rollout_is_threshold
    weights_for_ess: torch.Tensor = rollout_is_weights.clamp(min=rollout_is_threshold_lower, max=rollout_is_threshold)
    mean_for_ess: torch.Tensor = masked_mean(weights_for_ess, response_mask)
    is_weights_normalized: torch.Tensor = weights_for_ess / (mean_for_ess + 1e-8)  # Avoid division by zero
    return 1.0 / masked_mean(is_weights_normalized.square(), response_mask).item()


def masked_mean(values, mask, axis=None):
    s = (values * mask).sum(axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def test_effective_sample_size_equals_verls():
    """verl's TIS band is [1/C, C]: our token_truncate with clip_min 1/C, whose weights verl's clamp leaves alone."""
    old, sampler, mask = random_logprobs(0)
    sampler[1, 2] = NAN  # a token without a sampler log-prob: left out of our ESS, so the comparison leaves it out
    w, _ = importance_weights(old, sampler, mask, "token_truncate", 1.3, 1 / 1.3)
    step = {k: s / n for k, (s, n) in mismatch(old, sampler, mask, "token_truncate", 1.3, 1 / 1.3).metrics.items()}
    effective_sample_size(step)
    known = mask & torch.isfinite(sampler)
    theirs = verl_effective_sample_size(w.double(), known.double(), 1.3)
    assert 0.5 < step["mismatch/ess"] < 0.99  # weights that differ: not the trivial 1
    assert step["mismatch/ess"] == pytest.approx(theirs, rel=1e-6)  # verl's 1e-8s: ~1e-8 relative


def random_logprobs(seed):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(6, 9, generator=g) * 3
    sampler = old + torch.randn(6, 9, generator=g) * 0.4
    mask = torch.ones(6, 9, dtype=torch.bool)
    mask[2, 5:] = mask[5, 3:] = False
    return old, sampler, mask


def skyrl_geometric_sequence_mask(old_log_probs, rollout_logprobs, loss_mask, geo_cap_low, geo_cap_high):
    """SkyRL (NovaSky-AI/SkyRL@a9564572eb8e91076be43c1bd5e4615e3de17265),
    skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py lines 217 and 222-229 (``compute_sequence_mask``,
    ``sequence_mask_metric="geometric"``) with ``safe_exp_delta`` of skyrl/backends/skyrl_train/utils/torch_utils.py
    lines 191-192; verbatim but for ``off_policy_correction.geo_mask_*`` → arguments."""
    token_tis_log_ratio = old_log_probs - rollout_logprobs
    num_tokens = loss_mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    seq_tis_log_ratio = (token_tis_log_ratio * loss_mask).sum(dim=-1, keepdim=True)
    geo_mean_ratio = safe_exp_delta(seq_tis_log_ratio / num_tokens, clip=20.0, out_dtype=old_log_probs.dtype)
    seq_over_high = geo_mean_ratio > geo_cap_high
    seq_under_low = geo_mean_ratio < geo_cap_low
    geo_sequence_mask = ~seq_over_high & ~seq_under_low
    return geo_sequence_mask.float()


def safe_exp_delta(delta, clip=20.0, out_dtype=None):
    y = torch.clamp(delta.to(torch.float32), -clip, clip).exp()
    return y.to(out_dtype or delta.dtype)


def nemo_seq_mask_tis(prev_logprobs, generation_logprobs, token_mask, ratio_min, ratio_max):
    """NeMo-RL (NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909), nemo_rl/algorithms/loss/loss_functions.py
    lines 579-584 (token-level correction) and 639-665 (``truncated_importance_sampling_type == "seq-mask-tis"``),
    with ``masked_mean`` of nemo_rl/algorithms/utils.py lines 219-224 (test_cispo.py's copy); verbatim but for
    ``self.`` → arguments."""
    actor_importance_weights_expanded = torch.exp(
        prev_logprobs - generation_logprobs
    )
    actor_importance_weights_expanded = torch.nan_to_num(
        actor_importance_weights_expanded, nan=0.0, posinf=0.0, neginf=0.0
    )
    log_is_ratio = torch.nan_to_num(
        prev_logprobs - generation_logprobs,
        nan=0.0,
        posinf=0.0,
        neginf=0.0,
    )
    seq_log_is_ratio_mean = nemo_masked_mean(
        log_is_ratio, token_mask, dim=-1
    )  # [B]
    seq_geomean_is_ratio = torch.exp(seq_log_is_ratio_mean).detach()  # [B]
    seq_kept_mask = (
        (
            seq_geomean_is_ratio
            >= ratio_min
        )
        & (seq_geomean_is_ratio <= ratio_max)
    ).float()  # [B]
    actor_importance_weights_expanded = (
        actor_importance_weights_expanded * seq_kept_mask.unsqueeze(-1)
    )
    return actor_importance_weights_expanded


def openrlhf_seq_mask_tis(old_log_probs, rollout_log_probs, action_mask, low_threshold, high_threshold):
    """OpenRLHF (OpenRLHF/OpenRLHF@3c3be6234e0cb353e76bb8019947db9dfe99fca7), openrlhf/models/loss.py lines 199 and
    209-213 (``PolicyLoss.forward``, ``vllm_is_correction_type == "seq-mask-tis"``) with ``masked_mean`` of
    openrlhf/models/utils.py lines 166-169; verbatim but for returning the factor that line 213 puts on the loss."""
    rollout_log_ratio = old_log_probs - rollout_log_probs
    seq_log_ratio = openrlhf_masked_mean(rollout_log_ratio, action_mask, dim=-1)
    seq_is = torch.exp(seq_log_ratio)
    seq_mask = (seq_is >= low_threshold) & (seq_is <= high_threshold)
    vllm_is = torch.exp(rollout_log_ratio).detach()
    return seq_mask.unsqueeze(-1) * vllm_is


def openrlhf_masked_mean(tensor, mask, dim=None):
    if mask is None:
        return tensor.mean(dim=dim)
    return (tensor * mask).sum(dim=dim) / mask.sum(dim=dim)


@pytest.mark.parametrize("ref", ["skyrl", "nemo", "openrlhf"])
def test_geometric_modes_equal_the_references(ref):
    """The same rows masked and the same weights on every loss token, on random inputs whose geometric means fall
    both sides of the band (no NaN: SkyRL would keep a NaN row, NeMo-RL would weigh a NaN token 0)."""
    old, sampler, mask = random_logprobs(1)
    low, high = 0.93, 1.05
    mode = "geometric_mask" if ref == "skyrl" else "seq_mask_tis"
    ours, clipped = importance_weights(old, sampler, mask, mode, high, low)
    if ref == "skyrl":
        theirs = skyrl_geometric_sequence_mask(old, sampler, mask.float(), low, high).expand_as(ours)
    elif ref == "nemo":
        theirs = nemo_seq_mask_tis(old, sampler, mask.float(), low, high)
    else:
        theirs = openrlhf_seq_mask_tis(old, sampler, mask.float(), low, high)
    dropped = clipped.any(-1)
    assert 0 < int(dropped.sum()) < len(dropped)  # rows on both sides of the band
    assert_close(ours[mask], theirs[mask], rtol=0, atol=1e-6)
