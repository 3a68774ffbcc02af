"""Raw recipe values into typed config objects: ``Spec`` (a selected component), the coercion of every value to
its field's annotation, and the one-line errors that name the file:line or override, the key and what is
allowed. The registries are consulted only to find each component's config class. ``load.py`` (YAML, overrides)
and ``schema.py`` (a slot's default) build through the public names here: ``Lines``, ``build_section``,
``build_spec``, ``fail``, ``dotted_path``, ``WEIGHTED``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from groupwise.registry import ConfigError, Registry

WEIGHTED = {"reward", "loss"}

INFINITE = "infinite"
"""Field metadata of a float knob whose documented meaning includes an infinity (``tau: .inf`` = no gate,
``token_clip: .inf`` = no clip): ``dataclasses.field(default=..., metadata={"infinite": True})``. Every other
float knob must be finite: ``.nan`` / ``.inf`` fail at load."""


def registry(kind: str) -> Registry[Any]:
    from groupwise.catalog import registry as lookup  # the catalogue imports every stage package

    return lookup(kind)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A selected component: its kind, registered name, validated config, and (for terms) its weight; ``entry``, its
    registry entry (the member, its config class and declared abilities), is resolved once, when the spec is made
    (also by ``dataclasses.replace``), and read by everything after: the load checks, the build, the drivers."""

    kind: str
    name: str
    cfg: Any = None
    weight: float = 1.0
    entry: Any = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entry", registry(self.kind).get(self.name))

    def build(self, env: Any = None) -> Any:
        """The bound component: its entry's ``Entry.build`` (a factory's ``factory(cfg, env)``, a function's config
        bound), the one way every component of every kind is made."""
        return self.entry.build(self.cfg, env)


class Lines:
    """Where each key path came from, for error messages."""

    def __init__(self) -> None:
        self.at: dict[tuple[str, ...], str] = {}

    def where(self, path: tuple[str, ...]) -> str:
        while path:
            if path in self.at:
                return self.at[path]
            path = path[:-1]
        return self.at.get((), "")



def dotted_path(path: tuple[str, ...]) -> str:
    return ".".join(path) or "<root>"


def fail(lines: Lines, path: tuple[str, ...], msg: str,
          at: tuple[str, ...] | None = None) -> typing.NoReturn:
    """Raise ``<file:line or override of at (default path)>: <path>: msg``."""
    where = lines.where(path if at is None else at)
    raise ConfigError(f"{where + ': ' if where else ''}{dotted_path(path)}: {msg}")


