import itertools
import math
import random
import types

import pytest
import torch
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.qlpo import QLPOConfig, QLPOTransform, positive_quota, quadrants, select
from groupwise.registry import ConfigError
from groupwise.seeding import stable_seed
from groupwise.standard.grpo import GRPOConfig, grpo
from groupwise.types import Group, Problem, Sample, ScoredBatch


def sample(length: int, correct: bool) -> Sample:
    ids = torch.arange(length) % 7
    return Sample(prompt_ids=torch.zeros(2, dtype=torch.long), completion_ids=ids,
                  rollout_logprobs=torch.zeros(length), loss_mask=torch.ones(length, dtype=torch.bool),
                  finish_reason="stop", correct=correct, reward=float(correct))


def group(lengths, correct) -> Group:
    return Group(problem=Problem("p", "1+1", "2"), samples=[sample(n, c) for n, c in zip(lengths, correct)])


def ctx(seed: int = 0, step: int = 0):
    """The two things the transform reads from a RolloutContext: the step and ``rng(stage)``."""
    uses = itertools.count()
    return types.SimpleNamespace(step=step, rng=lambda stage: torch.Generator().manual_seed(
        stable_seed(seed, step, stage, next(uses))))


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# Pinned example: correct lengths 10, 20, 30, 40 (indices 0, 2, 4, 6), incorrect 15, 25, 35, 45 (1, 3, 5, 7).
LENGTHS = [10, 15, 20, 25, 30, 35, 40, 45]
CORRECT = [True, False] * 4


def test_quota_pinned():
    # m+ = floor(M n+ / K + 1/2): 3·8/16 = 1.5 -> 2; 1·8/16 = 0.5 -> 1; 5·8/16 = 2.5 -> 3; 2 -> 1;
    # 15·8/16 = 7.5 -> 8, clamped to M - 1 = 7 (a mixed pool stays mixed); 1·4/16 = 0.25 -> 0, clamped to 1.
    assert [positive_quota(n, 16, 8) for n in (0, 1, 2, 3, 5, 8, 15, 16)] == [0, 1, 1, 2, 3, 4, 7, 8]
    assert positive_quota(1, 16, 4) == 1 and positive_quota(15, 16, 4) == 3
    assert positive_quota(2, 6, 3) == 1 and positive_quota(3, 6, 3) == 2  # 1.0 -> 1; 1.5 -> 2


def test_quadrants_pinned():
    # correct pool 10, 20, 30, 40 -> the shorter ceil(4/2) = 2 are short; incorrect 15, 25, 35, 45 likewise
    assert quadrants(LENGTHS, CORRECT, [0.0] * 8) == ["sc", "si", "sc", "si", "lc", "li", "lc", "li"]
    # odd pool of 3: ceil(3/2) = 2 short
    assert quadrants([5, 9, 7], [True] * 3, [0.0] * 3) == ["sc", "lc", "sc"]
    # the tie at the boundary (two 5s, one short slot left after the 3) goes to the smaller tie-break value
    assert quadrants([5, 5, 9, 3], [False] * 4, [0.9, 0.1, 0.5, 0.0]) == ["li", "si", "li", "si"]


def test_alpha_zero_pinned():
    # M = 4: m+ = 4·4/8 = 2 = |SC|, m- = 2 = |LI| -> keep lengths 10, 20 (correct) and 35, 45 (incorrect)
    for seed in range(5):
        kept, _ = select(LENGTHS, CORRECT, 4, 0.0, gen(seed))
        assert kept == [0, 2, 5, 7]


def test_transform_output_and_metrics_pinned():
    t = QLPOTransform(QLPOConfig(keep=4, alpha=0.0))
    out = t([group(LENGTHS, CORRECT)], ctx())
    assert [s.length for s in out[0].samples] == [10, 20, 35, 45]
    m = t.metrics()
    for q in ("sc", "lc", "si", "li"):
        assert m[f"rollout/qlpo_{q}_frac_before"] == 0.25
    assert (m["rollout/qlpo_sc_frac_after"], m["rollout/qlpo_li_frac_after"]) == (0.5, 0.5)
    assert (m["rollout/qlpo_lc_frac_after"], m["rollout/qlpo_si_frac_after"]) == (0.0, 0.0)
    assert m["rollout/qlpo_len_mean_before"] == 27.5 and m["rollout/qlpo_len_mean_after"] == 27.5  # (10+20+35+45)/4
    assert m["rollout/qlpo_correct_frac_after"] == 0.5 and m["rollout/qlpo_pool_tokens"] == 220


def test_metrics_accumulate_within_a_step_and_reset_on_the_next():
    t = QLPOTransform(QLPOConfig(keep=4, alpha=0.0))
    t([group(LENGTHS, CORRECT)], ctx(step=3))
    t([group(LENGTHS, CORRECT)], ctx(step=3))  # a refill in the same step
    assert t.metrics()["rollout/qlpo_pool_tokens"] == 440
    t([group(LENGTHS, CORRECT)], ctx(step=4))
    assert t.metrics()["rollout/qlpo_pool_tokens"] == 220


