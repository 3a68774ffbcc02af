import math
import os
import re
import time
from pathlib import Path

import pytest
import torch
from support import reward_stage

from groupwise.config import load, to_dict
from groupwise.isolation import CAN_FORK
from groupwise.registry import ConfigError
from groupwise.types import Group, Problem, Sample

ROOT = Path(__file__).parents[3]
CALLS: list[dict] = []


def sample(text, ids=(4, 5)):
    return Sample(prompt_ids=torch.tensor([1]), completion_ids=torch.tensor(ids),
                  rollout_logprobs=torch.zeros(len(ids)), loss_mask=torch.ones(len(ids), dtype=torch.bool),
                  finish_reason="stop", text=text)


class Task:
    name = "t"

    def verify(self, problem, text):
        return text == problem.answer


def recorder(prompts, completions, completion_ids, answer, trainer_state, **kwargs):
    CALLS.append({"prompts": prompts, "completions": completions, "ids": completion_ids, "answer": answer,
                  "step": trainer_state.global_step, "kwargs": sorted(kwargs)})
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(len(t)) if t != "skip" else None for t in texts]


def flaky(prompts, completions, **kwargs):
    if "bad" in completions:  # fails for the whole batch, and for that one sample alone
        if len(completions) > 1:
            raise ValueError("batch contains a bad one")
        raise KeyError("bad sample\nmore detail")
    return [1.0] * len(completions)


def sleepy(prompts, completions, **kwargs):
    time.sleep(3)
    return [1.0] * len(completions)


def c_loop(prompts, completions, **kwargs):
    if "stuck" in completions:  # catastrophic backtracking inside the C regex engine: SIGALRM cannot stop it
        re.match(r"(a+)+$", "a" * 40 + "b")
    return [1.0] * len(completions)


def hard_exit(prompts, completions, **kwargs):
    if "die" in completions:
        os._exit(3)
    return [1.0] * len(completions)


def logging_fn(prompts, completions, log_metric, log_extra, **kwargs):
    log_metric("calls", 1.0)
    log_extra("note", ["x"] * len(completions))
    return [0.5] * len(completions)


def term(fn: str, **kw) -> list[str]:
    extra = "".join(f", {k}: {v}" for k, v in kw.items())
    return [f"reward.terms=[{{name: python, function: 'tests/unit/rewards/test_python.py:{fn}'{extra}}}]"]


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # file references are relative to the working directory
    CALLS.clear()


def test_trl_signature_columns_state_and_metric_name():
    # the callable itself (Python API), so that this module's CALLS is the one it appends to
    stage = reward_stage(Task(), base={"reward": {"terms": [{"name": "python", "function": recorder, "weight": 0.5}]}})
    chat = Problem("c", ({"role": "system", "content": "s"}, {"role": "user", "content": "q"}), "7",
                   meta={"columns": {"answer": "#### 7", "solution": "sol"}})
    g1 = Group(Problem("p", "1+1", "2", reference="ref", difficulty=1), [sample("ab"), sample("skip")])
    g2 = Group(chat, [sample("abc", ids=(9,))])
    stage([g1, g2], 3)
    (call,) = CALLS  # one batched call for the whole step
    assert call["prompts"] == ["1+1", "1+1", [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]]
    assert call["completions"] == ["ab", "skip", [{"role": "assistant", "content": "abc"}]]
    assert call["ids"] == [[4, 5], [4, 5], [9]] and call["step"] == 3
    assert call["answer"] == ["2", "2", "#### 7"]  # a dataset column wins over the problem's canonical answer
    assert call["kwargs"] == ["difficulty", "log_extra", "log_metric", "problem_id", "reference", "solution"]
    assert [s.reward for s in g1.samples + g2.samples] == [1.0, 0.0, 1.5]  # 0.5 × len; None adds nothing
    assert g1.samples[0].reward_terms == {"recorder": 2.0} and math.isnan(g1.samples[1].reward_terms["recorder"])
    assert stage.metrics() == {"reward/recorder_errors": 0.0}


def test_a_failing_sample_is_isolated_counted_and_logged_once(capsys):
    stage = reward_stage(Task(), term("flaky"))
    g = Group(Problem("p", "q", "x"), [sample("good"), sample("bad"), sample("fine")])
    stage([g], 0)
    assert [s.reward for s in g.samples] == [1.0, 0.0, 1.0]
    assert stage.metrics() == {"reward/flaky_errors": 1.0}
    stage([Group(Problem("p2", "q", "x"), [sample("bad"), sample("ok")])], 0)
    assert stage.metrics() == {"reward/flaky_errors": 2.0}
    err = capsys.readouterr().err
    assert err.count("reward 'flaky' failed") == 1
    assert "problem 'p', completion 'bad'" in err and "KeyError: bad sample (" in err and "more detail" not in err


