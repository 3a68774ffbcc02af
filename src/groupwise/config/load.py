"""Loading: YAML recipes (file:line for every key, duplicate keys refused), dotted overrides, merging, plugins;
and the way back: ``to_dict`` (the resolved config as YAML-able data) and ``diff`` (the keys where two differ)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from groupwise.config.check import check
from groupwise.config.parse import WEIGHTED, Lines, Spec, build_section, dotted_path, fail
from groupwise.config.schema import RunConfig
from groupwise.registry import ConfigError


def _node_to_obj(node: yaml.Node, path: tuple[str, ...], lines: Lines, fname: str) -> Any:
    lines.at[path] = f"{fname}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        first: dict[str, int] = {}
        for k, v in node.value:
            key = str(yaml.safe_load(yaml.serialize(k)))
            if key in first:
                raise ConfigError(f"{fname}:{k.start_mark.line + 1}: {dotted_path((*path, key))}: duplicate key "
                                  f"(first at {fname}:{first[key]}); allowed: each key once")
            first[key] = k.start_mark.line + 1
            lines.at[(*path, key)] = f"{fname}:{k.start_mark.line + 1}"
            out[key] = _node_to_obj(v, (*path, key), lines, fname)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_node_to_obj(v, (*path, str(i)), lines, fname) for i, v in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def _read_yaml(path: Path, lines: Lines) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"recipe {path}: not a file (a directory?); allowed: a YAML file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = e.object.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{e.object[e.start]:02x}); allowed: a UTF-8 "
                          "YAML file") from None
    try:
        node = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if node is None:
        return {}
    obj = _node_to_obj(node, (), lines, str(path))
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}:1: a recipe must be a mapping of sections, got {type(obj).__name__}")
    return obj


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, lines: Lines, origin: str) -> None:
    """Set ``a.b.0.c`` in the raw tree; a list the recipe does not spell out (``loss.terms``) starts from the
    schema's default entries, and every node the override creates is attributed to it (for error lines)."""
    keys = dotted.split(".")
    node: Any = tree
    for i, k in enumerate(keys[:-1]):
        if isinstance(node, list):
            if not k.isdigit() or int(k) >= len(node):
                raise ConfigError(f"{origin}: '{'.'.join(keys[:i + 1])}' indexes a list of {len(node)} items")
            node = node[int(k)]
            continue
        nxt = node.get(k)
        if isinstance(nxt, str):  # `advantage: grpo` shorthand, now being refined
            nxt = node[k] = {"name": nxt}
        if not isinstance(nxt, dict | list):
            default = _schema_list(keys[:i + 1]) if keys[i + 1].isdigit() else None
            nxt = node[k] = {} if default is None else default
            lines.at[tuple(keys[:i + 1])] = origin
        node = nxt
    last = keys[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"{origin}: '{dotted}' indexes a list of {len(node)} items")
        node[int(last)] = value
    else:
        node[last] = value
    lines.at[tuple(keys)] = origin


