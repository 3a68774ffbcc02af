"""experiments/real_lab.py's pairing check: a run is compared with its control or its seed's step 0 only where the
settings that decide their evals agree, and a setting newer than one of the runs counts as its default there."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from groupwise.config import load, to_dict

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("real_lab", ROOT / "experiments" / "real_lab.py")
real_lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real_lab)


def run_dir(root: Path, name: str, overrides: list[str], drop: tuple[str, str] | None = None) -> Path:
    """A run directory with the lab recipe's resolved config (``drop``: a (section, key) removed, as in a config
    written before that key existed)."""
    tree = to_dict(load(ROOT / real_lab.RECIPE, overrides))
    if drop:
        del tree[drop[0]][drop[1]]
    (root / name).mkdir()
    (root / name / "resolved_config.yaml").write_text(yaml.safe_dump(tree))
    return root / name


def test_a_key_newer_than_the_run_takes_its_default(tmp_path):
    old = run_dir(tmp_path, "grpo-s0", ["seed=0"], drop=("task", "modes"))  # written before task.modes existed
    run_dir(tmp_path, "lampo-s0", ["seed=0"])  # task.modes: false, written
    real_lab.check_step0(tmp_path / "lampo-s0", old)


def test_a_setting_that_decides_the_eval_refuses_the_pair(tmp_path):
    base = run_dir(tmp_path, "grpo-s0", ["seed=0"], drop=("task", "modes"))
    for name, overrides, key in [("think-s0", ["seed=0", "task.modes=true"], "task"),
                                 ("capped-s0", ["seed=0", "rollout.max_completion_tokens=96"],
                                  "rollout.max_completion_tokens"),
                                 ("other-s1", ["seed=1"], "seed")]:
        with pytest.raises(SystemExit, match=f"{name}: evaluated unlike grpo-s0 .*{key}"):
            real_lab.check_step0(run_dir(tmp_path, name, overrides), base)


def test_an_int8_sampler_is_evaluated_in_float32_and_pairs(tmp_path):
    base = run_dir(tmp_path, "grpo-s0", ["seed=0"])
    real_lab.check_step0(run_dir(tmp_path, "int8-s0", ["seed=0", "rollout.generator.dtype=int8"]), base)
