"""N steps + SIGKILL + resume + N steps reproduces 2N uninterrupted steps, metric for metric."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ARGS = ["trainer.steps=6", "trainer.save_every=3", "trainer.threads=1", "trainer.progress=false",
        "trainer.sinks=[jsonl]", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_completion_tokens=24", "model.warm_start_steps=40", "eval.before=false", "eval.after=false",
        # lengths vary, so every step trains
        "task.p_wrap_slip=0.5", "reward.terms=[{name: length_penalty, max_length: 24}]"]
RECIPE = str(Path(__file__).parents[2] / "recipes" / "grpo_lab.yaml")


def cli(*args, env):
    return [sys.executable, "-m", "groupwise.cli", "train", RECIPE, *ARGS, *args]


def staleness(run: Path) -> list[float]:
    return [r["rollout/staleness_max"] for r in training_rows(run)]


def training_rows(run: Path):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "time"} for r in rows]


@pytest.mark.parametrize("extra", [[], ["rollout.max_async_level=1"]], ids=["sync", "async_k1"])
def test_kill_and_resume_matches_uninterrupted(tmp_path, extra):
    """With ``rollout.max_async_level=1`` the kill lands after the rollout of the checkpoint's step was run
    ahead (on the previous version's snapshot); the resumed run regenerates it from the checkpoint."""
    src = str(Path(__file__).parents[2] / "src")
    env = {**os.environ, "GROUPWISE_CACHE": str(tmp_path / "cache"), "PYTHONHASHSEED": "0",
           "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ref = subprocess.run(cli(f"out_dir={tmp_path}/a", *extra, env=env), env=env, capture_output=True, text=True,
                         timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]

    proc = subprocess.Popen(cli(f"out_dir={tmp_path}/b", *extra, env=env), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ck = tmp_path / "b" / "grpo_lab" / "checkpoints" / "step_0000003" / "trainer_state.pt"
    deadline = time.time() + 600
    while not ck.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    rows_before = training_rows(tmp_path / "b" / "grpo_lab")
    assert 3 <= len(rows_before) < 6

    res = subprocess.run(cli(f"out_dir={tmp_path}/b", *extra, "--resume", env=env), env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    a, b = training_rows(tmp_path / "a" / "grpo_lab"), training_rows(tmp_path / "b" / "grpo_lab")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert a == b
    trained = [r["rollout/samples"] - r["update/skipped_rows"] for r in a if "update/skipped_rows" in r]
    assert sum(trained) > 0, "no step trained on anything: the test would be vacuous"
    assert staleness(tmp_path / "a" / "grpo_lab") == ([0.0] * 6 if not extra else [0.0] + [1.0] * 5)


def test_resume_with_other_settings_is_refused_but_a_longer_run_is_not(tmp_path, monkeypatch):
    from groupwise.config import load
    from groupwise.loop.trainer import train
    from groupwise.registry import ConfigError

    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    base = [a for a in ARGS if not a.startswith(("trainer.steps", "model.warm_start_steps"))]
    base += [f"out_dir={tmp_path}", "model.warm_start_steps=5"]
    train(load(RECIPE, [*base, "trainer.steps=1"]))
    with pytest.raises(ConfigError,
                       match=r"--resume with settings that differ .*: seed, optim.lr; resume with the same"):
        train(load(RECIPE, [*base, "trainer.steps=1", "seed=5", "optim.lr=2e-4"]), resume=True)
    out = train(load(RECIPE, [*base, "trainer.steps=2", "eval.n_problems=4"]), resume=True)  # longer: allowed
    assert "last" in out


def test_a_run_from_before_a_new_config_key_resumes(tmp_path, monkeypatch):
    """A run whose resolved_config.yaml predates a key (here ``reward.worker_memory_mb``, added 2026-12-06) resumes
    when the key is at its default (it was refused as a difference), and a key set away from its default is still
    one."""
    import yaml

    from groupwise.config import load
    from groupwise.loop.trainer import train
    from groupwise.registry import ConfigError

    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    base = [a for a in ARGS if not a.startswith(("trainer.steps", "model.warm_start_steps", "eval."))]
    base += [f"out_dir={tmp_path}", "model.warm_start_steps=5", "eval.before=false", "eval.after=false"]
    train(load(RECIPE, [*base, "trainer.steps=1"]))
    path = tmp_path / "grpo_lab" / "resolved_config.yaml"
    old = yaml.safe_load(path.read_text())
    del old["reward"]["worker_memory_mb"]  # as written before the key existed
    path.write_text(yaml.safe_dump(old, sort_keys=False))
    with pytest.raises(ConfigError, match=r"settings that differ .*: reward\.worker_memory_mb; resume"):
        train(load(RECIPE, [*base, "trainer.steps=2", "reward.worker_memory_mb=100"]), resume=True)
    assert "last" in train(load(RECIPE, [*base, "trainer.steps=2"]), resume=True)


def test_a_resumed_runs_summary_keeps_its_step_0_eval(tmp_path, monkeypatch):
    """The summary of a resumed run lost ``before`` (the step-0 eval ran in the first process only)."""
    from groupwise.config import load
    from groupwise.loop.trainer import train

    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    base = [a for a in ARGS if not a.startswith(("trainer.steps", "model.warm_start_steps", "eval."))]
    base += [f"out_dir={tmp_path}", "model.warm_start_steps=5", "eval.n_problems=4", "eval.after=false"]
    first = train(load(RECIPE, [*base, "trainer.steps=1"]))
    assert first["before"]["eval/mean_at_k"] >= 0.0
    longer = train(load(RECIPE, [*base, "trainer.steps=2"]), resume=True)
    assert longer["before"] == first["before"]
    nothing_left = train(load(RECIPE, [*base, "trainer.steps=2"]), resume=True)
    assert nothing_left["before"] == first["before"] and nothing_left["last"] == longer["last"]
    summary = json.loads((tmp_path / "grpo_lab" / "summary.json").read_text())
    assert summary["before"] == first["before"]