def _schema_list(keys: list[str]) -> list[Any] | None:
    """The default entries of the schema's list field at ``keys`` (raw, as a recipe would spell them), or None
    if ``keys`` names no list field of the schema (component configs are not walked)."""
    cls: Any = RunConfig
    for k in keys[:-1]:
        cls = typing.get_type_hints(cls).get(k) if dataclasses.is_dataclass(cls) and cls is not Spec else None
    if not dataclasses.is_dataclass(cls) or cls is Spec:
        return None
    f = next((f for f in dataclasses.fields(cls) if f.name == keys[-1]), None)
    if f is None:
        return None
    if f.metadata.get("many"):
        return [dict(r) for r in f.metadata["default"]]
    return list(f.default) if isinstance(f.default, tuple) else None


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; a component slot whose ``name`` changes is replaced, not merged."""
    out = dict(base)
    for k, v in over.items():
        b = out.get(k)
        if isinstance(b, dict) and isinstance(v, dict) and v.get("name", b.get("name")) == b.get("name"):
            out[k] = merge(b, v)
        else:
            out[k] = v
    return out


def load(recipe: str | Path | None = None, overrides: Sequence[str] = (), base: Mapping[str, Any] | None = None,
         final: Mapping[str, Any] | None = None) -> RunConfig:
    """Resolve ``base`` dict <- recipe YAML <- ``key=value`` overrides <- ``final`` dict (the Python API's
    ``reward_funcs``) into a validated RunConfig."""
    lines = Lines()
    tree: dict[str, Any] = dict(base or {})
    if recipe is not None:
        path = Path(recipe)
        if not path.exists():
            raise ConfigError(f"recipe not found: {path}")
        tree = merge(tree, _read_yaml(path, lines))
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override '{ov}': expected key=value, e.g. trainer.steps=3")
        key, _, raw = ov.partition("=")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(tree, key.strip(), value, lines, f"override '{ov}'")
    if final:
        tree = merge(tree, final)
    if "plugins" in tree:
        tree["plugins"] = _import_plugins(tree["plugins"], lines)
    if "method" in tree:  # a method bundle: its members written into their slots
        from groupwise.config.methods import expand

        expand(tree, lines)
    cfg = build_section(RunConfig, tree, (), lines)
    check(cfg)
    _check_out_dir(cfg, lines)
    return cfg


def _import_plugins(raw: Any, lines: Lines) -> list[str]:
    from groupwise import plugins

    refs = [raw] if isinstance(raw, str) else raw
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        fail(lines, ("plugins",), f"expected a list of files or modules, got {raw!r}")
    out = []
    for i, ref in enumerate(refs):
        try:
            plugins.import_ref(ref)
        except ConfigError as e:
            where = lines.where(("plugins", str(i)))
            raise ConfigError(f"{where + ': ' if where else ''}plugins.{i}: {e}") from None
        out.append(plugins.absolute(ref))
    return out


def _check_out_dir(cfg: RunConfig, lines: Lines) -> None:
    """``<out_dir>/<name>`` must be creatable: its nearest existing ancestor (or itself) is a directory."""
    path = cfg.run_dir
    while not path.exists() and path != path.parent:
        path = path.parent
    if path.exists() and not path.is_dir():
        key = "name" if path == cfg.run_dir else "out_dir"
        fail(lines, (key,), f"{getattr(cfg, key)!r}: {path} is a file; allowed: a directory (or a path that "
                             "does not exist yet)")


def to_dict(obj: Any) -> Any:
    """The resolved config as plain YAML-able data (every default spelled out; a callable given through the
    Python API is written as ``module:qualname``)."""
    if isinstance(obj, Spec):
        out: dict[str, Any] = {"name": obj.name}
        if obj.kind in WEIGHTED:
            out["weight"] = obj.weight
        out.update(to_dict(obj.cfg) if obj.cfg is not None else {})
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if callable(obj):
        from groupwise.plugins import callable_ref

        return callable_ref(obj)
    return obj


def diff(a: RunConfig | Mapping[str, Any], b: RunConfig | Mapping[str, Any]) -> list[str]:
    """The dotted keys whose resolved values differ between two configs (or their ``to_dict`` forms), in
    schema order: ``["seed", "rollout.group_size", "optim.lr"]``. A key present on one side only differs (so
    a changed component lists its ``name`` and the knobs of either); a list of another length is one key
    (``reward.terms``), lists of the same length compare entry by entry (``loss.terms.0.clip_high``)."""
    out: list[str] = []
    _diff(to_dict(a), to_dict(b), "", out)
    return out


def _diff(x: Any, y: Any, key: str, out: list[str]) -> None:
    if isinstance(x, Mapping) and isinstance(y, Mapping):
        for k in [*x, *(k for k in y if k not in x)]:
            sub = f"{key}.{k}" if key else str(k)
            if k in x and k in y:
                _diff(x[k], y[k], sub, out)
            else:
                out.append(sub)
    elif isinstance(x, list | tuple) and isinstance(y, list | tuple) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            _diff(u, v, f"{key}.{i}" if key else str(i), out)
    elif x != y:
        out.append(key or "<root>")
