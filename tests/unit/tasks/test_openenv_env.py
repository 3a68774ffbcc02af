"""The ``openenv`` task: an OpenEnv server in simulation mode (started by the test on loopback) drives the multi-turn
loop through reset / step, its rewards are the ``environment`` term's; a server that fails, hangs, refuses an
action or returns a malformed observation or reward is one line, or a counted failure of that episode."""

import dataclasses
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("openenv")

from support import env as build_env  # noqa: E402

from groupwise.config import Spec, ToolsConfig, load  # noqa: E402
from groupwise.loop.tools import wrap  # noqa: E402
from groupwise.models.tiny import build_tokenizer  # noqa: E402
from groupwise.registry import ConfigError  # noqa: E402
from groupwise.rollout.base import Request, SamplingParams, to_sample  # noqa: E402
from groupwise.standard.openenv_env import OpenEnvConfig  # noqa: E402
from groupwise.types import Completion, Group, Problem  # noqa: E402

HERE = Path(__file__).parent
TOK = build_tokenizer()
CHAT = ["rollout.tools={protocol: chat, max_turns: 3, timeout_s: 3}"]


class Scripted:
    def __init__(self, script):
        self.script, self.turn = script, 0

    def sync_weights(self, model):
        pass

    def generate(self, requests, params, rng):
        text = self.script[self.turn]
        self.turn += 1
        ids = TOK.encode(text + "<eos>", add_special_tokens=False)
        return [Completion(torch.tensor(ids), torch.zeros(len(ids)), "stop") for _ in requests]


def make(overrides=CHAT, **cfg):
    return Spec("task", "openenv", OpenEnvConfig(**cfg)).build(build_env(overrides=overrides))


@pytest.fixture(scope="module")
def game():
    """The test's own OpenEnv server, started on loopback from its app (task.app) once for the module."""
    return make(app=f"{HERE / 'openenv_envs.py'}:app", observation_field="text", train_seeds=50, test_seeds=5,
                timeout_s=3)


def episode(task, script, problem):
    loop = wrap(Scripted(script), ToolsConfig(protocol="chat", max_turns=3, timeout_s=3), task, TOK)
    (c,) = loop.generate([Request(torch.tensor([1]), problem=problem)], SamplingParams(max_tokens=200),
                         torch.Generator())
    return c, to_sample(torch.tensor([1]), c, TOK)


def test_problems_are_reset_seeds_and_prompts_their_observations(game):
    assert len(game.train) == 50 and game.train[3].prompt == "say 3" and game.train[3].meta == {"seed": 3}
    assert game.test[0].id == "openenv/test/50" and game.test[-1].prompt == "say 54"
    by_url = make(url=game.url, observation_field="text")  # the same server, at its URL
    assert by_url.train[7].prompt == "say 7"


def test_steps_rewards_and_verify(game):
    p = game.train[3]
    c, s = episode(game, ["3", "no", "unused"], p)
    assert TOK.decode(c.completion_ids.tolist()) == "3<eos>\nagain 1\nno<eos>"  # observations as user turns
    assert c.meta["env_rewards"] == [1.0, 0.0] and c.meta["env_done"] is True and c.meta["turns"] == 2
    assert c.forced.tolist() == [False] * 2 + [True] * len("\nagain 1\n") + [False] * 3
    assert game.episode_rewards(p, s) == {"reward": (1.0, 1.0), "steps": (2.0, 0.0), "done": (1.0, 0.0)}
    assert game.verify(p, s.text) is True
    last = dataclasses.replace(game.cfg, reward="last")
    game.cfg, saved = last, game.cfg
    try:
        assert game.episode_rewards(p, s)["reward"] == (0.0, 1.0)
    finally:
        game.cfg = saved
    with pytest.raises(LookupError, match="no episode of this run ended with this completion"):
        game.verify(p, "something else")


@pytest.mark.parametrize("seed,error", [
    (900, "RuntimeError: Server error"), (902, "ValueError: step returned reward 'high', not a finite number"),
    (903, "ValueError: reset(seed=903) observed 'fresh "), (901, "timeout")])
def test_a_bad_environment_fails_its_episode_counted(game, seed, error):
    p = Problem(f"openenv/train/{seed}", f"say {seed}", "", meta={"seed": seed})
    t0 = time.monotonic()
    c, s = episode(game, ["x", "y", "z"], p)
    assert time.monotonic() - t0 < 30
    assert c.meta["env_error"].startswith(error)
    assert c.meta["tool_errors" if seed != 901 else "tool_timeouts"] == 1
    from groupwise.rewards.stage import SampleErrors
    from groupwise.standard.environment import EnvironmentRewardConfig

    term = Spec("reward", "environment", EnvironmentRewardConfig()).build(build_env(task=game))
    with pytest.raises(SampleErrors) as err:
        term([Group(p, [s])], 0)
    assert "the episode's environment failed" in str(err.value.errors[(0, 0)])


def test_bad_servers_and_settings_are_one_line(game):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed: nothing listens
    with pytest.raises(ConfigError, match=rf"^task.url='http://127.0.0.1:{port}': the OpenEnv environment failed its "
                                          r"first reset: "):
        make(url=f"http://127.0.0.1:{port}", timeout_s=3)
    with pytest.raises(ConfigError, match=r"task.app='.*openenv_broken.py:app': the OpenEnv server exited \(1\) before "
                                          r"it answered: .*ImportError: the simulator's native library is missing"):
        make(app=f"{HERE / 'openenv_broken.py'}:app")
    with pytest.raises(ConfigError, match=r"first reset: KeyError: observation has no field 'prompt' "
                                          r"\(task.observation_field\); its fields: text$"):
        make(url=game.url, observation_field="prompt")
    with pytest.raises(ConfigError, match=r"task.name=openenv: its episodes run in the multi-turn loop; allowed: "
                                          r"rollout.tools: \{protocol: chat\}"):
        make(overrides=[], url=game.url)
    with pytest.raises(ConfigError, match="task: url / app: give exactly one"):
        load(None, ["task.name=openenv"])
    with pytest.raises(ConfigError, match=r"rollout.tools.protocol=text: task 'openenv' runs an environment's"):
        wrap(Scripted([]), ToolsConfig(), game, TOK)


def test_without_the_package_one_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv.core", None)
    with pytest.raises(ConfigError, match=r"^task.name=openenv needs the openenv package, which is not installed: "
                                          r"pip install 'groupwise\[openenv\]'$"):
        make(url="http://127.0.0.1:9")
