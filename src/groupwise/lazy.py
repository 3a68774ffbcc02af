"""``torch``, imported on first use: ``from groupwise.lazy import torch`` in a module that needs torch only when
its functions run (what Python 3.15 spells ``lazy import torch``, PEP 810).

So the commands that only read recipes (``groupwise config``, ``groupwise list``) import the members a recipe
names, for their config classes and declared abilities, without paying for torch (~3 s of a 3.1 s command before):
torch's own code runs the first time an attribute of it is read (``torch.zeros``), which a run does as it builds
its model. ``tests/test_front_door.py`` pins what those commands import. A name needed when a module is executed
(a base class ``torch.nn.Module``, a decorator ``@torch.no_grad()``) loads torch there: such modules are built
at run time only (the loop, the models, the engines' insides). Annotations name ``Tensor`` under
``TYPE_CHECKING`` (every module has ``from __future__ import annotations``).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any


def lazy(name: str) -> types.ModuleType:
    """The top-level module ``name``: itself when already imported, else a module whose code runs on first
    attribute access (``importlib.util.LazyLoader``; the same object in ``sys.modules`` afterwards)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"No module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


torch = lazy("torch")


def no_grad(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``@torch.no_grad()`` for a function that is defined before torch is loaded: each call runs under
    ``torch.no_grad()``."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return fn(*args, **kwargs)

    return call
