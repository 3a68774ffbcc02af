"""Every built-in component: registered in its kind's form, satisfies its kind's Protocol once built, declares
exactly the abilities it has, has a unit test that names it, and is selected by at least one recipe (which
the smoke suite runs)."""

import re
from pathlib import Path

import pytest

from groupwise.catalog import KINDS
from groupwise.config import load
from groupwise.loop.setup import build

ROOT = Path(__file__).parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
TESTS = "\n".join(p.read_text() for p in sorted((ROOT / "tests" / "unit").rglob("test_*.py")))
BUILTIN = [(kind, e) for kind, reg in KINDS.items() for e in reg.entries() if e.origin.startswith("groupwise.")]
CHEAP = ["model.warm_start=false", "trainer.threads=1"]  # building needs no trained weights
CHEAP_LORA = ["model.warm_start_steps=1", "trainer.threads=1"]  # an adapter needs saved base weights to name


def selected() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for recipe in RECIPES:
        for spec in load(recipe).specs():
            out.setdefault(spec.kind, set()).add(spec.name)
    return out


SELECTED = selected()


@pytest.mark.parametrize("kind,entry", BUILTIN, ids=lambda x: x if isinstance(x, str) else x.name)
def test_has_a_recipe_and_a_test(kind, entry):
    assert entry.name in SELECTED.get(kind, set()), f"{kind} '{entry.name}': no recipe selects it"
    fn = getattr(entry.obj, "__name__", "")
    named = re.search(rf"""["'=\s]{re.escape(entry.name)}["',}}\]\s]""", TESTS) or re.search(rf"\b{fn}\(", TESTS)
    assert named, f"{kind} '{entry.name}': no unit test names it (tests/unit)"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_built_parts_satisfy_their_protocol_and_declared_abilities(recipe, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    # a model converted from a package (smollm2_math) comes from the cache the smoke and e2e tests share
    real = not load(recipe).model.path.startswith("embedded:")
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path.parent.parent / "groupwise-cache" if real else tmp_path))
    if load(recipe).rollout.generator.name == "vllm":  # built and run in the vLLM lane (tests/vllm_lane)
        pytest.importorskip("vllm")
    p = build(load(recipe, CHEAP_LORA if load(recipe).model.lora else CHEAP))
    for part in p.parts:
        reg = KINDS[part.entry.kind]
        if part.obj is None:
            assert reg.optional, f"{part.key}: built to None, but {reg.kind} members must build an object"
            continue
        assert isinstance(part.obj, reg.protocol), f"{part.key}: not a {reg.protocol.__name__}"
        has_state = hasattr(part.obj, "state_dict") and hasattr(part.obj, "load_state_dict")
        assert part.entry.stateful == has_state, f"{part.key}: stateful={part.entry.stateful} but state_dict {has_state}"
        assert part.entry.reports == hasattr(part.obj, "metrics"), f"{part.key}: reports={part.entry.reports}"
    for bound, kind in [(p.advantage, "advantage"), *[(t, "advantage transform") for t in p.advantage_transforms],
                        *[(c, "credit") for c in p.credit], *[(t.fn, "loss") for t in p.learner.terms]]:
        assert isinstance(bound, KINDS[kind].protocol)
    assert isinstance(p.generator.inner, KINDS["generator"].protocol)
