import os
import re
import time

import pytest
import torch

from groupwise.rewards.stage import RewardStage
from groupwise.rewards.verifier import VerifierFailed, VerifierTimeout, make_verifier
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
        if text == "sys.exit":
            raise SystemExit(3)
        return text == problem.answer


def sample(text):
    z = torch.zeros(1, dtype=torch.long)
    return Sample(prompt_ids=z, completion_ids=z, rollout_logprobs=torch.zeros(1),
                  loss_mask=torch.ones(1, dtype=torch.bool), finish_reason="stop", text=text)


def test_a_verifier_stuck_in_c_code_is_killed_and_the_next_call_works():
    v = make_verifier(Task(), 2.0, "process")  # 2 s: a fork on a loaded 2-core machine can take a while
    p = Problem("p", "q", "7")
    assert v(p, "7") is True and v(p, "3") is False
    t0 = time.time()
    with pytest.raises(VerifierTimeout, match="process was killed"):
        v(p, "c-loop")
    assert time.time() - t0 < 6 and v.restarts == 1
    assert v(p, "7") is True  # a fresh worker
    v.close()


def test_exit_and_exceptions_in_the_worker_are_failures_not_crashes():
    v = make_verifier(Task(), 5.0, "process")
    p = Problem("p", "q", "7")
    with pytest.raises(VerifierFailed, match="process died"):
        v(p, "exit")
    with pytest.raises(ValueError, match=r"^bad input\nsecond line$"):  # the exception itself, as in-process
        v(p, "boom")
    with pytest.raises(VerifierFailed, match=r"^SystemExit: 3$"):  # never a SystemExit in the trainer
        v(p, "sys.exit")
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


def test_transforms_check_answers_through_the_bounded_verifier():
    """``rollout.base.verified`` (DRE, DASH drift, RREDCoT) goes through the context's ``check``: a verifier stuck in
    C code is killed at the stage's timeout and reads "not verified"; the task's own verify is only the fallback."""
    from groupwise.rollout.base import RolloutContext, verified

    stage = RewardStage(Task(), [], 0.5, isolation="process")
    ctx = RolloutContext(generator=None, tokenizer=None, task=Task(), score=None, params=None, group_size=1, step=0,
                         rng=None, encode=None, policy_logprobs=None, check=stage.check)
    p = Problem("p", "q", "7")
    t0 = time.time()
    assert verified(ctx, p, "7") and not verified(ctx, p, "c-loop") and not verified(ctx, p, "exit")
    assert time.time() - t0 < 5 and verified(ctx, p, "7")
    stage.verifier.close()
    bare = RolloutContext(generator=None, tokenizer=None, task=Task(), score=None, params=None, group_size=1, step=0,
                          rng=None, encode=None, policy_logprobs=None)
    assert verified(bare, p, "7") and not verified(bare, p, "boom")


TRAINER = """
import signal, sys, time
from groupwise.rewards.verifier import make_verifier
from groupwise.types import Problem

class Task:
    def verify(self, problem, text):
        return text == problem.answer

signal.signal(signal.SIGTERM, lambda *a: None)  # as the training session does while it runs
vs = [make_verifier(Task(), 5.0, "process") for _ in range(2)]  # the second worker inherits the first one's pipe
assert all(v(Problem("p", "q", "7"), "7") for v in vs)
print(" ".join(str(v._proc.pid) for v in vs), flush=True)
if sys.argv[1] == "hang":
    time.sleep(60)
"""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_end_with_the_trainer_even_under_its_sigterm_handler():
    """The trainer's exit must not wait on its workers (a worker that kept the session's SIGTERM handler
    ignored the exit-time terminate() and hung CI), and a trainer killed outright leaves no worker behind."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", TRAINER, "exit"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, "hang"], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    proc.kill()
    proc.wait()
    deadline = time.time() + 10
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


class PluginTask(Task):
    pass


def test_auto_isolates_a_plug_in_tasks_verifier_and_not_groupwises_own():
    """Issue 31: a C-level loop in a user's verifier hung the run under the old default (alarm). ``auto`` (the
    default) forks for a verifier defined outside groupwise (Linux), and keeps groupwise's own in-process."""
    from groupwise.isolation import CAN_FORK, Forked
    from groupwise.standard.lab import Lab

    v = make_verifier(PluginTask(), 2.0, "auto")
    assert isinstance(v, Forked) == CAN_FORK
    if CAN_FORK:
        t0 = time.monotonic()
        with pytest.raises(VerifierTimeout):
            v(Problem("p", "q", "7"), "c-loop")
        assert time.monotonic() - t0 < 6
        v.close()
    assert not isinstance(make_verifier(Lab.__new__(Lab), 0.5, "auto"), Forked)
