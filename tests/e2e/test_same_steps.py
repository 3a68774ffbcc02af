"""Behaviour does not change under a refactor: a few recipes' first 3 steps give, metric for metric, what the code
gave before the issue-32 refactor (7f2d4c6; ``tests/e2e/golden_steps.json``, written by ``scripts/same_steps.py``,
which compares every recipe: see its docstring). Wall-clock metrics are left out; a metric added since is listed by
the script and ignored here. The golden was written on another machine, so values are compared within
``ACROSS_MACHINES`` (a few float32 ulps), not bit for bit; on one machine the script checks bit for bit."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from same_steps import ACROSS_MACHINES, compare, step_metrics  # noqa: E402

GOLDEN = json.loads((Path(__file__).with_name("golden_steps.json")).read_text())


@pytest.mark.parametrize("recipe", sorted(GOLDEN))
def test_first_steps_match_the_golden(recipe, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    got = step_metrics(str(ROOT / "recipes" / recipe), steps=3, out_dir=str(tmp_path))
    assert compare(GOLDEN[recipe], got, strict=False, tol=ACROSS_MACHINES) == []


def test_the_comparison_sees_a_changed_bit():
    row = GOLDEN["grpo_lab.yaml"][0]
    bent = {**row, "loss/total": row["loss/total"] + 1e-12}
    want = f"step 1: loss/total {row['loss/total']!r} -> {bent['loss/total']!r}"
    assert compare([row], [bent], strict=False) == [want]
    assert compare([row], [{**row, "new/metric": 1.0}], strict=False) == []
    assert compare([row], [{**row, "new/metric": 1.0}], strict=True) == ["step 1: new/metric only after"]


def test_the_cross_machine_tolerance_is_a_few_ulps_not_a_changed_result():
    row = GOLDEN["grpo_lab.yaml"][0]
    loss = row["loss/total"]
    assert abs(loss) < 1  # so the tolerance is absolute here: 1e-5
    ulps = {**row, "loss/total": loss + 3e-7, "mismatch/max_abs_dlogp": row["mismatch/max_abs_dlogp"] + 2e-6}
    assert compare([row], [ulps], strict=False, tol=ACROSS_MACHINES) == []
    for key, bent in (("loss/total", loss + 2e-5), ("reward/mean", row["reward/mean"] + 1 / 32)):
        changed = {**row, key: bent}
        want = [f"step 1: {key} {row[key]!r} -> {bent!r}"]
        assert compare([row], [changed], strict=False, tol=ACROSS_MACHINES) == want
    big = {"step": 1, "update/loss_tokens": 1000.0}  # above 1 the tolerance is relative
    assert compare([big], [{**big, "update/loss_tokens": 1000.009}], strict=False, tol=ACROSS_MACHINES) == []
    assert compare([big], [{**big, "update/loss_tokens": 1000.02}], strict=False, tol=ACROSS_MACHINES) != []
