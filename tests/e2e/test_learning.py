"""RL raises held-out accuracy over the warm start: `groupwise demo` (its own setting, fewer steps).

The demo's warm start imitates a removable flaw (a step whose sum wraps past 9 is off by one 60% of the
time), so the warm-started policy answers ~15-20% of held-out chains correctly and GRPO has headroom.
The threshold is set from the evaluation's noise, not from an observed run: mean@4 over the same 128
held-out problems before and after has a standard error of at most sqrt(2 * 0.25 / 512) ~= 0.031 for the
difference, so a gain of 0.10 (> 3 standard errors) cannot come from sampling noise alone.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from groupwise.cli import DEMO
from groupwise.config import load, to_dict

ROOT = Path(__file__).parents[2]


def test_demo_setting_is_the_grpo_lab_recipe():
    demo, recipe = to_dict(load(None, [], base=DEMO)), to_dict(load(ROOT / "recipes" / "grpo_lab.yaml", []))
    for d in (demo, recipe):
        d.pop("name")
    assert demo == recipe, "recipes/grpo_lab.yaml must stay the demo's setting (README quotes both)"


def test_grpo_raises_held_out_accuracy_over_the_warm_start(tmp_path):
    env = {**os.environ, "GROUPWISE_CACHE": str(tmp_path / "cache"), "PYTHONHASHSEED": "0",
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "groupwise.cli", "demo", "--out-dir", str(tmp_path), "trainer.steps=40",
           "eval.every=0", "trainer.save_every=0", "trainer.threads=2", "trainer.progress=false"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    before, after = summary["before"], summary["after"]
    assert before["eval/mean_at_k"] < 0.5, "the warm start should leave headroom (it imitates a flaw)"
    assert after["eval/mean_at_k"] >= before["eval/mean_at_k"] + 0.10, (before, after)
    assert after["eval/format_frac"] >= 0.9, "accuracy must not come with broken output format"
