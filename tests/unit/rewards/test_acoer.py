import math
import random

import pytest
import torch
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.acoer.length_penalty import LengthPenaltyConfig, length_penalty
from groupwise.methods.acoer.reward import ACOER, ACOERConfig, efficiency
from groupwise.registry import ConfigError, NoConfig
from groupwise.standard.grpo import GRPOConfig, dr_grpo, grpo
from groupwise.standard.rewards import correctness
from groupwise.types import Group, Problem, Sample, ScoredBatch


def sample(length: int, correct: bool, text: str = "") -> Sample:
    return Sample(prompt_ids=torch.zeros(2, dtype=torch.long), completion_ids=torch.zeros(length, dtype=torch.long),
                  rollout_logprobs=torch.zeros(length), loss_mask=torch.ones(length, dtype=torch.bool),
                  finish_reason="stop", text=text, correct=correct)


def group(lengths, correct) -> Group:
    return Group(problem=Problem("p", "1+1", "2"), samples=[sample(n, c) for n, c in zip(lengths, correct)])


def scored(groups, rewards) -> ScoredBatch:
    for g, row in zip(groups, rewards):
        for s, r in zip(g.samples, row):
            s.reward = r
    return ScoredBatch.from_groups(groups)


def term(**kw) -> ACOER:
    return ACOER(ACOERConfig(**kw))


def test_rewards_pinned():
    # B = 100, alpha = 0.5, s = 5. Correct, l = 40: n = 0.4, f = ln(1 + 5*0.6)/ln 6 = ln 4/ln 6 = 0.7737056
    # -> 1.3868528; l = 0: f = 1 -> 1.5; l = 100 and 150: n = 1, f = 0 -> 1.0; incorrect -> 0.
    t = term(alpha_init=0.5, budget_init=100, budget_min=10)
    out = t([group([40, 0, 100, 150, 40], [True, True, True, True, False])], step=0)
    expected = [1 + 0.5 * math.log(4) / math.log(6), 1.5, 1.0, 1.0, 0.0]
    assert_close(torch.tensor(out[0]), torch.tensor(expected), rtol=0, atol=1e-12)
    assert abs(out[0][0] - 1.3868528) < 1e-7


def test_linear_mode_pinned():
    # f = 1 - n: l = 40 of B = 100 -> 1 + 0.5 * 0.6 = 1.3; l = 75 -> 1 + 0.5 * 0.25 = 1.125
    out = term(alpha_init=0.5, budget_init=100, budget_min=10, mode="linear")([group([40, 75], [True, True])], 0)
    assert out == [[1.3, 1.125]]


def test_think_chars_length_unit():
    # the think span "1+1=2;so 2." has 11 characters: n = 11/22 = 0.5, linear f = 0.5 -> 1 + 0.2 * 0.5
    s = sample(99, True, "<think>1+1=2;so 2.</think><answer>2</answer>")
    no_think = sample(99, True, "<answer>2</answer>")  # no think block: length 0 (as upstream) -> full bonus
    t = term(alpha_init=0.2, alpha_max=0.5, budget_init=22, budget_min=1, mode="linear", length_unit="think_chars")
    out = t([Group(Problem("p", "1+1", "2"), [s, no_think])], 0)
    assert_close(torch.tensor(out[0]), torch.tensor([1.1, 1.2]), rtol=0, atol=1e-12)


def test_efficiency_endpoints():
    assert efficiency(0, 50, "log", 5.0) == 1.0 and efficiency(50, 50, "log", 5.0) == 0.0
    assert efficiency(80, 50, "linear", 5.0) == 0.0 and efficiency(25, 50, "linear", 5.0) == 0.5


def test_incorrect_zero_correct_bounded_and_ordered():
    # properties 1, 2, 4: incorrect -> 0, correct in [1, 1 + alpha], non-increasing in length, 1 beyond budget
    rng = random.Random(0)
    for mode in ("log", "linear"):
        t = term(alpha_init=0.3, budget_init=60, budget_min=10, mode=mode)
        lengths = list(range(0, 130, 3))
        rewards = t([group(lengths, [True] * len(lengths))], 0)[0]
        assert all(1.0 <= r <= 1.3 for r in rewards)
        assert all(a >= b for a, b in zip(rewards, rewards[1:]))
        assert all(r == 1.0 for n, r in zip(lengths, rewards) if n >= 60)
        mixed = [rng.random() < 0.5 for _ in lengths]
        out = t([group(lengths, mixed)], 0)[0]
        assert all(r == 0.0 for r, c in zip(out, mixed) if not c)
        assert min((r for r, c in zip(out, mixed) if c), default=2) > max((r for r, c in zip(out, mixed) if not c),
                                                                         default=-1)


