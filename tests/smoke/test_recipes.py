"""Every recipe loads, and trains for 2 tiny steps on CPU (smoke overrides), writing what a run writes."""

import json
import math
from pathlib import Path

import pytest
from support import smoke_token_budget

from groupwise import api
from groupwise.config import load

ROOT = Path(__file__).parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
SMOKE = ["trainer.steps=2", "trainer.save_every=1", "trainer.threads=1", "trainer.progress=false",
         "trainer.sinks=[jsonl]", "rollout.prompts_per_step=2", "rollout.max_completion_tokens=24",
         "model.warm_start_steps=15", "eval.n_problems=4", "eval.k=2", "eval.before=false"]


def test_there_are_recipes():
    assert any(p.name == "grpo_lab.yaml" for p in RECIPES)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_trains_two_steps(recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path.parent.parent / "groupwise-cache"))
    monkeypatch.chdir(ROOT)  # recipes name example files relative to the repository root
    local = ["driver.local_steps=1"] if hasattr(load(recipe).driver.cfg, "local_steps") else []  # federated rounds
    local += smoke_token_budget(recipe, SMOKE)  # think modes' caps stay below the token budget, as in the recipe
    recipe_model = load(recipe).model
    if recipe_model.warm_start is True and not recipe_model.path.startswith("embedded:"):
        local += ["model.warm_start_steps=2", "model.warm_start_batch=4"]  # a real model's warm-up: 2 small steps
    cfg = load(recipe, [*SMOKE, *local, f"out_dir={tmp_path}"])
    if cfg.rollout.generator.name == "vllm":  # its own lane (its own virtual environment): tests/vllm_lane
        pytest.importorskip("vllm")
    if cfg.rollout.group_size > 8:  # keep smoke runs small, but never below what a recipe's method needs
        cfg = load(recipe, [*SMOKE, *local, f"out_dir={tmp_path}", "rollout.group_size=8"])
    result = api.run(cfg)  # the recipe's driver (single, or a multi-policy / federated one)
    run = tmp_path / cfg.name
    assert (run / "resolved_config.yaml").exists()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_s" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("reward/mean", "reward/correct_frac", "rollout/completion_len_mean", "perf/gen_tokens"):
            assert key in r and math.isfinite(r[key])
        if r.get("update/loss_tokens", 0) > 0 and "loss/total" in r:
            assert math.isfinite(r["loss/total"])
    assert "eval/mean_at_k" in result["after"] or cfg.driver.name != "single" and any(
        k.startswith("eval/") for k in result["after"])  # a two-player driver reports its own eval metrics
    weights = "adapter_config.json" if cfg.model.lora else "config.json"  # a LoRA run saves its adapter
    # a multi-policy driver checkpoints each player in its own run directory (players/<p>/checkpoints)
    assert list(run.glob(f"**/checkpoints/step_0000002/model/{weights}")), "no step-2 checkpoint"