def _blame(path: tuple[str, ...], raw: Mapping[str, Any], msg: str) -> tuple[str, ...]:
    """The key a ``__post_init__`` message is about: the first of ``raw``'s keys it names, else the section
    (so a range error from an override cites the override, not the recipe line of the section)."""
    named = [(m.start(), k) for k in raw if (m := re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", msg))]
    return (*path, min(named)[1]) if named else path


def _infinite_ok(cls: type, name: str, value: Any) -> bool:
    """``value`` is an infinity and ``cls.name`` is a documented infinite knob (its field's ``INFINITE``)."""
    if not next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get(INFINITE):
        return False
    try:
        return not isinstance(value, bool) and math.isinf(float(value))
    except (TypeError, ValueError):
        return False


def build_section(cls: type, raw: Any, path: tuple[str, ...], lines: Lines) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    if not isinstance(raw, dict):
        fail(lines, path, f"expected a mapping of {{{', '.join(fields)}}}, got {raw!r}{_hint(cls, raw, path)}")
    unknown = [k for k in raw if k not in fields]
    if unknown:
        fail(lines, (*path, unknown[0]), f"unknown key; allowed: {', '.join(sorted(fields)) or '(none)'}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        sub = (*path, name)
        kind = f.metadata.get("kind")
        if kind and f.metadata.get("many"):
            if not isinstance(raw[name], list):
                fail(lines, sub, f"expected a list of {kind} entries")
            kwargs[name] = tuple(build_spec(kind, r, (*sub, str(i)), lines) for i, r in enumerate(raw[name]))
        elif kind:
            value = raw[name]
            if isinstance(value, dict) and "name" not in value:  # refine the default component's knobs
                value = {"name": f.metadata["default"], **value}
            kwargs[name] = build_spec(kind, value, sub, lines)
        elif _infinite_ok(cls, name, raw[name]):
            kwargs[name] = float(raw[name])
        else:
            kwargs[name] = _coerce(raw[name], hints[name], sub, lines)
    try:
        return cls(**kwargs)
    except ValueError as e:
        if not path:  # a top-level field: its message already names it
            where = lines.where(_blame(path, raw, str(e)))
            raise ConfigError(f"{where + ': ' if where else ''}{e}") from None
        fail(lines, path, str(e), at=_blame(path, raw, str(e)))


def _hint(cls: type, raw: Any, path: tuple[str, ...]) -> str:
    """'; did you mean a.b.mode=x?' where ``raw`` is one of the choices of exactly one field (a section given
    its mode as a scalar), else ''."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init and typing.get_origin(hints[f.name]) is Literal
             and raw in typing.get_args(hints[f.name])]
    return f"; did you mean {dotted_path((*path, names[0]))}={raw}?" if len(names) == 1 else ""


def build_spec(kind: str, raw: Any, path: tuple[str, ...] | str, lines: Lines | dict) -> Spec:
    if isinstance(path, str):  # a default from the schema
        path, lines = (), Lines()
    assert isinstance(lines, Lines)
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        fail(lines, path, f"a {kind} entry needs 'name' (one of: {', '.join(registry(kind).names())})")
    raw = dict(raw)
    name = raw.pop("name")
    weight = 1.0
    if kind in WEIGHTED and "weight" in raw:
        weight = _coerce(raw.pop("weight"), float, (*path, "weight"), lines)
    where = lines.where((*path, "name"))
    try:
        entry = registry(kind).get(name)
    except ConfigError as e:
        raise ConfigError(f"{where + ': ' if where else ''}{dotted_path(path)}: {e}") from None
    cfg = build_section(entry.config, raw, path, lines)
    return Spec(kind, name, cfg, weight)  # its entry is the one looked up here (the registry's)


def _coerce(value: Any, tp: Any, path: tuple[str, ...], lines: Lines) -> Any:
    """``value`` checked against (and converted to) the annotation ``tp``; a mismatch is a one-line error."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(tp), tp, path, lines)
    if origin is Literal:
        if value not in typing.get_args(tp):
            fail(lines, path, f"{value!r} is not allowed; allowed: {', '.join(map(str, typing.get_args(tp)))}")
        return value
    if origin is tuple:
        return _coerce_tuple(value, typing.get_args(tp), path, lines)
    if origin is dict:
        if not isinstance(value, dict):
            fail(lines, path, f"expected a mapping, got {value!r}")
        return {str(k): _coerce(v, typing.get_args(tp)[1], (*path, str(k)), lines) for k, v in value.items()}
    if tp in _SCALARS:
        return _SCALARS[tp](value, path, lines)
    if dataclasses.is_dataclass(tp):
        return build_section(tp, value, path, lines)
    raise TypeError(f"config type {tp!r} at {dotted_path(path)} is not supported")


def _coerce_union(value: Any, args: tuple[Any, ...], tp: Any, path: tuple[str, ...], lines: Lines) -> Any:
    if value is None and type(None) in args:
        return None
    real = [a for a in args if a is not type(None)]
    if len(real) == 1:  # ``X | None``: X's own error names the key and what is allowed
        return _coerce(value, real[0], path, lines)
    for a in args:
        if a is type(None):
            continue
        try:
            return _coerce(value, a, path, lines)
        except ConfigError:
            pass
    fail(lines, path, f"{value!r} is not a valid {tp}")


def _coerce_tuple(value: Any, args: tuple[Any, ...], path: tuple[str, ...], lines: Lines) -> tuple[Any, ...]:
    if isinstance(value, str | int | float):
        value = [value]
    if not isinstance(value, list | tuple):
        fail(lines, path, f"expected a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_coerce(v, args[0], (*path, str(i)), lines) for i, v in enumerate(value))
    if len(value) != len(args):
        fail(lines, path, f"expected {len(args)} items, got {len(value)}")
    return tuple(_coerce(v, a, (*path, str(i)), lines) for i, (v, a) in enumerate(zip(value, args)))


def _coerce_bool(value: Any, path: tuple[str, ...], lines: Lines) -> bool:
    if isinstance(value, bool):
        return value
    fail(lines, path, f"expected true or false, got {value!r}")


def _coerce_int(value: Any, path: tuple[str, ...], lines: Lines) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(float(value)) if float(value).is_integer() else int(value)
        except ValueError:
            pass
    fail(lines, path, f"expected an integer, got {value!r}")


def _coerce_float(value: Any, path: tuple[str, ...], lines: Lines) -> float:
    """A finite float (``.nan`` / ``.inf`` fail: they pass range checks such as ``lr > 0`` and poison the run;
    the ``INFINITE`` knobs never reach here with an infinity)."""
    out = None
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        with contextlib.suppress(ValueError, OverflowError):  # OverflowError: an integer beyond float range
            out = float(value)
    if out is None:
        fail(lines, path, f"expected a number, got {value!r}")
    if not math.isfinite(out):
        fail(lines, path, f"{value!r} is not allowed; allowed: a finite number")
    return out


def _coerce_str(value: Any, path: tuple[str, ...], lines: Lines) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    fail(lines, path, f"expected a string, got {value!r}")


_SCALARS = {bool: _coerce_bool, int: _coerce_int, float: _coerce_float, str: _coerce_str}


