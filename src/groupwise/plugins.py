"""Users' own code: Python files or modules imported before a run is built, and installed entry points.

A reference is a file path (``my_components.py``, relative to the working directory) or an importable module
(``my_pkg.components``); with ``:name`` it names an attribute (``my_rewards.py:score``). Importing a plugin
runs its ``@REGISTRY.register(...)`` decorators, so its components register exactly like built-ins and
appear in ``groupwise list``. A file is imported once per process under a stable module name (a second
reference to the same file reuses the module, so nothing registers twice).

Installed packages register through the entry-point group ``groupwise.plugins`` (pyproject:
``[project.entry-points."groupwise.plugins"] my_pkg = "my_pkg.components"``); every entry point of the group
is imported the first time the catalogue of components is used.

A plug-in of a kind whose registry declares an output contract (group builders and transforms, advantages and
their transforms, credit) is built ``guarded``: a raise or a ``sys.exit`` in its own code, or an output that
breaks the contract, stops the run with one ``PluginError`` line naming the plug-in, its file and the
contract, checked once where the core receives the output (the loop itself never checks).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from groupwise.errors import ConfigError

ENTRY_POINT_GROUP = "groupwise.plugins"
_loaded_entry_points = False
_CORE = Path(__file__).resolve().parent  # groupwise's own files: an error raised there is not the plug-in's


class PluginError(ConfigError):
    """Users' code under ``plugins:`` raised, exited or broke its kind's contract (one line; exit code 2)."""


def is_file_ref(ref: str) -> bool:
    return ref.endswith(".py") or "/" in ref or "\\" in ref


def absolute(ref: str) -> str:
    """The reference with its file path made absolute (so a resumed run finds it from any directory)."""
    path, sep, attr = ref.rpartition(":") if ":" in ref else (ref, "", "")
    if is_file_ref(path):
        path = str(Path(path).expanduser().resolve())
    return path + sep + attr


def import_ref(ref: str) -> ModuleType:
    """Import a plugin file or module (once); a missing file or failing import is a one-line ConfigError."""
    if is_file_ref(ref):
        path = Path(ref).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"plugin '{ref}': no such file ({path})")
        name = f"groupwise_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            raise ConfigError(f"plugin '{ref}': importing it failed: {type(e).__name__}: {e}") from e
        return module
    try:
        return importlib.import_module(ref)
    except ImportError as e:
        raise ConfigError(f"plugin '{ref}': not a file and not an importable module ({e})") from e


def load_callable(ref: str) -> Callable[..., Any]:
    """``file.py:name`` or ``package.module:name`` -> the callable it names."""
    if not isinstance(ref, str):
        if callable(ref):
            return ref
        raise ConfigError(f"expected 'file.py:function' or 'module:function', got {ref!r}")
    path, sep, attr = ref.rpartition(":")
    if not sep or not path or not attr:
        raise ConfigError(f"'{ref}': expected 'path/to/file.py:function' or 'package.module:function'")
    obj: Any = import_ref(path)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"'{ref}': {path} has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"'{ref}': {attr} is not callable")
    return obj


def callable_ref(fn: Any) -> str:
    """How a callable is written back into a resolved config: ``module:qualname``."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def load_entry_points() -> None:
    """Import every ``groupwise.plugins`` entry point, once per process."""
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:
            dist = getattr(ep.dist, "name", "?") if ep.dist else "?"
            raise ConfigError(f"entry point '{ep.name} = {ep.value}' (group {ENTRY_POINT_GROUP}, package {dist}) "
                              f"failed to import: {type(e).__name__}: {e}") from e


def guarded(entry: Any, cfg: Any, env: Any) -> Any:
    """``entry`` (a plug-in) built, its failures and contract breaks turned into one ``PluginError`` line."""
    if entry.form == "function":
        def bound(*args: Any) -> Any:
            return _checked(entry, _call(entry, "", entry.obj, *args, cfg=cfg), args)

        return bound
    return Guarded(entry, _call(entry, " while being built", entry.obj, cfg, env))


class Guarded:
    """A factory-built plug-in whose contracted calls are guarded (``__call__``, or the methods its kind's
    contract names); every other attribute is the plug-in's own."""

    def __init__(self, entry: Any, inner: Any):
        self._entry, self._inner = entry, inner
        self._contracts = entry.contract if isinstance(entry.contract, dict) else {"__call__": entry.contract}

    def __call__(self, *args: Any) -> Any:
        return self._guard("__call__", self._inner)(*args)

    def _guard(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        contract = self._contracts.get(name)
        if contract is None:
            return fn

        def guarded_call(*args: Any) -> Any:
            out = _call(self._entry, f" in {name}()" if name != "__call__" else "", fn, *args)
            return _checked(self._entry, out, args, contract, name)

        return guarded_call

    def __getattr__(self, name: str) -> Any:
        if name in ("_entry", "_inner", "_contracts"):  # not set yet (copy / pickle): never recurse
            raise AttributeError(name)
        return self._guard(name, getattr(self._inner, name))


def _call(entry: Any, when: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except (Exception, SystemExit) as e:
        if isinstance(e, ConfigError) or _raised_in_core(e.__traceback__):
            raise  # groupwise's own error (one line, or a bug: its traceback), reached through the plug-in
        if isinstance(e, SystemExit):
            why = f"called sys.exit({e.code!r}){when}; a plug-in returns its result (or raises), never exits"
        else:
            first = (str(e).strip().splitlines() or [""])[0]
            why = f"raised {type(e).__name__}{when}: {first}{_where(entry, e.__traceback__)}"
        raise PluginError(f"{_name(entry)}: {why}") from e


def _checked(entry: Any, out: Any, args: tuple, contract: Callable[..., str] | None = None,
             method: str = "__call__") -> Any:
    broken = (contract or entry.contract)(out, *args)
    if broken:
        raise PluginError(f"{_name(entry)}: {method + '() ' if method != '__call__' else ''}{broken}")
    return out


def _name(entry: Any) -> str:
    module = sys.modules.get(entry.origin)
    return f"{entry.kind} plug-in '{entry.name}' ({getattr(module, '__file__', None) or entry.origin})"


def _frames(tb: TracebackType | None) -> list[tuple[str, int]]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return out[1:]  # the first frame is the guard's own


def _raised_in_core(tb: TracebackType | None) -> bool:
    return any(Path(f).resolve().is_relative_to(_CORE) for f, _ in _frames(tb))


def _where(entry: Any, tb: TracebackType | None) -> str:
    """`` (line N)``: the innermost frame in the plug-in's file, else `` (at file:N)``: the innermost one."""
    frames, own = _frames(tb), getattr(sys.modules.get(entry.origin), "__file__", None)
    mine = [n for f, n in frames if own and f == own]
    if mine:
        return f" (line {mine[-1]})"
    return f" (at {frames[-1][0]}:{frames[-1][1]})" if frames else ""