def test_all_incorrect_group_has_zero_advantages():
    # property 3: no length signal among wrong answers, under both normalisations
    g = group([20, 35, 50, 90], [False] * 4)
    rewards = term(alpha_init=0.5)([g], 0)
    b = scored([g], rewards)
    assert torch.equal(grpo(b, GRPOConfig()), torch.zeros(1, 4, dtype=torch.float64))
    assert torch.equal(dr_grpo(b, NoConfig()), torch.zeros(1, 4, dtype=torch.float64))


def test_contrast_all_answer_length_penalty_gives_unit_scale_advantages():
    # property 7, the failure mode ACOER removes: an all-incorrect group with lengths 50..53 under
    # r = c - 0.2 l/112 has rewards differing by only 0.2/112 = 0.0017857 per token, yet std normalisation makes
    # them unit-scale: std(l) = 1.2909944 (ddof=1), reward std = 0.0023053, A = -(l - 51.5)/1.2909944 *
    # s/(s + 1e-4) with s = 0.0023053 -> [1.1136, 0.3712, -0.3712, -1.1136]: shorter wrong answers are pushed up.
    lengths = [50, 51, 52, 53]
    g_pen, g_acoer = group(lengths, [False] * 4), group(lengths, [False] * 4)
    pen = length_penalty(LengthPenaltyConfig(coef=0.2, max_length=112), None)([g_pen], 0)
    adv_pen = grpo(scored([g_pen], pen), GRPOConfig())[0]
    s = 0.2 / 112 * math.sqrt(5 / 3)
    expected = torch.tensor([-(n - 51.5) / math.sqrt(5 / 3) * s / (s + 1e-4) for n in lengths], dtype=torch.float64)
    assert_close(adv_pen, expected, rtol=0, atol=1e-9)
    assert adv_pen.abs().max() > 1.0 and max(pen[0]) - min(pen[0]) < 0.006
    adv_acoer = grpo(scored([g_acoer], term(alpha_init=0.5, budget_init=112, budget_min=16)([g_acoer], 0)),
                     GRPOConfig())[0]
    assert torch.equal(adv_acoer, torch.zeros(4, dtype=torch.float64))


def batch(acc: float, correct_len: float = 40.0, n: int = 10) -> list[Group]:
    k = round(acc * n)
    return [group([int(correct_len)] * k + [7] * (n - k), [True] * k + [False] * (n - k))]


def test_ema_pinned():
    # span 3 -> d = 0.5: acc 1.0 then 0.5 -> EMA 1.0, 0.75; correct lengths 40 then 60 -> EMA 40, 50;
    # a call without correct samples leaves the length EMA at 50 (acc EMA 0.375)
    t = term(ema_span=3)
    t(batch(1.0, 40), 0)
    t(batch(0.5, 60), 1)
    assert (t.ema_acc, t.ema_len) == (0.75, 50.0)
    t(batch(0.0), 2)
    assert (t.ema_acc, t.ema_len) == (0.375, 50.0)


def test_alpha_moves_only_after_warmup_and_a_full_window():
    # property 5: window 5, warm-up 8 steps, stable accuracy: calls at steps 0..7 leave alpha at 0.02;
    # step 8 is past warm-up with a full window -> 0.02 * 1.02
    t = term(warmup_steps=8, window=5, ema_span=1)
    for step in range(8):
        t(batch(0.5), step)
        assert t.alpha == 0.02 and t.budget == 4096
    t(batch(0.5), 8)
    assert_close(t.alpha, 0.02 * 1.02, rtol=0, atol=1e-15)
    t2 = term(warmup_steps=0, window=5, ema_span=1)
    for step in range(4):  # past warm-up, but the window is not full until the 5th call
        t2(batch(0.5), step)
    assert t2.alpha == 0.02
    t2(batch(0.5), 4)
    assert t2.alpha > 0.02


