"""FGRPO's Flower backend (a ServerApp and a ClientApp on a local simulated federation) gives the in-process
backend's result for the same seed: the same per-round metrics and the same global weights. Needs flwr
(``pip install 'groupwise[federated]'``); skipped without it."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("flwr")

from groupwise import api  # noqa: E402
from groupwise.config import load  # noqa: E402

RECIPE = str(Path(__file__).parents[2] / "recipes" / "fgrpo_lab.yaml")
ARGS = ["trainer.threads=1", "trainer.progress=false", "trainer.sinks=[jsonl]", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_completion_tokens=24", "model.warm_start_steps=20", "task.test_size=24",
        "eval.n_problems=8", "eval.k=1", "driver.score_problems=8", "driver.local_steps=1", "trainer.steps=2",
        "trainer.save_every=1", "eval.before=false", "reward.terms=[{name: length_penalty, max_length: 24}]",
        "driver.clients=[{task: {ops: '+'}}, {task: {ops: '*'}, reward_scale: 5}]", "driver.score=train"]


def rows(run: Path) -> list[dict]:
    out = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "time"} for r in out]


def test_flower_backend_equals_in_process(tmp_path):
    api.run(load(RECIPE, [*ARGS, f"out_dir={tmp_path}", "name=inproc"]))
    result = api.run(load(RECIPE, [*ARGS, f"out_dir={tmp_path}", "name=flower", "driver.backend=flower"]))
    a, b = rows(tmp_path / "inproc"), rows(tmp_path / "flower")
    assert [r["step"] for r in b] == [1, 2, 2]  # two rounds, then the eval after
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], rel=1e-6, abs=1e-9), k
    wa = load_file(str(tmp_path / "inproc" / "checkpoints" / "step_0000002" / "model" / "model.safetensors"))
    wb = load_file(str(tmp_path / "flower" / "checkpoints" / "step_0000002" / "model" / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-6)
    assert "after" in result and any(r.get("update/grad_norm", 0) > 0 for r in a), "nothing trained: vacuous"


def test_plugins_load_in_the_flower_clients(tmp_path):
    """Issue 31: a ``plugins:`` component under ``driver.backend: flower`` was unknown in the clients (each a
    simulation actor in a fresh process, where the run's plug-in files had never been imported)."""
    plugin = tmp_path / "half.py"
    plugin.write_text("from groupwise.registry import NoConfig\nfrom groupwise.rewards import REWARDS\n"
                      "from groupwise.rewards.basic import per_sample\n\n\n"
                      "@REWARDS.register('always_half_flower', config=NoConfig)\n"
                      "def always_half(cfg, env):\n    return per_sample(lambda s, p: 0.5)\n")
    args = [a for a in ARGS if not a.startswith(("reward.terms", "trainer.steps", "trainer.save_every"))]
    api.run(load(RECIPE, [*args, f"out_dir={tmp_path}", "name=fl", "driver.backend=flower", "trainer.steps=1",
                              f"plugins=[{plugin}]", "eval.after=false",
                              "reward.terms=[{name: always_half_flower}, {name: length_penalty, max_length: 24}]"]))
    steps = [r for r in rows(tmp_path / "fl") if r["step"] == 1]
    assert any(k.endswith("always_half_flower") and v == 0.5 for r in steps for k, v in r.items()), steps


CONFIGURED = """import dataclasses
from groupwise.rewards import REWARDS
from groupwise.rewards.basic import per_sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConstantConfig:
    value: float = 0.5


@REWARDS.register("constant_flower", config=ConstantConfig)
def constant(cfg, env):
    return per_sample(lambda s, p: cfg.value)
"""


def test_a_plugin_config_class_reaches_the_flower_clients(tmp_path):
    """Issue 48: a plug-in whose config class is defined in its own file failed under Flower ("No module named
    groupwise_plugin_..."): the clients' config went to the simulation's actor pickled with that class by
    reference, and the actor unpickled it before any plug-in file was imported there."""
    plugin = tmp_path / "constant.py"
    plugin.write_text(CONFIGURED)
    args = [a for a in ARGS if not a.startswith(("reward.terms", "trainer.steps", "trainer.save_every"))]
    terms = "reward.terms=[{name: constant_flower, value: 0.25}, {name: length_penalty, max_length: 24}]"
    api.run(load(RECIPE, [*args, f"out_dir={tmp_path}", "name=fl", "driver.backend=flower", "trainer.steps=1",
                          f"plugins=[{plugin}]", "eval.after=false", terms]))
    steps = [r for r in rows(tmp_path / "fl") if r["step"] == 1]
    assert steps and steps[0]["federated/clients_ok"] == 2.0, steps
    assert any(k.endswith("constant_flower") and v == 0.25 for r in steps for k, v in r.items()), steps


FAULTY = '''import os, time
from groupwise.registry import NoConfig
from groupwise.rewards import REWARDS
from groupwise.rewards.basic import per_sample


def reward(sample, problem):
    if "*" in problem.prompt:  # client 1 only; each marker file acts once
        for mark, act in (("die", lambda: os._exit(1)), ("hang", lambda: time.sleep(10**6))):
            path = os.path.join(os.environ["GW_FAULT_DIR"], mark)
            if os.path.exists(path):
                os.remove(path)
                act()
    return 0.5


@REWARDS.register("faulty_flower", config=NoConfig)
def faulty(cfg, env):
    return per_sample(reward)
'''


def test_flower_client_that_dies_or_hangs_is_dropped_and_counted(tmp_path, monkeypatch):
    """Issue 31: a Flower client process that died made the next call fail with "Message content is None"; a hung
    one blocked the run forever. Now each is a failed client for that round (counted), the actor restarts and
    later rounds have every client back; a checkpoint is still written."""
    (tmp_path / "faulty.py").write_text(FAULTY)
    (tmp_path / "die").touch()  # round 1: client 1's process exits; round 2 (restarted): it hangs
    (tmp_path / "hang").touch()
    monkeypatch.setenv("GW_FAULT_DIR", str(tmp_path))
    args = [a for a in ARGS if not a.startswith(("reward.terms", "trainer.steps", "driver.clients"))]
    api.run(load(RECIPE, [*args, f"out_dir={tmp_path}", "name=fl", "driver.backend=flower", "trainer.steps=3",
                              f"plugins=[{tmp_path / 'faulty.py'}]", "eval.after=false", "driver.round_timeout_s=30",
                              "driver.clients=[{task: {ops: '+'}}, {task: {ops: '*'}}]",
                              "reward.terms=[{name: faulty_flower}, {name: length_penalty, max_length: 24}]"]))
    rows_ = rows(tmp_path / "fl")
    assert [r["federated/clients_ok"] for r in rows_] == [1.0, 1.0, 2.0]  # died, hung, both back
    assert [r["federated/client_failures"] for r in rows_] == [1.0, 2.0, 2.0]
    assert (tmp_path / "fl" / "checkpoints" / "step_0000003").is_dir()


def test_ctrl_c_on_a_flower_run_saves_and_exits(tmp_path):
    """Issue 31: Ctrl-C during a Flower FGRPO run did not exit within 120 s and saved nothing (the loop runs in the
    ServerApp's thread, where no signal handler can be installed). Ctrl-C reaches the whole process group, as
    from a terminal."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    args = [a for a in ARGS if not a.startswith(("trainer.steps", "trainer.save_every"))]
    cmd = [sys.executable, "-m", "groupwise.cli", "train", RECIPE, *args, "trainer.steps=400", "trainer.save_every=0",
           "driver.backend=flower", "eval.after=false", f"out_dir={tmp_path}", "name=fl"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log, deadline = tmp_path / "fl" / "metrics.jsonl", time.time() + 240
    while proc.poll() is None and time.time() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("no exit within 120 s of Ctrl-C") from None
    assert proc.returncode == 130, err[-2000:]
    step = [line for line in (out + err).splitlines() if line.startswith("interrupted: saved step")]
    assert step, err[-2000:]
    assert (tmp_path / "fl" / "checkpoints" / f"step_{int(step[0].split()[3].rstrip(';')):07d}").is_dir()
