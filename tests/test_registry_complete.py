"""Every built-in component: registered in its kind's form, satisfies its kind's Protocol once built, declares
exactly the abilities it has, is called by a unit test (the call log of ``tests/member_calls.py``, not a text
match; a factory's member is used: a method of what it built is called), and is selected by at least one recipe
(which the smoke suite runs)."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import member_calls
import pytest
import torch

from groupwise.catalog import KINDS
from groupwise.config import load
from groupwise.loop.setup import build
from groupwise.types import ScoredBatch

ROOT = Path(__file__).parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
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
def test_has_a_recipe(kind, entry):
    assert entry.name in SELECTED.get(kind, set()), f"{kind} '{entry.name}': no recipe selects it"


def unit_calls(session) -> dict[str, dict[tuple[str, str], set[str]]]:
    """Which unit test files called each member (``calls``) and used what a factory built (``uses``): this
    session's logs when it ran every unit test file before this test (``member_calls`` runs it last), else a run
    of tests/unit in a subprocess that writes its logs."""
    unit = {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "unit").rglob("test_*.py")}
    ran = {i.nodeid.split("::", 1)[0] for i in session.items}
    if unit <= ran and not session.config.option.keyword:
        return {"calls": member_calls.CALLS, "uses": member_calls.USES}
    log = ROOT / "tests" / ".member_calls.json"
    env = {**os.environ, "GROUPWISE_MEMBER_LOG": str(log)}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "tests/unit"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    logs = {name: {tuple(k.split("\t")): set(v) for k, v in log_.items()}
            for name, log_ in json.loads(log.read_text()).items()}
    log.unlink()
    return logs


BUILT_NOT_USED = {"generator 'vllm'"}
"""Factory members whose built object no unit test uses yet (measured when the use log came in, issue 49; the vLLM
generator's ``generate`` needs an engine: the vLLM lane runs it, tests/vllm_lane). The list may only shrink: a
member that gets a unit test that uses it must leave it (the test below fails on a stale name)."""


def uncalled(logs: dict[str, dict[tuple[str, str], set[str]]]) -> set[str]:
    """The members no unit test calls (a factory's member: uses), as ``kind 'name'``."""
    nothing = {("teacher", "none")}  # builds None: there is nothing to use
    out = set()
    for kind, e in BUILTIN:
        used = e.form == "factory" and (kind, e.name) not in nothing
        if not any(f.startswith("tests/unit/") for f in logs["uses" if used else "calls"].get((kind, e.name), ())):
            out.add(f"{kind} '{e.name}'")
    return out


def test_every_member_is_called_by_a_unit_test(request):
    """A function member is called; a factory's member is used: a unit test calls a method of what it built (its
    kind's Protocol: ``score``, ``__call__``, ``sample``, ``next``, ...), since building alone runs none of its
    behaviour. A member that builds nothing (teacher ``none``) is called."""
    missing = uncalled(unit_calls(request.session))
    assert not missing - BUILT_NOT_USED, f"no unit test calls them (tests/unit): {sorted(missing - BUILT_NOT_USED)}"
    assert not BUILT_NOT_USED - missing, f"used now, take them off BUILT_NOT_USED: {sorted(BUILT_NOT_USED - missing)}"


def test_the_call_log_sees_a_call_and_only_a_call():
    from groupwise.advantages import ADVANTAGES

    key, before = ("advantage", "rloo"), set(member_calls.CALLS.get(("advantage", "rloo"), ()))
    member_calls.CALLS.pop(key, None)
    ADVANTAGES.get("rloo")  # looked up and named: not a call
    assert key not in member_calls.CALLS
    fn = ADVANTAGES.get("rloo").build(ADVANTAGES.get("rloo").config())
    assert key not in member_calls.CALLS  # built but not called
    r = torch.tensor([[1.0, 0.0, 1.0]])
    fn(ScoredBatch([], r, r.bool(), torch.zeros_like(r), torch.ones_like(r, dtype=torch.bool)))
    assert member_calls.CALLS[key] == {"tests/test_registry_complete.py"}
    member_calls.CALLS[key] = before | member_calls.CALLS[key]


def test_the_use_log_sees_a_use_and_not_a_build():
    from groupwise.select import SELECTORS
    from groupwise.standard.lab import Lab, LabConfig

    key, before = ("selector", "random"), set(member_calls.USES.get(("selector", "random"), ()))
    member_calls.USES.pop(key, None)
    entry = SELECTORS.get("random")
    env = types.SimpleNamespace(task=Lab(LabConfig(), seed=0), seed=0, run=None)
    selector = entry.build(entry.config(), env)
    assert key not in member_calls.USES  # built: not a use
    selector.next(0, 2, None)
    assert member_calls.USES[key] == {"tests/test_registry_complete.py"}
    member_calls.USES[key] = before | member_calls.USES[key]


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
        assert part.entry.stateful == has_state, \
            f"{part.key}: stateful={part.entry.stateful} but state_dict {has_state}"
        assert part.entry.reports == hasattr(part.obj, "metrics"), f"{part.key}: reports={part.entry.reports}"
    for bound, kind in [(p.advantage, "advantage"), *[(t, "advantage transform") for t in p.advantage_transforms],
                        *[(c, "credit") for c in p.credit], *[(t.fn, "loss") for t in p.learner.terms]]:
        assert isinstance(bound, KINDS[kind].protocol)
    assert isinstance(p.generator.inner, KINDS["generator"].protocol)