def random_group(n_pos: int, k: int, rng: random.Random):
    correct = [True] * n_pos + [False] * (k - n_pos)
    rng.shuffle(correct)
    return [rng.randint(20, 90) for _ in range(k)], correct


@pytest.mark.parametrize("alpha", [0.0, 1 / 3, 1.0])
def test_size_and_correct_ratio(alpha):
    # property 1: exactly M kept; #correct kept = m+ (the pool's ratio up to rounding); mixed stays mixed
    rng = random.Random(0)
    for n_pos in range(17):
        lengths, correct = random_group(n_pos, 16, rng)
        kept, _ = select(lengths, correct, 8, alpha, gen(n_pos))
        n_kept = sum(correct[i] for i in kept)
        assert len(kept) == 8 and len(set(kept)) == 8
        assert n_kept == positive_quota(n_pos, 16, 8)
        if 0 < n_pos < 16:
            assert 1 <= n_kept <= 7 and abs(n_kept / 8 - n_pos / 16) <= 1 / 8 + 1e-12


def test_alpha_one_is_uniform_within_pools_chi_square():
    # property 2: K = 6, M = 3, correct pool {0, 1, 2} (m+ = 2) and incorrect pool {3, 4, 5} (m- = 1):
    # 3 x 3 = 9 equally likely joint outcomes. 4,500 draws, chi-square with 8 dof; p = 0.001 critical 26.12.
    lengths, correct = [11, 52, 30, 12, 70, 41], [True] * 3 + [False] * 3

    def chi2(alpha: float) -> float:
        counts: dict[tuple[int, ...], int] = {}
        for seed in range(4500):
            kept, _ = select(lengths, correct, 3, alpha, gen(seed))
            counts[tuple(kept)] = counts.get(tuple(kept), 0) + 1
        assert len(counts) <= 9
        return sum((counts.get(o, 0) - 500) ** 2 / 500 for o in
                   [(*c, i) for c in itertools.combinations(range(3), 2) for i in range(3, 6)])

    assert chi2(1.0) < 26.12
    assert chi2(1 / 3) > 100  # the test has power: alpha = 1/3 is far from uniform


def test_alpha_zero_keeps_shortest_correct_and_longest_incorrect_when_k_is_2m():
    # property 3 (K = 2M, no clamp: m+ = |SC|, m- = |LI|), lengths with ties included
    rng = random.Random(1)
    for n_pos in range(0, 15):
        for rep in range(5):
            lengths, correct = random_group(n_pos, 16, rng)
            kept, _ = select(lengths, correct, 8, 0.0, gen(rep))
            pos = sorted(lengths[i] for i in range(16) if correct[i])
            neg = sorted(lengths[i] for i in range(16) if not correct[i])
            m_pos = positive_quota(n_pos, 16, 8)
            assert sorted(lengths[i] for i in kept if correct[i]) == pos[:m_pos]
            assert sorted(lengths[i] for i in kept if not correct[i]) == neg[len(neg) - (8 - m_pos):]


def test_monotone_in_alpha_draw_by_draw():
    # property 4: the same draws couple every alpha, so the monotonicity holds per draw (hence in expectation)
    rng = random.Random(2)
    alphas = [0.0, 0.05, 0.2, 1 / 3, 0.6, 0.9, 1.0]
    for rep in range(200):
        lengths, correct = random_group(rng.randint(2, 14), 16, rng)

        def means(alpha, lengths=lengths, correct=correct, rep=rep):
            kept, _ = select(lengths, correct, 8, alpha, gen(rep))
            pos = [lengths[i] for i in kept if correct[i]]
            neg = [lengths[i] for i in kept if not correct[i]]
            return sum(pos) / len(pos), sum(neg) / len(neg)

        pos_means, neg_means = zip(*(means(a) for a in alphas))
        assert all(a <= b for a, b in zip(pos_means, pos_means[1:]))
        assert all(a >= b for a, b in zip(neg_means, neg_means[1:]))


