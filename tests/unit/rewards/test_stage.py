import math
import sys
import time

import numpy as np
import pytest
import torch
from support import reward_stage

from groupwise.registry import ConfigError
from groupwise.rewards.stage import BoundTerm, RewardStage, SampleErrors, VerifierTimeout, call_with_timeout
from groupwise.types import Group, Problem, Sample


def sample(text):
    z = torch.zeros(1, dtype=torch.long)
    return Sample(prompt_ids=z, completion_ids=z, rollout_logprobs=torch.zeros(1),
                  loss_mask=torch.ones(1, dtype=torch.bool), finish_reason="stop", text=text)


class CrashyTask:
    name = "crashy"

    def verify(self, problem, text):
        if text == "boom":
            raise RuntimeError("parser crashed")
        if text == "slow":
            time.sleep(5)
        return text == problem.answer

    def format_ok(self, text):
        return text.isdigit()


def test_crashes_and_timeouts_are_counted_not_fatal(capsys):
    stage = reward_stage(CrashyTask(), ["reward.terms=[{name: correctness}, {name: format, weight: 0.5}]"], 0.2)
    g = Group(Problem("p", "q", "7"), [sample("7"), sample("boom"), sample("slow"), sample("3")])
    t0 = time.time()
    stage([g], step=0)
    assert time.time() - t0 < 2
    assert [s.correct for s in g.samples] == [True, False, False, False]
    assert [s.verifier_error for s in g.samples] == [False, True, True, False]
    assert [s.reward for s in g.samples] == [1.5, 0.0, 0.0, 0.5]
    assert g.samples[0].reward_terms == {"correctness": 1.0, "format": 1.0}
    assert all(s.scored for s in g.samples)
    err = capsys.readouterr().err  # the first verifier failure is printed once, with its sample
    assert (err.count("groupwise: the verifier failed") == 1 and "'boom'" in err
            and "RuntimeError: parser crashed" in err)


def test_zero_weight_term_is_logged_only():
    g = Group(Problem("p", "q", "7"), [sample("3")])
    reward_stage(CrashyTask(), ["reward.terms=[{name: correctness}, {name: format, weight: 0}]"])([g], 0)
    assert g.samples[0].reward == 0.0 and g.samples[0].reward_terms["format"] == 1.0


def test_disqualified_sample_is_incorrect_without_a_verifier_call():
    class Counting(CrashyTask):
        calls = 0

        def verify(self, problem, text):
            Counting.calls += 1
            return super().verify(problem, text)

    g = Group(Problem("p", "q", "7"), [sample("7"), sample("7")])
    g.samples[1].disqualified = "over_cap"
    reward_stage(Counting())([g], 0)
    assert [s.correct for s in g.samples] == [True, False] and Counting.calls == 1
    assert [s.reward for s in g.samples] == [1.0, 0.0]


def bound(label, fn, weight=1.0):
    return BoundTerm(label, weight, fn)


def test_none_is_not_applicable_and_nan_counts_as_none():
    # term a: [1, None, nan] (weight 2); term b: [0.5, 0.5, 0.5] → rewards 2.5, 0.5, 0.5
    a = bound("a", lambda groups, step: [[1.0, None, math.nan]], 2.0)
    b = bound("b", lambda groups, step: [[0.5, 0.5, 0.5]])
    g = Group(Problem("p", "q", "7"), [sample("7"), sample("7"), sample("7")])
    RewardStage(CrashyTask(), [a, b], 1.0)([g], 0)
    assert [s.reward for s in g.samples] == [2.5, 0.5, 0.5]
    assert math.isnan(g.samples[1].reward_terms["a"]) and math.isnan(g.samples[2].reward_terms["a"])


