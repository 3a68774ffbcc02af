"""Every recipe (every built-in method) trains two steps with its rollouts from the vLLM generator.

One engine serves all of them (starting one costs ~40 s): every recipe's run gets a vLLM generator built as
usual, except that its engine is the shared one, given that run's policy weights before it generates (every
lab recipe uses the same embedded architecture and tokenizer). This is the support-matrix check behind
docs/methods.md: a method that cannot run with vLLM must be refused at load, not fail here.
"""

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from support import smoke_token_budget, vllm_lane_recipes  # noqa: E402

from groupwise.config import load  # noqa: E402
from groupwise.loop.setup import build  # noqa: E402
from groupwise.loop.trainer import train  # noqa: E402
from groupwise.standard import vllm as gw_vllm  # noqa: E402

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).parents[2]
SMOKE = ["trainer.steps=2", "trainer.save_every=2", "trainer.threads=2", "trainer.progress=false",
         "trainer.sinks=[jsonl]", "rollout.prompts_per_step=2", "rollout.max_completion_tokens=24",
         "model.warm_start_steps=15", "eval.n_problems=4", "eval.k=1", "eval.before=false", "eval.every=0",
         "rollout.generator=vllm", "rollout.generator.enforce_eager=true",
         "rollout.generator.lora_sync=merged"]  # the shared engine has no LoRA layers (adapter sync: test_vllm.py)


RECIPES = vllm_lane_recipes()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    p = build(load("recipes/grpo_lab.yaml", [*SMOKE, f"out_dir={tmp_path_factory.mktemp('engine')}"]))
    yield p.generator.inner.engine
    p.generator.close()


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_trains_with_vllm(recipe, engine, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path.parent.parent / "groupwise-cache"))
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(gw_vllm.VLLMGenerator, "_start", lambda self, *a: engine)
    monkeypatch.setattr(gw_vllm.VLLMGenerator, "close", lambda self: None)  # the module's engine lives on
    smoke = [*SMOKE, *smoke_token_budget(recipe, SMOKE), f"out_dir={tmp_path}"]
    cfg = load(recipe, smoke)
    if cfg.rollout.group_size > 8:
        cfg = load(recipe, [*smoke, "rollout.group_size=8"])
    result = train(cfg)
    rows = [json.loads(x) for x in (tmp_path / cfg.name / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_s" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["perf/gen_tokens"] > 0 for r in steps)
    assert "eval/mean_at_k" in result["after"] and torch.isfinite(torch.tensor(steps[-1]["reward/mean"]))
