import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from groupwise.methods.think_modes.mode_balance import ModeBalanceConfig, mode_balance
from groupwise.registry import NoConfig
from groupwise.standard.grpo import dr_grpo
from groupwise.types import Group, Problem, Sample, ScoredBatch

MODES = ["<NT>", "<SH>", "<LG>"]


def batch(modes, rewards, correct=None) -> ScoredBatch:
    groups = []
    for i, (ms, rs) in enumerate(zip(modes, rewards)):
        cs = correct[i] if correct else [r > 0 for r in rs]
        samples = [Sample(prompt_ids=torch.zeros(1, dtype=torch.long), completion_ids=torch.zeros(2, dtype=torch.long),
                          rollout_logprobs=torch.zeros(2), loss_mask=torch.ones(2, dtype=torch.bool),
                          finish_reason="stop", reward=float(r), correct=bool(c), meta={"mode": m})
                   for m, r, c in zip(ms, rs, cs)]
        groups.append(Group(Problem(f"p{i}", "q", "1"), samples))
    return ScoredBatch.from_groups(groups)


def test_pinned_gate_and_shares():
    # 8 samples: NT 1 (1/8), SH 2 (2/8), LG 5 (5/8); p* = 1/3, β = 0.1
    #   NT: 0.1·(1/3 − 1/8) = +0.0208333 (applied only if correct)
    #   SH: 0.1·(1/3 − 1/4) = +0.0083333 (only if correct)
    #   LG: 0.1·(1/3 − 5/8) = −0.0291667 (only if incorrect)
    b = batch([["<NT>", "<SH>", "<SH>", "<LG>"], ["<LG>", "<LG>", "<LG>", "<LG>"]],
              [[1, 0, 1, 1], [1, 0, 0, 1]])
    adv = dr_grpo(b, NoConfig())  # group 0 mean .75 → [.25, −.75, .25, .25]; group 1 mean .5 → [.5, −.5, −.5, .5]
    out = mode_balance(b, adv, ModeBalanceConfig(coef=0.1))
    nt, sh, lg = 0.1 * (1 / 3 - 1 / 8), 0.1 * (1 / 3 - 1 / 4), 0.1 * (1 / 3 - 5 / 8)
    expected = torch.tensor([[0.25 + nt, -0.75, 0.25 + sh, 0.25], [0.5, -0.5 + lg, -0.5 + lg, 0.5]],
                            dtype=torch.float64)
    assert_close(out, expected, rtol=0, atol=1e-12)


def test_balanced_shares_vanish_and_zero_coef_is_identity():
    # property 4 (first half): f_m = 1/3 for all m → no term; β = 0 returns the input itself (neutral setting)
    b = batch([["<NT>", "<SH>", "<LG>"], ["<LG>", "<SH>", "<NT>"]], [[1, 0, 1], [0, 1, 0]])
    adv = dr_grpo(b, NoConfig())
    assert_close(mode_balance(b, adv, ModeBalanceConfig(coef=0.5)), adv, rtol=0, atol=1e-15)
    assert mode_balance(b, adv, ModeBalanceConfig(coef=0.0)) is adv


def test_invalid_modes_and_padding_get_no_term():
    # shares over valid modes only: NT 1/2, LG 1/2 → both over 1/3 → negative, only on incorrect rollouts
    b = batch([["<NT>", "invalid", "<LG>"], ["<LG>"]], [[0, 0, 0], [0]], correct=[[False, False, True], [False]])
    out = mode_balance(b, torch.zeros(2, 3, dtype=torch.float64), ModeBalanceConfig(coef=0.3))
    neg = 0.3 * (1 / 3 - 2 / 3)  # LG share is 2/3 (2 of the 3 valid samples)
    neg_nt = 0.3 * (1 / 3 - 1 / 3)
    assert_close(out, torch.tensor([[neg_nt, 0.0, 0.0], [neg, 0.0, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(MODES), st.booleans()), min_size=2, max_size=6),
                min_size=1, max_size=5), st.floats(0.01, 2.0))
def test_gate_never_hurts_correct_nor_helps_incorrect(rows, coef):
    # property 4 (second half) and property 5 (mean-centred advantages sum to 0 per group before the term)
    b = batch([[m for m, _ in r] for r in rows], [[float(c) for _, c in r] for r in rows])
    adv = dr_grpo(b, NoConfig())
    assert (adv.sum(-1).abs() < 1e-12).all()
    delta = mode_balance(b, adv, ModeBalanceConfig(coef=coef)) - adv
    assert (delta[b.correct] >= 0).all() and (delta[~b.correct & b.mask] <= 0).all()
    assert (delta[~b.mask] == 0).all()