def test_a_crashing_term_is_counted_per_term_and_logged_once(capsys):
    def broken(groups, step):
        raise ZeroDivisionError("oops\nsecond line")

    stage = RewardStage(CrashyTask(),
                        [bound("broken", broken), bound("ok", lambda gs, s: [[1.0] * len(x.samples) for x in gs])], 1.0)
    g = Group(Problem("p1", "q", "7"), [sample("7"), sample("3")])
    stage([g], 0)
    stage([Group(Problem("p2", "q", "7"), [sample("7")])], 0)
    assert [s.reward for s in g.samples] == [1.0, 1.0]  # the broken term adds nothing
    assert stage.metrics() == {"reward/broken_errors": 3.0, "reward/ok_errors": 0.0}
    err = capsys.readouterr().err
    assert err.count("reward 'broken' failed") == 1 and "ZeroDivisionError: oops" in err and "second" not in err
    stage([g], 1)  # a new step starts a new count
    assert stage.metrics()["reward/broken_errors"] == 2.0


def test_partial_failures_and_wrong_lengths():
    def partial(groups, step):
        raise SampleErrors([[1.0, None]], {(0, 1): ValueError("bad sample")})

    stage = RewardStage(CrashyTask(), [bound("partial", partial), bound("short", lambda g, s: [[1.0]]),
                                       bound("text", lambda g, s: [["x", 1.0]])], 1.0)
    g = Group(Problem("p", "q", "7"), [sample("7"), sample("3")])
    stage([g], 0)
    assert [s.reward for s in g.samples] == [1.0, 0.0]
    assert stage.metrics() == {"reward/partial_errors": 1.0, "reward/short_errors": 2.0, "reward/text_errors": 2.0}


def test_two_terms_with_one_label_are_rejected():
    with pytest.raises(ValueError, match="share a metric name"):
        RewardStage(CrashyTask(), [bound("x", lambda g, s: []), bound("x", lambda g, s: [])], 1.0)


def test_call_with_timeout_restores_alarm():
    assert call_with_timeout(lambda: 3, 1.0) == 3


def test_a_verdict_that_is_not_a_bool_and_sys_exit_are_verifier_errors():
    class Odd(CrashyTask):
        def verify(self, problem, text):
            if text == "exit":
                sys.exit(3)
            return {"nan": float("nan"), "str": "False", "one": 1, "np": np.bool_(True)}[text]

    g = Group(Problem("p", "q", "7"), [sample("nan"), sample("str"), sample("one"), sample("np"), sample("exit")])
    reward_stage(Odd())([g], 0)
    assert [s.correct for s in g.samples] == [False, False, True, True, False]
    assert [s.verifier_error for s in g.samples] == [True, True, False, False, True]


def test_a_term_calling_sys_exit_is_counted():
    stage = RewardStage(CrashyTask(), [bound("quits", lambda g, s: sys.exit(1))], 1.0)
    g = Group(Problem("p", "q", "7"), [sample("7")])
    stage([g], 0)
    assert g.samples[0].reward == 0.0 and stage.metrics() == {"reward/quits_errors": 1.0}


def test_a_value_that_makes_the_reward_non_finite_is_a_counted_error_of_that_sample(capsys):
    """Before: inf became the reward (and weight 0 × inf a NaN one); ``statistics.pstdev`` then crashed after
    the update, at the same step on every ``--resume``. Now only the offending sample's term adds nothing."""
    # a: [inf, 1, -inf, 10**400 (beyond float), 1e308] (weight 2: 2e308 overflows); b: 0.5 each;
    # c (weight 0, logged only): inf on sample 0
    a = bound("a", lambda groups, step: [[math.inf, 1.0, -math.inf, 10**400, 1e308]], 2.0)
    b = bound("b", lambda groups, step: [[0.5] * 5])
    c = bound("c", lambda groups, step: [[math.inf, 0.0, 0.0, 0.0, 0.0]], 0.0)
    g = Group(Problem("p", "q", "7"), [sample("7") for _ in range(5)])
    stage = RewardStage(CrashyTask(), [a, b, c], 1.0)
    stage([g], 0)
    assert [s.reward for s in g.samples] == [0.5, 2.5, 0.5, 0.5, 0.5]  # 2 × 1 + 0.5 on the one finite sample
    assert [math.isnan(s.reward_terms["a"]) for s in g.samples] == [True, False, True, True, True]
    assert math.isnan(g.samples[0].reward_terms["c"]) and g.samples[1].reward_terms["c"] == 0.0
    assert stage.metrics() == {"reward/a_errors": 4.0, "reward/b_errors": 0.0, "reward/c_errors": 1.0}
    assert "reward 'a' failed" in capsys.readouterr().err


