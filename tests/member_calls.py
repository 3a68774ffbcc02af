"""A pytest plugin (loaded by conftest.py): which registered members each test calls.

At configure time, before any test module is imported, every built-in member of every registry is imported
and its registered function is replaced, in its module and in its registry entry, by a wrapper that notes the
test that is running and then calls the function itself (behaviour, signature and pickling by name are
unchanged). ``CALLS`` maps ``(kind, name)`` to the test files that called it, through ``Entry.build`` (the
bound partial and factories) or directly. ``tests/test_registry_complete.py`` checks that every member is
called by a unit test (not a text match: a test whose calls were deleted no longer counts), and runs last.
With ``GROUPWISE_MEMBER_LOG=<file>`` the log is written there as JSON when the session ends.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import pytest

CALLS: dict[tuple[str, str], set[str]] = {}
_running = [""]
LAST = "test_every_member_is_called_by_a_unit_test"


def _logged(key: tuple[str, str], fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _running[0]:
            CALLS.setdefault(key, set()).add(_running[0])
        return fn(*args, **kwargs)

    return call


def install() -> None:
    from groupwise.catalog import KINDS

    for kind, reg in KINDS.items():
        for entry in reg.entries():
            if not entry.builtin or hasattr(entry.obj, "__wrapped__"):
                continue
            fn, module = entry.obj, sys.modules[entry.origin]
            wrapper = _logged((kind, entry.name), fn)
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
        Path(out).write_text(json.dumps({f"{k}\t{n}": sorted(v) for (k, n), v in CALLS.items()}))