def test_alpha_up_geometric_to_max_in_163_updates():
    # 0.02 * 1.02^162 = 0.4937 < 0.5 <= 0.02 * 1.02^163 = 0.5036 -> capped at alpha_max on update 163
    t = term(warmup_steps=0, window=1, ema_span=1)
    for i in range(162):
        t(batch(0.5), i)
    assert_close(t.alpha, 0.02 * 1.02 ** 162, rtol=1e-12, atol=0)
    t(batch(0.5), 162)
    assert t.alpha == 0.5
    for i in range(10):
        t(batch(0.5), 163 + i)
    assert t.alpha == 0.5


def test_alpha_down_on_sustained_drop_and_bounded_below():
    # window 2, span 1 (EMA = the call's accuracy): the reference is the previous call. Accuracy falling by
    # 0.1 per call (> 0.02) -> alpha x0.95 each call until alpha_min; a flat call afterwards -> x1.02
    t = term(alpha_init=0.1, warmup_steps=0, window=2, ema_span=1)
    t(batch(1.0, n=100), 0)
    for i, acc in enumerate([0.9, 0.8, 0.7]):
        t(batch(acc, n=100), i + 1)
        assert_close(t.alpha, 0.1 * 0.95 ** (i + 1), rtol=1e-12, atol=0)
    slide = term(warmup_steps=0, window=2, ema_span=1)  # 0.02 * 0.95^14 < 0.01: bottoms out at alpha_min
    for i in range(20):
        slide(batch(0.7 - 0.03 * i, n=100), i)
        assert slide.alpha >= 0.01
    assert slide.alpha == 0.01
    low = term(alpha_init=0.0105, warmup_steps=0, window=2, ema_span=1)
    low(batch(1.0), 0)
    low(batch(0.5), 1)
    assert low.alpha == 0.01  # max(alpha_min, 0.0105 * 0.95 = 0.009975)
    low(batch(0.5), 2)
    assert_close(low.alpha, 0.0102, rtol=1e-12, atol=0)


def test_small_drop_within_threshold_still_raises_alpha():
    t = term(warmup_steps=0, window=2, ema_span=1)
    t(batch(0.5, n=100), 0)
    t(batch(0.49, n=100), 1)  # drop 0.01 <= 0.02
    assert_close(t.alpha, 0.0204, rtol=1e-12, atol=0)


def test_budget_tracks_ema_length_and_respects_floor():
    # property 6: B = max(B_min, 0.85 EMA_len); span 1 -> EMA_len = the call's mean correct length
    t = term(warmup_steps=0, window=1, ema_span=1, budget_init=200, budget_min=30)
    t([group([40, 60, 5], [True, True, False])], 0)  # mean correct length 50 -> 42.5
    assert t.budget == 42.5
    t(batch(0.5, correct_len=20), 1)  # 0.85 * 20 = 17 < 30 -> 30
    assert t.budget == 30


def test_batch_is_scored_before_the_controller_moves():
    # the first call is scored with alpha_init and B_0 although its own statistics then move both
    t = term(alpha_init=0.5, alpha_max=0.5, warmup_steps=0, window=1, ema_span=1, budget_init=100, budget_min=10,
             mode="linear")
    out = t([group([50], [True])], 0)
    assert out == [[1.25]] and t.budget == 42.5
    assert t([group([50], [True])], 1) == [[1.0]]  # now l >= B


def test_neutral_setting_equals_correctness():
    t = term(alpha_init=0.0, alpha_min=0.0, alpha_max=0.0, warmup_steps=0, window=1, ema_span=1)
    plain = correctness(NoConfig(), None)
    rng = random.Random(5)
    for step in range(30):
        groups = [group([rng.randint(1, 120) for _ in range(8)], [rng.random() < 0.6 for _ in range(8)])
                  for _ in range(3)]
        assert t(groups, step) == plain(groups, step)
    assert t.alpha == 0.0


def test_state_dict_round_trip_resumes_exactly():
    kw = dict(warmup_steps=2, window=3, ema_span=2, budget_init=120, budget_min=8)
    a, rng = term(**kw), random.Random(6)
    data = [[group([rng.randint(10, 100) for _ in range(6)], [rng.random() < 0.5 for _ in range(6)])]
            for _ in range(12)]
    for step in range(6):
        a(data[step], step)
    state = a.state_dict()
    b = term(**kw)
    b.load_state_dict(torch.load(_save(state), weights_only=True))  # as the checkpoint stores it
    for step in range(6, 12):
        assert a(data[step], step) == b(data[step], step)
    assert a.state_dict() == b.state_dict() and a.metrics() == b.metrics()