def test_advantages_match_full_pool_grpo_up_to_group_size():
    # property 5: n+ = 6 of K = 16 -> m+ = 3 of M = 8, pass rate p = 0.375 in both. With 0/1 rewards and
    # eps = 0, A = (r - p) / std with ddof=1 std = sqrt(p(1-p) n/(n-1)):
    #   K = 16: std = sqrt(0.234375 * 16/15) = 0.5; A+ = 0.625/0.5 = 1.25, A- = -0.375/0.5 = -0.75
    #   M = 8:  std = sqrt(0.234375 * 8/7) = 0.517549; A+ = 1.207615, A- = -0.724569 (x 0.9661 of the pool's)
    lengths, correct = random_group(6, 16, random.Random(3))
    g = group(lengths, correct)
    kept = QLPOTransform(QLPOConfig(keep=8))([g], ctx())[0]
    full = grpo(ScoredBatch.from_groups([g]), GRPOConfig(eps=0.0))[0]
    sub = grpo(ScoredBatch.from_groups([kept]), GRPOConfig(eps=0.0))[0]
    assert_close(full, torch.tensor([1.25 if c else -0.75 for c in correct], dtype=torch.float64), rtol=0, atol=1e-12)
    std = math.sqrt(0.234375 * 8 / 7)
    expected = torch.tensor([0.625 / std if s.correct else -0.375 / std for s in kept.samples], dtype=torch.float64)
    assert sum(s.correct for s in kept.samples) == 3
    assert_close(sub, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("flag", [True, False])
def test_degenerate_pools_give_zero_advantages(flag):
    # property 6: an all-correct or all-incorrect pool keeps M samples of one kind -> GRPO gives zeros
    g = group([30 + i for i in range(16)], [flag] * 16)
    kept = QLPOTransform(QLPOConfig(keep=8))([g], ctx())[0]
    assert len(kept.samples) == 8 and all(s.correct == flag for s in kept.samples)
    assert torch.equal(grpo(ScoredBatch.from_groups([kept]), GRPOConfig())[0], torch.zeros(8, dtype=torch.float64))


def test_deterministic_under_a_fixed_seed():
    # property 7
    lengths, correct = random_group(7, 16, random.Random(4))
    assert select(lengths, correct, 8, 1 / 3, gen(11)) == select(lengths, correct, 8, 1 / 3, gen(11))
    outs = {tuple(select(lengths, correct, 8, 1 / 3, gen(s))[0]) for s in range(20)}
    assert len(outs) > 1  # and the seed matters


@pytest.mark.parametrize("alpha", [0.0, 1 / 3, 1.0])
def test_keep_equal_to_group_size_returns_groups_unchanged(alpha):
    # the neutral setting: keep = K is bit-identical to plain GRPO on K (same objects, same order)
    groups = [group(*random_group(n, 8, random.Random(n))) for n in (0, 3, 8)]
    out = QLPOTransform(QLPOConfig(keep=8, alpha=alpha))(groups, ctx())
    assert all(a is b for a, b in zip(out, groups))


def test_config_validated_at_load():
    ok = load(None, ["rollout.group_size=16", "rollout.transforms=[{name: qlpo, keep: 8, alpha: 0.25}]"])
    assert ok.rollout.transforms[0].cfg == QLPOConfig(keep=8, alpha=0.25)
    with pytest.raises(ConfigError, match="keep=9 exceeds rollout.group_size=8"):
        load(None, ["rollout.transforms=[{name: qlpo, keep: 9}]"])
    with pytest.raises(ConfigError, match=r"alpha=1.5: must be in \[0, 1\]"):
        load(None, ["rollout.group_size=16", "rollout.transforms=[{name: qlpo, alpha: 1.5}]"])
    with pytest.raises(ConfigError, match="alpha=-0.1"):
        load(None, ["rollout.group_size=16", "rollout.transforms=[{name: qlpo, alpha: -0.1}]"])
    with pytest.raises(ConfigError, match="keep=1"):
        load(None, ["rollout.transforms=[{name: qlpo, keep: 1}]"])


def test_neutral_setting_trains_bit_identically_to_grpo(tmp_path, tokenizer):
    # keep = K through the whole loop: the same groups, advantages and update as plain GRPO, to the bit.
    # Scripted completions of different lengths under a length-shaped reward make every group's advantages
    # non-zero, so the update really moves the weights.
    from groupwise.loop.trainer import train
    from groupwise.models.load import load_pretrained
    from groupwise.models.tiny import build_model

    texts = ["<answer>1</answer>", "<think>so 1.</think><answer>1</answer>", "<answer>12</answer>", "x"]
    base = ["model.warm_start=false", "trainer.steps=2", "trainer.save_every=0", "trainer.threads=1",
            "trainer.progress=false", "trainer.sinks=[jsonl]", "rollout.prompts_per_step=2", "rollout.group_size=4",
            f"rollout.generator={{name: fake, completions: {texts}}}", "rollout.max_completion_tokens=48",
            "reward.terms=[{name: length_penalty, coef: 0.5, max_length: 48}]",
            "eval.before=false", "eval.after=false", f"out_dir={tmp_path}"]
    train(load(None, [*base, "name=grpo"]))
    train(load(None, [*base, "name=qlpo", "rollout.transforms=[{name: qlpo, keep: 4, alpha: 0.25}]"]))
    a = load_pretrained(tmp_path / "grpo" / "checkpoints" / "step_0000002" / "model")[0].state_dict()
    b = load_pretrained(tmp_path / "qlpo" / "checkpoints" / "step_0000002" / "model")[0].state_dict()
    init = build_model("lab-tiny", tokenizer, seed=0).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], init[k]) for k in a)
