"""Users' own code: Python files or modules imported before a run is built, and installed entry points.

A reference is a file path (``my_components.py``, relative to the working directory) or an importable module
(``my_pkg.components``); with ``:name`` it names an attribute (``my_rewards.py:score``). Importing a plugin
runs its ``@REGISTRY.register(...)`` decorators, so its components register exactly like built-ins and
appear in ``groupwise list``. A file is imported once per process under a stable module name (a second
reference to the same file reuses the module, so nothing registers twice).

Installed packages register through the entry-point group ``groupwise.plugins`` (pyproject:
``[project.entry-points."groupwise.plugins"] my_pkg = "my_pkg.components"``); every entry point of the group
is imported the first time the catalogue of components is used.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from groupwise.registry import ConfigError

ENTRY_POINT_GROUP = "groupwise.plugins"
_loaded_entry_points = False


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
