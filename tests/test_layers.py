"""The import graph, computed from the source (every ``import`` counts, function-local ones included): no
cycle, and no module imports a layer above its own (the picture in docs/architecture.md, "Layers").

Registry members are imported by name (``registry.source_index``), not by an import statement, so the stage
interfaces never import their members; ``source_index`` is pinned here against what importing every module
registers. The root package ``groupwise`` (the façade whose ``__getattr__`` reaches ``api``) is implicit in
every ``groupwise.*`` import and is not a node.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "groupwise"

STAGES = ("advantages", "credit", "drivers", "losses", "replay", "rewards", "rollout", "select", "tasks",
          "teachers")

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # bottom first; a module may import modules of its own layer (without a cycle) and of the layers below
    ("base", ("types", "errors", "registry", "isolation", "log", "seeding", "parallel", "plugins", "models", "lazy")),
    ("interfaces", (*STAGES, "filter", "rollout.base", "tasks.base")),
    ("catalog", ("catalog",)),
    ("schema", ("config", "config.*")),
    ("components", ("*",)),
    ("loop", ("loop",)),
    ("drivers", ("drivers.*",)),
    ("api", ("api", "cli", "report", "plot", "inspect_report")),
]
"""Module names relative to ``groupwise``: ``x`` is the module or package ``x`` itself (a package's
``__init__``), ``x.*`` its submodules; ``loop`` also covers ``loop.*``. ``*`` is every module not named
elsewhere: the members of the stages, the models, evaluation, the update and checkpoints."""


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The groupwise modules ``name`` imports anywhere in its file (and their parent packages)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    out = set()
    for mod in found:
        parts = mod.split(".")
        out |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}  # a module imports its parents
    return {m for m in out if m in known and m != name and name.startswith(m + ".") is False}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {n: imports(n, p, known) for n, p in known.items() if n != "groupwise"}


def layer(name: str) -> int:
    rel = name.removeprefix("groupwise.")
    best, index = -1, 4
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            hit = (rel == m and not m.endswith("*") or (m.endswith(".*") and rel.startswith(m[:-1]))
                   or (m == "loop" and rel.startswith("loop.")))
            if hit and len(m) > best:
                best, index = len(m), i
    return index


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle():
    assert cycles(graph()) == []


def test_no_module_imports_a_layer_above_its_own():
    g = graph()
    up = [f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})"
          for a in sorted(g) for b in sorted(g[a]) if layer(b) > layer(a)]
    assert up == []


def test_the_checks_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("groupwise.config") > layer("groupwise.catalog") > layer("groupwise.rollout")
    assert layer("groupwise.rollout.hf") == layer("groupwise.update") == 4
    assert layer("groupwise.drivers.agon") > layer("groupwise.loop.setup") > layer("groupwise.rollout.hf")
    assert layer("groupwise.drivers") == layer("groupwise.rollout")  # a registry package: an interface


def test_the_source_index_is_what_importing_every_module_registers():
    from groupwise import catalog
    from groupwise.registry import source_index

    for name in sorted(modules()):
        if name not in ("groupwise.drivers.flower_app",):  # needs flwr; it registers nothing
            importlib.import_module(name)
    registered = {kind: {e.name: e.origin for e in reg._entries.values() if e.builtin}
                  for kind, reg in catalog.KINDS.items()}
    assert {k: v for k, v in registered.items() if v} == source_index()


def test_loading_a_recipe_imports_the_members_it_names_and_not_the_loop():
    code = ("import sys; from groupwise.config import load; load('recipes/grpo_lab.yaml'); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('groupwise'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=SRC.parent, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}).stdout.split()
    assert "groupwise.advantages.grpo" in out and "groupwise.losses.ppo_clip" in out
    assert not [m for m in out if m.startswith(("groupwise.loop", "groupwise.advantages.lampo", "groupwise.update",
                                                "groupwise.drivers.agon", "groupwise.teachers.models"))]
    assert len(out) <= 42, out  # 91 of 97 before the registries found their members lazily; the exact set of the
    # command (cli included) is pinned in tests/test_front_door.py