def _save(state):
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


def test_metrics_exposed():
    t = term(alpha_init=0.5, budget_init=100, budget_min=10, mode="linear")
    t([group([40, 60], [True, False])], 0)
    m = t.metrics()
    assert m["reward/acoer_alpha"] == 0.5 and m["reward/acoer_budget"] == 100
    assert m["reward/acoer_ema_acc"] == 0.5 and m["reward/acoer_ema_len"] == 40
    assert m["reward/acoer_bonus_mean"] == 0.3  # 0.5 * (1 - 0.4)


@pytest.mark.parametrize("bad, match", [
    ("budget_min: 0", "need 0 < budget_min <= budget_init"),
    ("budget_init: -5", "need 0 < budget_min <= budget_init"),
    ("budget_init: 100, budget_min: 200", "need 0 < budget_min <= budget_init"),
    ("alpha_min: 0.3", "need 0 <= alpha_min <= alpha_init <= alpha_max"),
    ("alpha_init: 0.6", "need 0 <= alpha_min <= alpha_init <= alpha_max"),
    ("alpha_min: -0.1", "need 0 <= alpha_min <= alpha_init <= alpha_max"),
    ("alpha_up: 0.9", "need up >= 1"),
    ("window: 0", "need ema_span, window >= 1"),
])
def test_config_validated_at_load(bad, match):
    with pytest.raises(ConfigError, match=match):
        load(None, [f"reward.terms=[{{name: acoer, {bad}}}]"])


def test_state_round_trips_through_a_trainer_checkpoint(tmp_path):
    # 3 steps + checkpoint + resume for 2 more reproduces 5 uninterrupted steps, control loop included. Scripted
    # completions answer 0..9 with different lengths (one correct per group, its length set by the problem).
    from groupwise import checkpoint as ckpt
    from groupwise.log import read_metrics
    from groupwise.loop.trainer import train

    texts = [f"<think>{'x' * ((7 * d) % 13)}</think><answer>{d}</answer>" for d in range(10)]
    acoer = ("reward.terms=[{name: acoer, warmup_steps: 1, window: 2, ema_span: 2, budget_init: 48, budget_min: 4,"
             " alpha_init: 0.1, alpha_up: 1.5}]")
    base = ["model.warm_start=false", "trainer.save_every=2", "trainer.threads=1", "trainer.progress=false",
            "trainer.sinks=[jsonl]", "rollout.prompts_per_step=2", "rollout.group_size=10",
            f"rollout.generator={{name: fake, completions: {texts}}}", "rollout.max_completion_tokens=48", acoer,
            "eval.before=false", "eval.after=false", f"out_dir={tmp_path}"]
    train(load(None, [*base, "name=a", "trainer.steps=5"]))
    train(load(None, [*base, "name=b", "trainer.steps=3"]))
    saved = torch.load(tmp_path / "b" / "checkpoints" / "step_0000003" / ckpt.STATE, weights_only=False)
    train(load(None, [*base, "name=b", "trainer.steps=5"]), resume=True)

    def acoer_rows(run):
        return [{k: v for k, v in r.items() if k.startswith("reward/")} | {"step": r["step"]}
                for r in read_metrics(tmp_path / run) if "reward/acoer_alpha" in r]

    a, b = acoer_rows("a"), acoer_rows("b")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5] and a == b
    state = saved["components"]["reward0/acoer"]
    assert state["alpha"] == a[2]["reward/acoer_alpha"] and state["budget"] == a[2]["reward/acoer_budget"]
    assert state["calls"] == 3 and len(state["history"]) == 2
    assert a[4]["reward/acoer_alpha"] > a[2]["reward/acoer_alpha"] > 0.1  # the loop moved, before and after
    final = [torch.load(tmp_path / r / "checkpoints" / "step_0000005" / ckpt.STATE, weights_only=False)
             ["components"]["reward0/acoer"] for r in ("a", "b")]
    assert final[0] == final[1]
