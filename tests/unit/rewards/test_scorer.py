import time

import torch

from groupwise.config import load
from groupwise.rewards.scorer import Scorer, call_with_timeout
from groupwise.types import Group, Problem, Sample


def sample(text):
    z = torch.zeros(1, dtype=torch.long)
    return Sample(prompt_ids=z, completion_ids=z, rollout_logprobs=torch.zeros(1), loss_mask=torch.ones(1, dtype=torch.bool),
                  finish_reason="stop", text=text)


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


def test_crashes_and_timeouts_are_counted_not_fatal():
    cfg = load(None, ["reward.terms=[{name: correctness}, {name: format, weight: 0.5}]"])
    scorer = Scorer(CrashyTask(), cfg.reward.terms, timeout_s=0.2)
    g = Group(Problem("p", "q", "7"), [sample("7"), sample("boom"), sample("slow"), sample("3")])
    t0 = time.time()
    scorer([g], step=0)
    assert time.time() - t0 < 2
    assert [s.correct for s in g.samples] == [True, False, False, False]
    assert [s.verifier_error for s in g.samples] == [False, True, True, False]
    assert [s.reward for s in g.samples] == [1.5, 0.0, 0.0, 0.5]
    assert g.samples[0].reward_terms == {"correctness": 1.0, "format": 1.0}


def test_zero_weight_term_is_logged_only():
    cfg = load(None, ["reward.terms=[{name: correctness}, {name: format, weight: 0}]"])
    g = Group(Problem("p", "q", "7"), [sample("3")])
    Scorer(CrashyTask(), cfg.reward.terms, 1.0)([g], 0)
    assert g.samples[0].reward == 0.0 and g.samples[0].reward_terms["format"] == 1.0


def test_call_with_timeout_restores_alarm():
    assert call_with_timeout(lambda: 3, 1.0) == 3
