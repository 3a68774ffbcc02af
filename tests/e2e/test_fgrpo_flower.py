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
                      "from groupwise.rewards import per_sample\n\n\n"
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
from groupwise.rewards import per_sample


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
from groupwise.rewards import per_sample


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


HANGS_ONCE = '''import os, time
from groupwise.registry import NoConfig
from groupwise.rewards import REWARDS


@REWARDS.register("hangs_once_flower", config=NoConfig)
def hangs_once(cfg, env):
    def term(groups, step):  # client 1 (its problems are products) hangs once, at step 1 = round 1
        mark = os.path.join(os.environ["GW_FAULT_DIR"], "hang")
        if step == 1 and any("*" in g.problem.prompt for g in groups) and os.path.exists(mark):
            os.remove(mark)
            time.sleep(10**6)
        return [[0.5] * len(g.samples) for g in groups]
    return term
'''


def test_a_hung_flower_client_is_found_from_the_measured_replies(tmp_path, monkeypatch):
    """Issue 48: with ``driver.round_timeout_s`` at its default (then 3600 s) a hung client blocked the run for an
    hour. Unset, the limit comes from what was measured: round 1's hang is found within 5 x the longest wait for
    a reply in round 0 (the floor of 120 s is lowered to 1 s so that the test does not wait for it)."""
    import time

    from groupwise.methods.fgrpo import flower_app

    monkeypatch.setattr(flower_app, "AUTO_MIN_S", 1.0)
    calls, send = [], flower_app.FlowerFederation.send

    def timed(self, contents, kind, measure=None):
        before, t0 = self.longest.get(measure or kind), time.monotonic()
        out = send(self, contents, kind, measure)
        calls.append((measure or kind, before, self.limit, time.monotonic() - t0, len(out)))
        return out

    monkeypatch.setattr(flower_app.FlowerFederation, "send", timed)
    (tmp_path / "hangs_once.py").write_text(HANGS_ONCE)
    (tmp_path / "hang").touch()
    monkeypatch.setenv("GW_FAULT_DIR", str(tmp_path))
    args = [a for a in ARGS if not a.startswith(("reward.terms", "trainer.steps", "driver.clients"))]
    api.run(load(RECIPE, [*args, f"out_dir={tmp_path}", "name=fl", "driver.backend=flower", "trainer.steps=3",
                          f"plugins=[{tmp_path / 'hangs_once.py'}]", "eval.after=false",
                          "driver.clients=[{task: {ops: '+'}}, {task: {ops: '*'}}]",
                          "reward.terms=[{name: hangs_once_flower}, {name: length_penalty, max_length: 24}]"]))
    assert not (tmp_path / "hang").exists(), "client 1 hung"
    assert [r["federated/clients_ok"] for r in rows(tmp_path / "fl")] == [2.0, 1.0, 2.0]  # round 1: client 1 hung
    rounds = [c for c in calls if c[0] == "train"]
    assert rounds[0][1] is None and rounds[0][2] == flower_app.AUTO_FIRST_S  # nothing measured yet
    _, longest, limit, took, answered = rounds[1]
    assert answered == 1 and limit == max(1.0, 5 * longest), rounds
    assert took < 1.5 * limit + 5 and limit < 300, rounds  # found in the measured time, not in an hour


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


FAILS_IN_CLIENTS = '''import os
from groupwise.registry import NoConfig
from groupwise.rewards import REWARDS
from groupwise.rewards import per_sample


@REWARDS.register("fails_in_clients", config=NoConfig)
def fails_in_clients(cfg, env):  # the server builds its pipeline in the driver's process: only clients fail
    if os.getpid() != int(os.environ["GW_DRIVER_PID"]):
        raise OSError("the reward's data is not mounted on this node")
    return per_sample(lambda s, p: 0.5)
'''


def test_a_flower_client_that_cannot_start_stops_the_run_in_one_line(tmp_path, monkeypatch):
    """Issue 48: a client that could not start (its first message builds its pipeline: an error reply, or none
    within the start timeout when Ray's actor does not come up) stopped the run with a RuntimeError traceback
    carrying Ray's remote traceback; now one line ending with the client's own error."""
    import os

    from groupwise.registry import RunStopped

    (tmp_path / "fails.py").write_text(FAILS_IN_CLIENTS)
    monkeypatch.setenv("GW_DRIVER_PID", str(os.getpid()))
    args = [a for a in ARGS if not a.startswith(("reward.terms", "trainer.steps"))]
    with pytest.raises(RunStopped) as e:
        api.run(load(RECIPE, [*args, f"out_dir={tmp_path}", "name=fl", "driver.backend=flower", "trainer.steps=1",
                              f"plugins=[{tmp_path / 'fails.py'}]", "eval.after=false",
                              "reward.terms=[{name: fails_in_clients}, {name: length_penalty, max_length: 24}]"]))
    assert str(e.value) == "flower: a client could not start: OSError: the reward's data is not mounted on this node"


RAY_TIMES_OUT = '''import ray


def init(*args, **kwargs):  # what ray.init raises when its processes do not come up in time on a loaded machine
    raise Exception("The current node timed out during startup. This could happen because some of the Ray "
                    "processes failed to startup.")


ray.init = init
'''


def test_a_flower_run_whose_ray_start_up_fails_exits_in_one_line(tmp_path):
    """Issue 48: a Flower run whose Ray start-up timed out printed Flower's tracebacks and never exited: the
    ServerApp's thread (not a daemon) went on waiting for the clients' first reply, up to the start timeout."""
    import os
    import subprocess
    import sys

    (tmp_path / "ray_times_out.py").write_text(RAY_TIMES_OUT)  # imported by the driver before the run is built
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    cmd = [sys.executable, "-m", "groupwise.cli", "train", RECIPE, *ARGS, "driver.backend=flower", "eval.after=false",
           f"plugins=[{tmp_path / 'ray_times_out.py'}]", f"out_dir={tmp_path}", "name=fl"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raise AssertionError("no exit within 180 s of a failed Ray start-up") from None
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 1 and "Traceback" not in err and "An exception occur" not in err, err[-3000:]
    assert lines[-1].startswith("error: flower: the simulation runtime stopped (Exception: The current node timed "
                                "out during startup."), lines[-3:]
    assert lines[-1].endswith("resume with --resume"), lines[-1]
    assert (tmp_path / "fl" / "flower_runtime.log").read_text().count("Traceback") >= 1
