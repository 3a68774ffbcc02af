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

STAGES = ("advantages", "credit", "drivers", "filter", "losses", "replay", "rewards", "rollout", "select", "tasks",
          "teachers")
"""The stage packages: each holds its kind's interface (Protocol, registry, output contract) and the helpers its
members share, and no member."""


def room(name: str) -> str:
    """A method's room (``groupwise.methods.<method>``, a module or a package), ``groupwise.standard``, or ""."""
    parts = name.split(".")
    if parts[1:2] == ["methods"] and len(parts) > 2:
        return ".".join(parts[:3])
    return "groupwise.standard" if parts[1:2] == ["standard"] and len(parts) > 2 else ""


def driver_rooms() -> tuple[str, ...]:
    """The rooms that register a driver (they run the loop: two players, a federation), read from the source: the
    drivers layer, whole. The ``single`` driver is the loop's own (``loop/single.py``)."""
    from groupwise.registry import source_index

    rooms = sorted({room(m).removeprefix("groupwise.") for m in source_index().get("driver", {}).values()} - {""})
    return tuple(p for r in rooms for p in (r, f"{r}.*"))


LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # bottom first; a module may import modules of its own layer (without a cycle) and of the layers below
    ("base", ("types", "errors", "registry", "isolation", "log", "seeding", "parallel", "plugins", "adapters",
              "lazy", "tempdirs")),
    ("interfaces", (*STAGES, *(f"{s}.*" for s in STAGES))),
    ("catalog", ("catalog",)),
    ("schema", ("config", "config.*")),
    ("components", ("*",)),
    ("loop", ("loop",)),
    ("drivers", driver_rooms()),
    ("api", ("api", "cli", "report", "plot", "inspect_report")),
]
"""Module names relative to ``groupwise``: ``x`` is the module or package ``x`` itself (a package's
``__init__``), ``x.*`` its submodules; ``loop`` also covers ``loop.*``. ``*`` is every module not named
elsewhere: the methods (``methods.*``) and the standard components (``standard.*``), the models, evaluation, the
update and checkpoints. The drivers are the rooms of the methods that register a driver (``driver_rooms``)."""


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
    assert layer("groupwise.standard.hf") == layer("groupwise.update") == 4
    assert layer("groupwise.methods.agon") > layer("groupwise.loop.setup") > layer("groupwise.standard.hf")
    assert layer("groupwise.drivers") == layer("groupwise.rollout") == layer("groupwise.losses.reduce")  # interfaces
    assert layer("groupwise.methods.fgrpo.federated") == layer("groupwise.methods.agon") == 6
    assert {"methods.agon", "methods.fgrpo", "methods.fgrpo.*"} <= set(driver_rooms())  # a new driver method: more


def test_stage_packages_hold_no_member():
    """A member lives in its method's room (``methods.*``), among the standard components (``standard.*``) or, for
    the ``single`` driver, in the loop it runs: never in a stage package, which holds the interface."""
    from groupwise.registry import source_index

    rooms = {m for members in source_index().values() for m in members.values()}
    assert rooms and not [m for m in rooms if m.split(".")[1] in STAGES]
    assert {m.split(".")[1] for m in rooms} == {"methods", "standard", "loop"}


def test_a_room_imports_no_other_room():
    """A method's members import the stage interfaces and what sits below, never another method's room nor a standard
    component: what two share moves down into an interface."""
    g = graph()
    bad = [f"{a} imports {b}" for a in sorted(g) for b in sorted(g[a]) if room(a) and room(b) and room(a) != room(b)]
    assert bad == []
    assert room("groupwise.methods.hdr.store") == room("groupwise.methods.hdr") != room("groupwise.methods.dre")
    assert room("groupwise.methods") == room("groupwise.rollout.base") == ""


def test_the_source_index_is_what_importing_every_module_registers():
    from groupwise import catalog
    from groupwise.registry import source_index

    for name in sorted(modules()):
        if name not in ("groupwise.methods.fgrpo.flower_app",):  # needs flwr; it registers nothing
            importlib.import_module(name)
    registered = {kind: {e.name: e.origin for e in reg._entries.values() if e.builtin}
                  for kind, reg in catalog.KINDS.items()}
    assert {k: v for k, v in registered.items() if v} == source_index()


def test_loading_a_recipe_imports_the_members_it_names_and_not_the_loop():
    code = ("import sys; from groupwise.config import load; load('recipes/grpo_lab.yaml'); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('groupwise'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=SRC.parent, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}).stdout.split()
    assert "groupwise.standard.grpo" in out and "groupwise.standard.ppo_clip" in out
    assert not [m for m in out if m.startswith(("groupwise.loop.", "groupwise.methods", "groupwise.update",
                                                "groupwise.standard.teachers")) and m != "groupwise.loop.single"]
    assert len(out) <= 44, out  # 91 of 97 before the registries found their members lazily, 42 before the members
    # left the stage packages (the packages standard and loop are two more, their docstrings only, and adapters.py
    # one, what was models/__init__.py; the two none members one module fewer); the exact set of the command (cli
    # included) is pinned in tests/test_front_door.py