def test_a_sum_that_overflows_is_charged_to_the_term_that_overflows_it():
    a = bound("a", lambda groups, step: [[1e308, 1.0]])
    b = bound("b", lambda groups, step: [[1e308, 1.0]])
    g = Group(Problem("p", "q", "7"), [sample("7"), sample("7")])
    stage = RewardStage(CrashyTask(), [a, b], 1.0)
    stage([g], 0)
    assert [s.reward for s in g.samples] == [1e308, 2.0]
    assert stage.metrics() == {"reward/a_errors": 0.0, "reward/b_errors": 1.0}


def test_a_hanging_term_is_stopped_by_the_term_timeout_and_counted():
    def hangs(groups, step):
        time.sleep(30)

    stage = RewardStage(CrashyTask(), [bound("hangs", hangs), bound("ok", lambda gs, s: [[1.0]])], 1.0,
                        term_timeout_s=0.3)
    g = Group(Problem("p", "q", "7"), [sample("7")])
    t0 = time.time()
    stage([g], 0)
    assert time.time() - t0 < 2 and g.samples[0].reward == 1.0
    assert stage.metrics() == {"reward/hangs_errors": 1.0, "reward/ok_errors": 0.0}


def test_nested_timeouts_keep_the_outer_one():
    # an inner call that finishes re-arms the outer timer with its remaining time; an inner bound larger
    # than what the outer has left is cut to the outer's
    t0 = time.time()
    with pytest.raises(VerifierTimeout):
        call_with_timeout(lambda: (call_with_timeout(lambda: time.sleep(0.1), 5.0), time.sleep(5)), 0.5)
    assert 0.4 < time.time() - t0 < 1.5
    t0 = time.time()
    with pytest.raises(VerifierTimeout):
        call_with_timeout(lambda: call_with_timeout(lambda: time.sleep(5), 10.0), 0.4)
    assert time.time() - t0 < 1.5


def test_a_term_that_fails_on_every_sample_of_a_step_stops_the_run_in_one_line():
    """A conversational reward function on plain-text prompts: ``c[0]["content"]`` raises on every sample."""
    def chat_len(groups, step):
        return [[len(s.text[0]["content"]) for s in g.samples] for g in groups]

    def half(groups, step):  # fails on the calls that include "b" only: not a broken term
        return [[1.0 if s.text != "b" else {}["x"] for s in g.samples] for g in groups]

    groups = [Group(Problem("p", "q", "7"), [sample("a"), sample("b")]),
              Group(Problem("r", "q", "7"), [sample("c")])]
    terms = [BoundTerm("chat_len", 1.0, chat_len), BoundTerm("half", 1.0, half)]
    stage = RewardStage(CrashyTask(), terms, 1.0)
    stage(groups[:1], step=3)
    stage(groups[1:], step=3)  # a refill: every call of the step counts
    with pytest.raises(ConfigError) as e:
        stage.check_terms(3)
    assert str(e.value) == ("reward 'chat_len' failed on all 3 samples of step 4; first: TypeError: string "
                            "indices must be integers, not 'str' (problem 'p', completion 'a'); "
                            "reward.fail_fast=false keeps the run going, the term adding nothing")
    stage.fail_fast = False
    stage.check_terms(3)  # reward.fail_fast=false: the run goes on, the failures counted
    assert stage.metrics() == {"reward/chat_len_errors": 3.0, "reward/half_errors": 2.0}
    ok = RewardStage(CrashyTask(), [BoundTerm("half", 1.0, half)], 1.0)
    ok(groups[:1], step=0)
    ok(groups[1:], step=0)  # 2 failures in 3 samples: the term works on some
    ok.check_terms(0)
    ok.add_errors(1, {"half": 4.0}, samples=4)  # a rollout worker's counts: its 4 samples all failed
    with pytest.raises(ConfigError, match="'half' failed on all 4 samples of step 2; its first error is"):
        ok.check_terms(1)
