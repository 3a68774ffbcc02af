"""The commands that only read recipes import no torch and no transformers, and exactly the modules pinned here:
``groupwise list`` the stage interfaces (members are named from the source, ``registry.source_index``),
``groupwise config RECIPE`` those and the members the recipe names, for their config classes
(docs/architecture.md, "The front door"). Each runs in a fresh interpreter, as a user's command does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import contextlib, io, json, sys
from groupwise.cli import main
for argv in {argvs!r}:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv
heavy = [m for m in ("torch._C", "transformers") if m in sys.modules]
print(json.dumps({{"heavy": heavy, "modules": sorted(m for m in sys.modules if m.startswith("groupwise"))}}))
"""

INTERFACES = ["groupwise", "groupwise.adapters", "groupwise.advantages", "groupwise.catalog", "groupwise.cli",
              "groupwise.credit", "groupwise.drivers", "groupwise.errors", "groupwise.filter", "groupwise.lazy",
              "groupwise.log", "groupwise.losses", "groupwise.models", "groupwise.models.sources",
              "groupwise.plugins", "groupwise.registry", "groupwise.replay", "groupwise.rewards",
              "groupwise.rollout", "groupwise.rollout.base", "groupwise.select", "groupwise.tasks",
              "groupwise.tasks.base", "groupwise.teachers", "groupwise.tempdirs", "groupwise.types"]
"""What ``groupwise list`` imports: the catalogue, the stage interfaces and the base modules they stand on."""

GRPO_LAB = ["groupwise.advantages.stats", "groupwise.config", "groupwise.config.check", "groupwise.config.load",
            "groupwise.config.parse", "groupwise.config.schema", "groupwise.loop", "groupwise.loop.single",
            "groupwise.losses.reduce", "groupwise.models.forward", "groupwise.seeding", "groupwise.standard",
            "groupwise.standard.builder", "groupwise.standard.filters", "groupwise.standard.fused",
            "groupwise.standard.grpo", "groupwise.standard.hf", "groupwise.standard.lab", "groupwise.standard.none",
            "groupwise.standard.ppo_clip", "groupwise.standard.random_selector", "groupwise.standard.rewards"]
"""What ``groupwise config recipes/grpo_lab.yaml`` adds: the config package and the default members (each
with the helpers its module imports: the members are not split into a config half and a code half)."""


def run(*argvs: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN.format(argvs=[list(a) for a in argvs])], capture_output=True,
                         text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_list_imports_the_interfaces_only():
    got = run(["list"], ["list", "loss"])
    assert got == {"heavy": [], "modules": INTERFACES}


def test_config_imports_the_schema_and_the_named_members_only():
    got = run(["config", "recipes/grpo_lab.yaml"])
    assert got == {"heavy": [], "modules": sorted(INTERFACES + GRPO_LAB)}


def test_no_recipe_needs_torch_to_be_read():
    """Every recipe of the repository, and the support matrix (which imports every member)."""
    got = run(*(["config", str(r.relative_to(ROOT))] for r in sorted((ROOT / "recipes").glob("*.yaml"))),
              ["list", "--support"])
    assert got["heavy"] == []


def test_the_check_can_fail():
    """A command that loads a model does import them (so the probe sees an import)."""
    code = RUN.format(argvs=[]).replace("heavy = [", "import groupwise.lazy; groupwise.lazy.torch.zeros(1)\nheavy = [")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}, check=True)
    assert "torch._C" in json.loads(out.stdout.splitlines()[-1])["heavy"]
