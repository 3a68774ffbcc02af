"""Every rule that reads only the config and the installed packages refuses a run before anything heavy exists:
``groupwise.train`` raises the one-line ``ConfigError`` at load (``config/check.py``, a member config's
``check(run)``) or, for several processes, when the run starts (``config.check.processes``), and no task, model,
warm start or engine was built. The walk below is the list of known refusals; a rule that moves to build time
fails here, since building anything counts as heavy."""

from __future__ import annotations

import pytest
import torch

import groupwise
from groupwise.config import Spec
from groupwise.loop import setup
from groupwise.models import load as models_load
from groupwise.models import warm_start
from groupwise.registry import ConfigError
from groupwise.standard.lab import Lab

REFUSALS = [
    # (overrides, what the one line says)
    (["rollout.generator=vllm", "rollout.top_p=0.9", "rollout.temperature=0.8"], "top-p-renormalised"),
    (["task=search", "reward.terms=[step_credit]"], r"requires 'step_credit'.*allowed: add task 'lab'"),
    (["task=search", "reward.terms=[correctness, {name: step_credit, weight: 0}]"], "requires 'step_credit'"),
    (["rollout.tools={}"], r"rollout.tools.tool='search': task 'lab' has no tools"),
    (["rollout.generator=fake", "loss.importance_sampling.mode=token_truncate"], "returns no sampling log-probs"),
    (["trainer.data_parallel=fsdp", "rollout.max_async_level=1"], "not built with trainer.data_parallel"),
    (["teacher=privileged", "rollout.max_async_level=1"], "reads the weights being updated"),
    (["loss.terms=[ppo_clip, opsd]"], r"requires 'teacher'"),
    (["credit=[dash_drift]"], r"requires 'drift_marks'.*group transform 'dash_drift'"),
    (["driver=agon", "filter=zero_variance"], r"cannot run with filter 'zero_variance'.*'drops_groups'"),
    (["driver=agon", "rollout.generator=vllm"], "does not run with vllm"),
    (["rollout.workers=1", "reward.terms=[acoer]"], "would live in a Ray worker"),
    (["optim.autocast=bf16", "model.dtype=bfloat16"], "optim.autocast=bf16 with model.dtype"),
    (["trainer.data_parallel=fsdp", "model.lora={}"], "model.lora under FSDP is not built"),
    (["trainer.steps=3", "driver=fgrpo", "driver.local_steps=2"], "not a multiple"),
    *([] if torch.cuda.is_available() else [(["rollout.generator=vllm", "rollout.generator.sleep=true"],
                                             "sleep: true needs a CUDA device")]),
]
SEVERAL_PROCESSES = [
    (["rollout.generator=vllm"], "under torchrun / accelerate"),
    (["driver=agon", "driver.players=full"], "does not run with torchrun"),
]


@pytest.fixture
def heavy(monkeypatch):
    """Building a task, loading a model or a warm start, or calling a driver, noted and stopped."""
    built: list[str] = []

    def stop(what):
        def call(*args, **kwargs):
            built.append(what)
            raise AssertionError(f"{what} was built before the refusal")
        return call

    monkeypatch.setattr(setup, "_load_policy", stop("the policy"))
    monkeypatch.setattr(models_load, "load_model", stop("a model"))
    monkeypatch.setattr(warm_start, "ensure_warm_start", stop("a warm start"))
    monkeypatch.setattr(Lab, "__init__", stop("the lab task"))
    monkeypatch.setattr(Spec, "build", stop("the driver"))  # a component built on its own: the driver (api.run)
    return built


@pytest.mark.parametrize("overrides,says", REFUSALS, ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_a_config_rule_refuses_before_anything_is_built(overrides, says, heavy, tmp_path):
    with pytest.raises(ConfigError, match=says):
        groupwise.train(None, [*overrides, f"out_dir={tmp_path}"])
    assert heavy == []


@pytest.mark.parametrize("overrides,says", SEVERAL_PROCESSES, ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_what_several_processes_refuse_is_refused_before_anything_is_built(overrides, says, heavy, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=says):
        groupwise.train(None, [*overrides, f"out_dir={tmp_path}"])
    assert heavy == []


def test_the_walk_can_fail(heavy, tmp_path):
    """A recipe with no refusal reaches the heavy part, and the fixture sees it."""
    with pytest.raises(AssertionError, match="was built before the refusal"):
        groupwise.train(None, ["trainer.steps=1", f"out_dir={tmp_path}"])
    assert heavy
