"""Method bundles (``config/methods.py``): ``method: <name>`` loads as the method's members written out in their
own keys, and every way to get it wrong is one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from groupwise.config import diff, load, to_dict
from groupwise.config.methods import slot_paths
from groupwise.config.parse import registry
from groupwise.registry import ConfigError, bundles

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def fields(kind: str, name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(registry(kind).get(name).config) if f.init}


def test_a_bundle_is_what_one_room_registers_under_one_name_in_several_kinds():
    found = bundles()
    assert set(found["distil"]) == {"group transform", "credit", "loss"}
    assert set(found["paft"]) == {"advantage", "loss"}
    for name, kinds in found.items():
        assert len(kinds) >= 2
        assert len({module.split(".")[2] for module in kinds.values()}) == 1, name  # one room
        assert all(registry(kind).get(name).origin == module for kind, module in kinds.items())
    assert "random" not in found  # a selector (standard) and a replay buffer (hdr's room): two rooms, no bundle
    assert "grpo" not in found


def test_no_two_members_of_a_bundle_share_a_knob():
    # each knob of `method:` then goes to exactly one member; a shared one would go to both (never seen yet)
    for name, kinds in bundles().items():
        seen: dict[str, str] = {}
        for kind in kinds:
            for f in fields(kind, name):
                assert f not in seen, f"{name}: {f} in {seen.get(f)} and {kind}"
                seen[f] = kind


def written_as_bundle(recipe: Path, name: str, tmp_path: Path) -> Path:
    """``recipe`` with the members of bundle ``name`` taken out of their keys and named once under ``method``."""
    raw = yaml.safe_load(recipe.read_text())
    knobs: dict = {}
    for kind in bundles()[name]:
        path, many, _ = slot_paths()[kind]
        parent = raw
        for key in path[:-1]:
            parent = parent.setdefault(key, {})
        if many:
            entries = parent.get(path[-1], [])
            mine = [e for e in entries if (e if isinstance(e, str) else e["name"]) == name]
            assert len(mine) == 1, (recipe, kind)
            parent[path[-1]] = [e for e in entries if e is not mine[0]]  # spelled, maybe empty: appended to
            entry = mine[0]
        else:
            entry = parent.pop(path[-1])
        knobs |= {} if isinstance(entry, str) else {k: v for k, v in entry.items() if k != "name"}
    raw["method"] = {"name": name, **knobs}
    out = tmp_path / f"{name}_bundle.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


@pytest.mark.parametrize("name", ["dash_drift", "distil", "graphpo", "paft", "rlcsd", "rredcot"])
def test_a_bundle_loads_as_its_members_written_out(name, tmp_path):
    recipe = RECIPES / f"{name}_lab.yaml"
    bundled = written_as_bundle(recipe, name, tmp_path)
    assert "method" in yaml.safe_load(bundled.read_text())
    assert diff(load(recipe), load(bundled)) == []


def test_a_bundle_appends_to_lists_and_keeps_the_recipes_entries():
    cfg = load(None, ["method={name: distil, support: vocab, cost: ce}", "teacher=frozen",
                      "credit=[{name: rredcot, mode: rudder}]", "rollout.transforms=[rredcot]"])
    out = to_dict(cfg)
    assert [t["name"] for t in out["rollout"]["transforms"]] == ["rredcot", "distil"]
    assert [c["name"] for c in out["credit"]] == ["rredcot", "distil"]
    assert [t["name"] for t in out["loss"]["terms"]] == ["ppo_clip", "distil"]  # distil's loss is no policy gradient
    assert out["loss"]["terms"][1]["support"] == "vocab" and out["rollout"]["transforms"][1]["cost"] == "ce"


def test_a_policy_gradient_of_the_method_replaces_the_default_ppo_clip_only():
    assert [t["name"] for t in to_dict(load(None, ["method=paft"]))["loss"]["terms"]] == ["paft"]
    spelled = to_dict(load(None, ["method=paft", "loss.terms=[ppo_clip, {name: kl, weight: 0.0}]"]))
    assert [t["name"] for t in spelled["loss"]["terms"]] == ["ppo_clip", "kl", "paft"]


def test_several_bundles_in_a_list():
    out = to_dict(load(None, ["method=[dash_drift, {name: rredcot, mode: rudder}]"]))
    assert [t["name"] for t in out["rollout"]["transforms"]] == ["dash_drift", "rredcot"]
    assert [c["name"] for c in out["credit"]] == ["dash_drift", "rredcot"]
    assert out["credit"][1]["mode"] == "rudder"


@pytest.mark.parametrize(("recipe", "overrides", "message"), [
    (None, ["method=grpo"], r"override 'method=grpo': method: 'grpo' is not a method bundle; allowed: dash_drift, "),
    (None, ["method={name: dash_drift, tau: 1}"],
     r"method.tau: unknown key for method 'dash_drift' \(group transform, credit\); allowed: alpha_neg, "),
    (None, ["advantage=grpo", "method=paft"],
     r"override 'advantage=grpo': advantage: set here and by method 'paft' \(override 'method=paft'\); allowed: "
     "one of the two"),
    (None, ["credit=[dash_drift]", "method=dash_drift"],
     r"credit.0: 'dash_drift' named here and by method 'dash_drift' \(override 'method=dash_drift'\)"),
    (None, ["method=[rlcsd, 3]"], r"method.1: 3 is not a method bundle"),
    (None, ["method={name: [rlcsd]}"], r"method: \['rlcsd'\] is not a method bundle"),
    (None, ["method={name: dash_drift, eta: -1}"], r"credit.0"),  # the member's own range check, at its new key
])
def test_bad_bundles_are_one_line(recipe, overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        load(recipe, overrides)
    assert "\n" not in str(e.value)


def test_a_recipe_line_is_cited(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("trainer: {steps: 3}\nmethod:\n  name: rlcsd\n  k_maxx: 4\n")
    with pytest.raises(ConfigError, match=rf"^{recipe}:4: method.k_maxx: unknown key for method 'rlcsd'"):
        load(recipe)


def test_list_prints_the_bundles(capsys):
    from groupwise.cli import main

    assert main(["list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("method "))
    assert "distil (group transform, credit, loss)" in line and "paft (" in line
    assert main(["list", "loss"]) == 0
    assert not [x for x in capsys.readouterr().out.splitlines() if x.startswith("method ")]
