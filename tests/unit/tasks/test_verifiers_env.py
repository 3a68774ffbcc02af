"""The ``verifiers`` task: a verifiers environment's dataset, rewards (as the ``environment`` reward term) and tools,
in verifiers' v1 form and its legacy ``load_environment`` form; bad environments are one line or a counted failure."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("verifiers")

from support import env as build_env  # noqa: E402

from groupwise.config import Spec, load  # noqa: E402
from groupwise.isolation import CAN_FORK, resolve  # noqa: E402
from groupwise.loop.chat_tools import tool_schema  # noqa: E402
from groupwise.registry import ConfigError  # noqa: E402
from groupwise.rewards.stage import RewardStage, SampleErrors  # noqa: E402
from groupwise.standard.verifiers_env import VerifiersConfig  # noqa: E402
from groupwise.types import Group, Sample  # noqa: E402

HERE = Path(__file__).parent
ENVS = str(HERE / "vf_envs.py")


def task(name="QATaskset", **kw):
    return Spec("task", "verifiers", VerifiersConfig(env=f"{ENVS}:{name}", **kw)).build(build_env())


def sample(text, messages=None):
    s = Sample(torch.tensor([1]), torch.tensor([2]), torch.tensor([0.0]), torch.tensor([True]), "stop", text=text)
    if messages is not None:
        s.meta["messages"] = messages
    return s


def term(t, **cfg):
    from groupwise.standard.environment import EnvironmentRewardConfig

    return Spec("reward", "environment", EnvironmentRewardConfig(**cfg)).build(build_env(task=t))


def test_a_v1_taskset_its_tasks_rewards_and_tools():
    t = task(env_args={"n": 20, "system": "Be brief."}, test_fraction=0.25)
    assert len(t.train) == 15 and len(t.test) == 5 and {p.id for p in t.train}.isdisjoint(p.id for p in t.test)
    p = next(p for p in [*t.train, *t.test] if "capital #1?" in str(p.prompt))
    assert p.prompt == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "capital #1?"})
    assert p.answer == "Paris"
    # the env's own Task.score: weighted rewards, a metric with weight 0
    assert t.episode_rewards(p, sample("Paris")) == {"exact": (1.0, 2.0), "used_tool": (0.0, 0.5),
                                                     "length": (5.0, 0.0)}
    assert t.verify(p, "Paris") is True and t.verify(p, "Lima") is False  # the total 2.0 reaches correct_at 1.0
    assert task(env_args={"n": 20}, correct_at=2.5).verify(p, "Paris") is False
    # an episode's messages (the tool loop's meta): the tool result is on the trace the rewards read
    episode = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "lookup_capital", "arguments": {"country": "France"}}}]},
               {"role": "tool", "name": "lookup_capital", "content": "Paris"},
               {"role": "assistant", "content": "Paris"}]
    assert t.episode_rewards(p, sample("ignored", episode))["used_tool"] == (1.0, 0.5)
    # its toolset's @vf.tool methods, named as its MCP clients name them, with their docstring schemas
    assert list(t.tools) == ["lookup_capital"] and t.tools["lookup_capital"](country="Peru") == "Lima"
    assert tool_schema("lookup_capital", t.tools["lookup_capital"])["function"]["parameters"]["properties"] == {
        "country": {"type": "string", "description": "its name"}}
    # the environment's code is user code: isolated like a plug-in's verifier (reward.verifier_isolation: auto)
    assert resolve("auto", t.verify) == ("process" if CAN_FORK else "alarm")


def test_the_environment_term_total_one_reward_and_metrics():
    t = task(env_args={"n": 8})
    p = next(p for p in t.train if p.answer == "Paris")
    g = Group(p, [sample("Paris"), sample("nope")])
    total, one = term(t), term(t, reward="exact")
    assert total([g], 0) == [[2.0, 0.0]] and one([g], 0) == [[1.0, 0.0]]
    assert total.metrics() == {"reward/env/exact": 0.5, "reward/env/used_tool": 0.0, "reward/env/length": 4.5}
    with pytest.raises(SampleErrors) as err:
        term(t, reward="nonexistent")([g], 0)
    assert "no reward 'nonexistent'; the environment's: exact, used_tool, length" in str(err.value.errors[(0, 0)])
    from groupwise.standard.environment import EnvironmentRewardConfig

    assert EnvironmentRewardConfig(reward="exact").label() == "env_exact"
    with pytest.raises(ConfigError, match=r"reward environment: task 'lab' has no environment of its own"):
        Spec("reward", "environment", EnvironmentRewardConfig()).build(build_env(
            task=load(None, []).task.build(build_env())))


def test_a_reward_that_raises_or_hangs_fails_its_samples_counted():
    t = task(env_args={"n": 8})
    p = next(p for p in t.train if p.answer == "Paris")
    g = Group(p, [sample("Paris"), sample("boom")])
    stage = RewardStage(t, [], 1.0)
    from groupwise.rewards.stage import BoundTerm

    stage.terms = [BoundTerm("env", 1.0, term(t, timeout_s=20))]
    stage([g], 0)
    assert [s.reward for s in g.samples] == [2.0, 0.0] and stage.metrics()["reward/env_errors"] == 1.0
    assert g.samples[1].reward_terms["env"] != g.samples[1].reward_terms["env"]  # NaN: not scored
    if CAN_FORK:  # a hung reward function: its forked worker is killed at timeout_s, the step's samples counted
        import time

        hung = term(t, timeout_s=1.0)
        t0 = time.monotonic()
        with pytest.raises(Exception, match="exceeded 1.0s"):
            hung([Group(p, [sample("hang")])], 0)
        assert time.monotonic() - t0 < 30


def test_a_legacy_environment_its_datasets_rubric_and_tools():
    import verifiers

    if not hasattr(verifiers, "SingleTurnEnv"):
        pytest.skip(f"verifiers {verifiers.__version__} has no legacy (v0) form")
    t = task("legacy_single", env_args={"n": 10})
    assert len(t.train) == 10 and len(t.test) == 3  # its eval_dataset is the held-out set
    p = t.train[2]
    assert p.prompt == ({"role": "system", "content": "Answer with the number."}, {"role": "user", "content": "2+2"})
    assert t.episode_rewards(p, sample("4")) == {"correct": (1.0, 1.0), "polite": (1.0, 0.25)}
    assert t.verify(p, "4") is True and t.verify(p, "5") is False
    with pytest.raises(ValueError, match="no manners"):  # surfaced, not 0.0 as verifiers' own rubric makes it
        t.episode_rewards(p, sample("rude"))
    tools = task("legacy_tools")
    assert list(tools.tools) == ["double"] and tools.tools["double"](x=4) == 8
    assert tools.tool_schemas["double"]["function"]["parameters"]["properties"]["x"]["type"] == "integer"
    called = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "double", "arguments": {"x": 4}}}]},
        {"role": "tool", "name": "double", "content": "8"}, {"role": "assistant", "content": "8"}]
    assert tools.episode_rewards(tools.train[0], sample("8", called)) == {"called": (1.0, 1.0)}


def test_bad_environments_are_one_line():
    with pytest.raises(ConfigError, match=r"task.env='.*vf_envs.py:Nope': .*has no attribute 'Nope'"):
        task("Nope")
    with pytest.raises(ConfigError, match=r"task.env_args: not a valid QAConfig for .*\(1 validation error"):
        task(env_args={"n": "many"})
    with pytest.raises(ConfigError, match=r"task.max_rows=0: .*EndlessTaskset is an infinite taskset"):
        task("EndlessTaskset")
    assert len(task("EndlessTaskset", max_rows=10).train) == 9
    import verifiers

    if hasattr(verifiers, "SingleTurnEnv"):  # the legacy form, where the installed verifiers has it
        with pytest.raises(ConfigError, match=r"reward function 'ranked' scores a group of rollouts together"):
            task("legacy_group")
    with pytest.raises(ConfigError, match=r"task.env='no_such_env_anywhere': .*"):
        task_ref = VerifiersConfig(env="no_such_env_anywhere")
        Spec("task", "verifiers", task_ref).build(build_env())
    with pytest.raises(ConfigError, match="task: env: required"):
        load(None, ["task.name=verifiers"])


def test_without_the_package_one_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ConfigError, match=r"^task.name=verifiers needs the verifiers package, which is not installed: "
                                          r"pip install 'groupwise\[verifiers\]'$"):
        task()


def test_sft_examples_from_a_reference_field():
    import random

    t = Spec("task", "verifiers", VerifiersConfig(
        env=str(HERE.parents[2] / "examples" / "verifiers_arith.py") + ":ArithTaskset", env_args={"size": 30},
        reference_field="solution")).build(build_env())
    (p, text), = t.sft_examples(random.Random(0), 1)
    assert text == p.reference and text.endswith(f"<answer>{p.answer}</answer>")
    assert t.verify(p, text) is True and t.verify(p, "<answer>x</answer>") is False
    with pytest.raises(NotImplementedError, match="reference_field is empty"):
        task().sft_examples(random.Random(0), 1)
