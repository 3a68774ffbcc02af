"""Environments brought from elsewhere train end to end on the lab model (CPU, a few steps): a verifiers environment
written against verifiers' own v1 API (examples/verifiers_arith.py) and an OpenEnv server the test starts itself on
loopback (examples/openenv_chain.py), their rewards the ``environment`` term's; and the chat-template tool loop with
the verifiers environment's toolset. The model is the grpo_lab recipe's warm start (packaged), saved with a chat
template that carries tools (it renders a plain prompt exactly as the lab's does)."""

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from support import tool_model_dir

import groupwise

ROOT = Path(__file__).parents[2]
RUN = ["trainer.threads=1", "trainer.progress=false", "trainer.sinks=[jsonl]", "trainer.save_every=0",
       "rollout.prompts_per_step=8", "rollout.group_size=8", "eval.n_problems=16", "eval.k=2",
       "reward.terms=[{name: environment}]"]


@pytest.fixture(scope="module")
def lab_model(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    os.environ["GROUPWISE_CACHE"] = str(cache)
    return tool_model_dir(tmp_path_factory.mktemp("model") / "lab", ROOT / "recipes" / "grpo_lab.yaml")


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def train(tmp_path, name, overrides):
    result = groupwise.train("recipes/grpo_lab.yaml", [f"out_dir={tmp_path}", f"name={name}", *RUN, *overrides],
                             overwrite=True)
    return result, metrics(tmp_path / name)


def test_a_verifiers_environment_trains_on_the_lab_model(lab_model, tmp_path, monkeypatch):
    pytest.importorskip("verifiers")
    monkeypatch.chdir(ROOT)
    _, rows = train(tmp_path, "vf", [f"model.path={lab_model}", "trainer.steps=6", "eval.every=6",
                                     "task={name: verifiers, env: examples/verifiers_arith.py:ArithTaskset, "
                                     "env_args: {size: 600}}"])
    steps = [r for r in rows if "reward/env" in r]
    assert len(steps) == 6 and all(math.isfinite(r["loss/total"]) for r in steps)
    # the env's rubric is the reward: its one reward function, weight 1, and its metric logged beside it
    assert all(r["reward/env"] == r["reward/env/correct"] == r["reward/mean"] for r in steps)
    assert all("reward/env/answered" in r and r["reward/env_errors"] == 0 for r in steps)
    # verify (correctness, the eval) is the same rubric on the completion: the same verdicts
    assert all(r["reward/correct_frac"] == r["reward/env"] for r in steps)
    assert 0 < sum(r["reward/env"] for r in steps) / 6 < 1  # the warm start answers some: a learning signal
    evals = [r for r in rows if "eval/mean_at_k" in r]
    assert len(evals) == 2
    last = sorted((tmp_path / "vf" / "checkpoints").glob("step_*"))[-1] / "model"
    changed = [k for k, v in weights(last).items() if not torch.equal(v, weights(lab_model)[k])]
    assert changed, "the update changed nothing"


def test_a_verifiers_toolset_through_the_chat_template(lab_model, tmp_path, monkeypatch):
    """Scripted model turns (the fake generator) that call the environment's calculator, in the template's format:
    the call runs, its result comes back as a tool message, the rubric scores the final reply."""
    pytest.importorskip("verifiers")
    monkeypatch.chdir(ROOT)
    call = '<tool_call>{"name": "calculator_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    _, rows = train(tmp_path, "tools", [
        f"model.path={lab_model}", "trainer.steps=2", "eval.every=0", "rollout.group_size=4",
        "rollout.max_completion_tokens=300", "trainer.record_groups=2",
        "task={name: verifiers, env: examples/verifiers_arith.py:ArithTaskset, env_args: {size: 100}}",
        f"rollout.generator={{name: fake, completions: ['{call}', '<answer>5</answer>']}}",
        "rollout.tools={protocol: chat, max_turns: 3, turn_tokens: 120}"])
    steps = [r for r in rows if "reward/env" in r]
    assert steps and all(r["rollout/tool_calls"] > 0 and r["rollout/tool_errors"] == 0 for r in steps)
    records = [json.loads(line) for line in (tmp_path / "tools" / "rollouts.jsonl").read_text().splitlines()]
    texts = [s["text"] for rec in records for g in rec["groups"] for s in g["samples"]]
    assert any("<tool_response>5</tool_response>" in t for t in texts), texts[:2]


def serve(app: str) -> tuple[subprocess.Popen, str]:
    """The test's own OpenEnv server: ``uvicorn`` on a free loopback port, as a user runs one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", str(ROOT / "examples"), app,
                             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            assert proc.poll() is None, "the OpenEnv server exited"
            time.sleep(0.5)
    proc.kill()
    pytest.fail("the OpenEnv server did not answer /health")


def test_an_openenv_server_drives_the_multi_turn_loop(lab_model, tmp_path, monkeypatch):
    pytest.importorskip("openenv")
    monkeypatch.chdir(ROOT)
    proc, url = serve("openenv_chain:app")
    try:
        _, rows = train(tmp_path, "oe", [
            f"model.path={lab_model}", "trainer.steps=4", "eval.every=4",
            f"task={{name: openenv, url: '{url}', observation_field: prompt, train_seeds: 500, test_seeds: 16}}",
            "rollout.tools={protocol: chat, max_turns: 2, turn_tokens: 48, workers: 32, timeout_s: 60}",
            "rollout.max_completion_tokens=120"])
    finally:
        proc.kill()
        proc.wait()
    steps = [r for r in rows if "reward/env" in r]
    assert len(steps) == 4 and all(math.isfinite(r["loss/total"]) for r in steps)
    assert all(r["reward/env_errors"] == 0 and r["reward/env/steps"] >= 1 for r in steps)  # every episode stepped
    assert any(r["rollout/turns"] > 1 for r in steps)  # a wrong first answer got a second try
    assert sum(r["reward/env"] for r in steps) > 0  # right answers scored by the environment
    # verify: an episode is correct when its reward reaches 1 (a right first answer): never more than the reward
    assert all(r["reward/correct_frac"] <= r["reward/env"] + 1e-9 for r in steps)
