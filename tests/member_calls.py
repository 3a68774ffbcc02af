"""A pytest plugin (loaded by conftest.py): which registered members each test calls.

At configure time, before any test module is imported, every built-in member of every registry is imported
and its registered function is replaced, in its module and in its registry entry, by a wrapper that notes the
test that is running and then calls the function itself (behaviour, signature and pickling by name are
unchanged). ``CALLS`` maps ``(kind, name)`` to the test files that called it, through ``Entry.build`` (the
bound partial and factories) or directly. For a factory, building is not using: what a factory builds is watched
too, and ``USES`` maps ``(kind, name)`` to the test files that called one of the built object's own methods (its
kind's Protocol: ``score``, ``__call__``, ``sample``, ``next``, ...; a built function, its call). The methods are
wrapped on the object's class, once, and note a call on an object a member built (by id, checked through a weak
reference where the object takes one), or on any object of the class a factory's return annotation names when
that class is the product of one member only (a unit test may construct ``Lab(...)`` itself; the three teachers
that all build ``ModelTeacher`` count only through what each built). ``tests/test_registry_complete.py`` checks
that every member is called (a factory-built one: used) by a unit test (not a text match: a test whose calls were
deleted no longer counts), and runs last. With ``GROUPWISE_MEMBER_LOG=<file>`` both logs are written there as JSON
when the session ends.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import types
import typing
import weakref
from pathlib import Path

import pytest

CALLS: dict[tuple[str, str], set[str]] = {}
USES: dict[tuple[str, str], set[str]] = {}
_running = [""]
_BUILT: dict[int, tuple[tuple[str, str], object]] = {}  # id(object) -> (member, a weak reference or None)
_MADE_BY: dict[type, set[tuple[str, str]]] = {}  # a class named by factories' return annotations -> those members
LAST = "test_every_member_is_called_by_a_unit_test"


def _logged(key: tuple[str, str], fn, log: dict[tuple[str, str], set[str]] = CALLS):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _running[0]:
            log.setdefault(key, set()).add(_running[0])
        return fn(*args, **kwargs)

    return call


def methods(protocol: type) -> list[str]:
    """The methods a kind's Protocol declares (``__call__`` included; attributes and properties are not)."""
    return [n for n, v in vars(protocol).items() if isinstance(v, types.FunctionType)
            and (not n.startswith("_") or n == "__call__")]


def _note_use(self) -> None:
    if not _running[0]:
        return
    found = _BUILT.get(id(self))
    if found is not None and (found[1] is None or found[1]() is self):
        USES.setdefault(found[0], set()).add(_running[0])
        return
    makers = next((_MADE_BY[c] for c in type(self).__mro__ if c in _MADE_BY), set())
    if len(makers) == 1:
        USES.setdefault(next(iter(makers)), set()).add(_running[0])


def _watched(fn):
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        _note_use(self)
        return fn(self, *args, **kwargs)

    method.watched = True
    return method


def _watch(key: tuple[str, str], names: list[str], obj):
    """``obj`` (what member ``key``'s factory built), its methods ``names`` watched; a built function is returned
    wrapped (its calls are its uses)."""
    if obj is None:
        return obj
    if isinstance(obj, types.FunctionType | functools.partial):
        return _logged(key, obj, USES)
    _watch_class(type(obj), names)
    try:
        ref = weakref.ref(obj)
    except TypeError:
        ref = None
    _BUILT[id(obj)] = (key, ref)
    return obj


def _watch_class(cls: type, names: list[str]) -> None:
    for name in names:
        fn = next((c.__dict__[name] for c in cls.__mro__ if name in c.__dict__), None)
        if isinstance(fn, types.FunctionType) and not getattr(fn, "watched", False):
            setattr(cls, name, _watched(fn))


def _product(fn) -> type | None:
    """The class a factory's return annotation names (None: a Protocol, a function, or no annotation)."""
    try:
        out = typing.get_type_hints(fn).get("return")
    except Exception:  # a name only imported under TYPE_CHECKING
        return None
    plain = isinstance(out, type) and out is not type(None) and not getattr(out, "_is_protocol", False)
    return out if plain else None


def _factory_logged(key: tuple[str, str], fn, names: list[str]):
    called = _logged(key, fn)

    @functools.wraps(fn)
    def build(*args, **kwargs):
        return _watch(key, names, called(*args, **kwargs))

    return build


def install() -> None:
    from groupwise.catalog import KINDS

    for kind, reg in KINDS.items():
        for entry in reg.entries():
            if not entry.builtin or hasattr(entry.obj, "__wrapped__"):
                continue
            fn, module = entry.obj, sys.modules[entry.origin]
            product = _product(fn) if entry.form == "factory" else None
            if product is not None:
                _MADE_BY.setdefault(product, set()).add((kind, entry.name))
                _watch_class(product, methods(reg.protocol))
            wrapper = (_factory_logged((kind, entry.name), fn, methods(reg.protocol)) if entry.form == "factory"
                       else _logged((kind, entry.name), fn))
            object.__setattr__(entry, "obj", wrapper)  # Entry is frozen: its build now goes through the wrapper
            if getattr(module, fn.__name__, None) is fn:
                setattr(module, fn.__name__, wrapper)


def pytest_configure(config) -> None:
    install()


def pytest_runtest_logstart(nodeid: str, location) -> None:
    _running[0] = nodeid.split("::", 1)[0]


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    _running[0] = ""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    last = [i for i in items if i.name == LAST]
    items[:] = [i for i in items if i.name != LAST] + last


def pytest_sessionfinish(session, exitstatus) -> None:
    out = os.environ.get("GROUPWISE_MEMBER_LOG")
    if out:
        Path(out).write_text(json.dumps({log: {f"{k}\t{n}": sorted(v) for (k, n), v in calls.items()}
                                         for log, calls in (("calls", CALLS), ("uses", USES))}))
