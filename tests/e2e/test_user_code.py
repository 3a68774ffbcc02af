"""Users' own code without editing the package: a reward function written for TRL, the Python API, and the
examples that docs/extending.md shows (the doc's code blocks are these files, checked here verbatim)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from groupwise.config import load
from groupwise.loop.setup import reward_terms
from groupwise.registry import BuildEnv
from groupwise.rewards.stage import RewardStage
from groupwise.standard.jsonl import JsonlConfig, JsonlTask
from groupwise.types import Group, Sample

ROOT = Path(__file__).parents[2]
SMOKE = ["trainer.steps=2", "trainer.save_every=0", "trainer.threads=1", "trainer.progress=false",
         "trainer.sinks=[jsonl]", "rollout.prompts_per_step=2", "rollout.max_completion_tokens=24",
         "model.warm_start_steps=15", "eval.n_problems=4", "eval.k=2"]
TEXTS = ["So the answer is \\boxed{12}.", "It is \\boxed{13}.", "no box here"]


def test_trl_accuracy_reward_runs_unchanged_with_its_dataset_columns():
    from trl.rewards import accuracy_reward

    cfg = JsonlConfig(train_path="groupwise:data/sample_math.jsonl", prompt_key="question", answer_key="answer",
                      id_key="id", system_prompt="Put the final answer in \\boxed{}.", test_fraction=0.25)
    task = JsonlTask(cfg)
    # gold 12; its `solution` column ends in #### 12
    problem = next(p for p in [*task.train, *task.test] if p.id == "gsm-1")
    run = load(None, ["reward.terms=[{name: python, function: 'trl.rewards:accuracy_reward'}]"])
    stage = RewardStage(task, reward_terms(run.reward.terms, BuildEnv(run=run, task=task)), 5.0)
    z = torch.zeros(1, dtype=torch.long)
    group = Group(problem, [Sample(prompt_ids=z, completion_ids=z, rollout_logprobs=torch.zeros(1),
                                   loss_mask=torch.ones(1, dtype=torch.bool), finish_reason="stop", text=t)
                            for t in TEXTS])
    stage([group], 0)
    direct = accuracy_reward([[{"role": "assistant", "content": t}] for t in TEXTS],
                             [problem.meta["columns"]["solution"]] * 3)
    assert [s.reward for s in group.samples] == direct == [1.0, 0.0, 0.0]
    assert stage.metrics() == {"reward/accuracy_reward_errors": 0.0}


def test_python_api_trains_with_reward_funcs(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    import groupwise

    calls = []

    def shortest(prompts, completions, completion_ids, **kwargs):
        calls.append(len(completions))
        return [-len(ids) / 24 for ids in completion_ids]

    result = groupwise.train(str(ROOT / "recipes" / "grpo_lab.yaml"),
                             [*SMOKE, f"out_dir={tmp_path}", "eval.before=false"],
                             reward_funcs=[shortest], reward_weights=[2.0])
    rows = [json.loads(x) for x in (tmp_path / "grpo_lab" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_s" in r]
    assert len(steps) == 2 and calls == [16, 16] and "reward/shortest" in steps[0]
    assert steps[0]["reward/mean"] == 2.0 * steps[0]["reward/shortest"]  # the recipe's own terms are replaced
    assert "eval/mean_at_k" in result["after"]
    resolved = (tmp_path / "grpo_lab" / "resolved_config.yaml").read_text()
    assert "test_user_code:test_python_api_trains_with_reward_funcs.<locals>.shortest" in resolved


def test_examples_run_and_match_the_docs(tmp_path):
    env = {**os.environ, "GROUPWISE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT / "src")}
    api = subprocess.run([sys.executable, "examples/python_api.py", *SMOKE, f"out_dir={tmp_path}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert api.returncode == 0, api.stderr[-2000:]
    assert re.search(r"held-out mean@k: \d\.\d{3} -> \d\.\d{3}", api.stdout)
    plugin = subprocess.run([sys.executable, "-m", "groupwise.cli", "train", "recipes/grpo_lab.yaml", *SMOKE,
                             f"out_dir={tmp_path}", "plugins=[examples/my_components.py]", "advantage=median_baseline",
                             "eval.before=false", "--overwrite"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert plugin.returncode == 0, plugin.stderr[-2000:]
    doc = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n# (examples/\S+\.py)\n(.*?)```", doc, re.S)
    assert {name for name, _ in blocks} == {"examples/trl_rewards.py", "examples/my_components.py",
                                            "examples/python_api.py"}
    for name, code in blocks:
        assert code == (ROOT / name).read_text(), f"docs/extending.md shows an outdated {name}"
