"""Behaviour does not change under a refactor: a few recipes' first 3 steps give, metric for metric, what the code
gave before the issue-32 refactor (7f2d4c6; ``tests/e2e/golden_steps.json``, written by ``scripts/same_steps.py``,
which compares every recipe: see its docstring). Wall-clock metrics are left out; a metric added since is listed by
the script and ignored here."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from same_steps import compare, step_metrics  # noqa: E402

GOLDEN = json.loads((Path(__file__).with_name("golden_steps.json")).read_text())


@pytest.mark.parametrize("recipe", sorted(GOLDEN))
def test_first_steps_are_bit_identical_to_the_golden(recipe, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    got = step_metrics(str(ROOT / "recipes" / recipe), steps=3, out_dir=str(tmp_path))
    assert compare(GOLDEN[recipe], got, strict=False) == []


def test_the_comparison_sees_a_changed_bit():
    row = GOLDEN["grpo_lab.yaml"][0]
    bent = {**row, "loss/total": row["loss/total"] + 1e-12}
    want = f"step 1: loss/total {row['loss/total']!r} -> {bent['loss/total']!r}"
    assert compare([row], [bent], strict=False) == [want]
    assert compare([row], [{**row, "new/metric": 1.0}], strict=False) == []
    assert compare([row], [{**row, "new/metric": 1.0}], strict=True) == ["step 1: new/metric only after"]