def test_a_timeout_counts_every_sample_of_the_call_and_does_not_retry():
    stage = reward_stage(Task(), term("sleepy", timeout_s=0.3))
    g = Group(Problem("p", "q", "x"), [sample("a"), sample("b")])
    t0 = time.time()
    stage([g], 0)
    assert time.time() - t0 < 1.5 and [s.reward for s in g.samples] == [0.0, 0.0]
    assert stage.metrics() == {"reward/sleepy_errors": 2.0}


@pytest.mark.skipif(not CAN_FORK, reason="process isolation needs fork (Linux)")
def test_a_referenced_function_runs_forked_c_loops_and_exits_are_counted():
    """Issue 31: a reward function stuck in C code hung the run under SIGALRM, and ``os._exit`` ended it. By
    default (``isolation: auto``) a function named by reference runs in a forked worker: both are counted."""
    stage = reward_stage(Task(), term("c_loop", timeout_s=2))
    g = Group(Problem("p", "q", "x"), [sample("a"), sample("stuck")])
    t0 = time.time()
    stage([g], 0)
    assert time.time() - t0 < 8 and [s.reward for s in g.samples] == [0.0, 0.0]
    assert stage.metrics() == {"reward/c_loop_errors": 2.0}  # a timeout counts the call's samples
    stage = reward_stage(Task(), term("hard_exit"))
    g = Group(Problem("p", "q", "x"), [sample("a"), sample("die")])
    stage([g], 0)  # the batch call dies; each sample is retried alone: one more death, one value
    assert [s.reward for s in g.samples] == [1.0, 0.0] and stage.metrics() == {"reward/hard_exit_errors": 1.0}


def test_log_metric_and_label():
    cfg = load(None, term("logging_fn", label="judge"))
    stage = reward_stage(Task(), term("logging_fn", label="judge"))
    g = Group(Problem("p", "q", "x"), [sample("a")])
    stage([g], 0)
    stage([g], 0)
    assert g.samples[0].reward_terms == {"judge": 0.5}
    assert stage.terms[0].term.metrics() == {"reward/judge/calls": 1.0}
    assert stage.terms[0].entry.reports and cfg.reward.terms[0].cfg.name() == "judge"


def test_config_errors_and_references():
    with pytest.raises(ConfigError, match="function: required"):
        load(None, ["reward.terms=[{name: python}]"])
    with pytest.raises(ConfigError, match="no such file"):
        load(None, ["reward.terms=[{name: python, function: nowhere.py:f}]"])
    with pytest.raises(ConfigError, match="has no attribute 'missing'"):
        load(None, term("missing"))
    with pytest.raises(ConfigError, match="expected 'path/to/file.py:function'"):
        load(None, ["reward.terms=[{name: python, function: just_a_name}]"])
    cfg = load(None, term("recorder"))
    assert cfg.reward.terms[0].cfg.function == f"{ROOT}/tests/unit/rewards/test_python.py:recorder"  # absolute
    mod = load(None, ["reward.terms=[{name: python, function: 'trl.rewards:accuracy_reward'}]"])
    assert mod.reward.terms[0].cfg.name() == "accuracy_reward"


def test_a_callable_in_a_config_dict_and_its_resolved_form():
    cfg = load(None, base={"reward": {"terms": [{"name": "python", "function": recorder}]}})
    assert cfg.reward.terms[0].cfg.function is recorder and cfg.reward.terms[0].cfg.name() == "recorder"
    dumped = to_dict(cfg)["reward"]["terms"][0]
    assert dumped["function"] == f"{__name__}:recorder"


def chat_len(completions, **kwargs):
    """Written for chat prompts: on plain-text prompts it is a string: ``c[0]["content"]`` raises."""
    return [len(c[0]["content"]) / 100 for c in completions]


@pytest.mark.parametrize("fail_fast", [True, False])
def test_a_reward_function_failing_on_every_sample_stops_train(tmp_path, monkeypatch, capsys, fail_fast):
    from groupwise import cli

    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    code = cli.main(["train", str(ROOT / "recipes/fake_generator_lab.yaml"), "trainer.steps=2",
                     f"out_dir={tmp_path}",
                     f"reward.terms=[correctness, {{name: python, function: {__file__}:chat_len}}]",
                     f"reward.fail_fast={str(fail_fast).lower()}", "eval.before=false", "eval.after=false"])
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    metrics = tmp_path / "fake_generator_lab" / "metrics.jsonl"
    if fail_fast:
        assert code == 2 and len(err) == 1
        assert not metrics.exists() or "perf/step_s" not in metrics.read_text()  # stopped before the update
        assert err[0].startswith("error: reward 'chat_len' failed on all 16 samples of step 1; first: "
                                 "TypeError: string indices must be integers")
    else:
        assert code == 0 and err == [] and metrics.read_text().count("perf/step_s") == 2
