"""Every recipe's warm start ships with the package, so the first run of any recipe starts RL at once (the
packaged bytes are what ``models/warm_start.sft`` wrote on the reference machine). After changing a recipe's
task or warm-start settings, run ``python -m groupwise.models.warm_start recipes/*.yaml``."""

import dataclasses
import json
from pathlib import Path

import pytest

from groupwise.config import load
from groupwise.log import StorageError
from groupwise.models import warm_start
from groupwise.registry import BuildEnv
from groupwise.standard.lab import LabConfig

ROOT = Path(__file__).parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def key(cfg):
    task = cfg.task.build(BuildEnv(run=cfg, seed=cfg.seed))
    return (f"{cfg.model.path.split(':', 1)[1]}-"
            f"{warm_start.warm_start_key(cfg.model.path.split(':', 1)[1], task, cfg.model)}")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_the_recipes_warm_start_is_packaged(recipe, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load(recipe)
    if not (cfg.model.path.startswith("embedded:") and cfg.model.warm_start and cfg.model.warm_start_steps):
        pytest.skip("no warm start")
    d = warm_start.packaged_root() / key(cfg)
    assert (d / "model.safetensors").is_file(), \
        f"{d.name} is not packaged: python -m groupwise.models.warm_start {recipe}"
    meta = json.loads((d / "warm_start.json").read_text())
    assert meta["steps"] == cfg.model.warm_start_steps


def test_a_packaged_warm_start_is_copied_into_the_cache_not_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path))
    cfg = load(ROOT / "recipes" / "grpo_lab.yaml")
    monkeypatch.setattr(warm_start, "sft", lambda *a, **k: pytest.fail("rebuilt a packaged warm start"))
    task = cfg.task.build(BuildEnv(run=cfg, seed=0))
    got = warm_start.ensure_warm_start("lab-tiny", task, cfg.model)
    src = warm_start.packaged_root() / got.name
    assert (got / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_an_unwritable_cache_reads_a_packaged_warm_start_from_the_package(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "afile" / "cache"))  # cannot be created: a file in the way
    cfg = load(ROOT / "recipes" / "grpo_lab.yaml")
    monkeypatch.setattr(warm_start, "sft", lambda *a, **k: pytest.fail("rebuilt a packaged warm start"))
    task = cfg.task.build(BuildEnv(run=cfg, seed=0))
    assert warm_start.ensure_warm_start("lab-tiny", task, cfg.model) == warm_start.packaged_root() / key(cfg)
    other = dataclasses.replace(cfg.model, warm_start_steps=7)  # nothing packaged: one line naming the cache
    with pytest.raises(StorageError,
                       match=r"GROUPWISE_CACHE=.*afile/cache: cannot write the warm start cache .*set "
                             r"GROUPWISE_CACHE to a writable directory") as e:
        warm_start.ensure_warm_start("lab-tiny", task, other)
    assert "\n" not in str(e.value)


def test_a_new_defaulted_task_field_keeps_existing_keys():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Grown(LabConfig):
        new_knob: int = 0  # a field added later, at its default

    class Task:
        name = "lab"

        def __init__(self, cfg):
            self.cfg = cfg

    m = load(None).model
    assert warm_start.warm_start_key("lab-tiny", Task(Grown(p_slip=0.1)), m) == \
        warm_start.warm_start_key("lab-tiny", Task(LabConfig(p_slip=0.1)), m)
    assert warm_start.warm_start_key("lab-tiny", Task(Grown(p_slip=0.1, new_knob=1)), m) != \
        warm_start.warm_start_key("lab-tiny", Task(LabConfig(p_slip=0.1)), m)
