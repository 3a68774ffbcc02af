import os
import re
import time

import pytest
import torch

from groupwise.rewards.stage import RewardStage
from groupwise.rewards.verifier import ProcessVerifier, VerifierFailed, VerifierTimeout, make_verifier
from groupwise.types import Group, Problem, Sample


class Task:
    name = "t"

    def verify(self, problem, text):
        if text == "c-loop":  # catastrophic backtracking: stuck inside the C regex engine, SIGALRM cannot stop it
            return re.match(r"(a+)+$", "a" * 40 + "b") is not None
        if text == "exit":
            os._exit(3)
        if text == "boom":
            raise ValueError("bad input\nsecond line")
        return text == problem.answer


def sample(text):
    z = torch.zeros(1, dtype=torch.long)
    return Sample(prompt_ids=z, completion_ids=z, rollout_logprobs=torch.zeros(1), loss_mask=torch.ones(1, dtype=torch.bool),
                  finish_reason="stop", text=text)


def test_a_verifier_stuck_in_c_code_is_killed_and_the_next_call_works():
    v = ProcessVerifier(Task(), timeout_s=0.5)
    p = Problem("p", "q", "7")
    assert v(p, "7") is True and v(p, "3") is False
    t0 = time.time()
    with pytest.raises(VerifierTimeout, match="process was killed"):
        v(p, "c-loop")
    assert time.time() - t0 < 3 and v.restarts == 1
    assert v(p, "7") is True  # a fresh worker
    v.close()


def test_exit_and_exceptions_in_the_worker_are_failures_not_crashes():
    v = ProcessVerifier(Task(), timeout_s=5.0)
    p = Problem("p", "q", "7")
    with pytest.raises(VerifierFailed, match="process died"):
        v(p, "exit")
    with pytest.raises(VerifierFailed, match=r"^ValueError: bad input$"):
        v(p, "boom")
    assert v(p, "7") is True
    v.close()


def test_process_isolation_in_the_reward_stage_counts_and_agrees_with_alarm():
    groups = lambda: [Group(Problem("p", "q", "7"), [sample(t) for t in ("7", "3", "c-loop", "exit", "boom", "7")])]  # noqa: E731
    proc = RewardStage(Task(), [], 0.5, isolation="process")
    g = groups()
    t0 = time.time()
    proc(g, 0)
    assert time.time() - t0 < 5
    assert [s.correct for s in g[0].samples] == [True, False, False, False, False, True]
    assert [s.verifier_error for s in g[0].samples] == [False, False, True, True, True, False]
    plain = make_verifier(Task(), 0.5, "alarm")
    assert plain(Problem("p", "q", "7"), "7") is True and plain(Problem("p", "q", "7"), "3") is False
    proc.verifier.close()
