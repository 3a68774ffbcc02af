"""Method bundles: ``method: <name>`` names every member of a method that spans stages at once, its knobs given
once, where a recipe would otherwise name the method in two or three keys that must agree.

    method: {name: dash_drift, drift_reward: 0.5, eta: 1.0, w_max: 2.0}
is
    rollout: {transforms: [{name: dash_drift, drift_reward: 0.5}]}
    credit: [{name: dash_drift, eta: 1.0, w_max: 2.0}]

A bundle is derived, never declared: it is the members that one method room (``groupwise.methods.<room>``)
registers under one name in two or more kinds (``bundles()``; ``groupwise list`` prints them). Each knob goes to
every member whose config has a field of that name (a knob two members share is set in both, so they cannot
disagree); a knob no member has is a one-line error that lists the bundle's knobs. Each member becomes an entry of
its kind's slot (the schema's component fields, ``slot_paths()``): appended to a list slot (``credit``,
``rollout.transforms``, ``loss.terms``, ...; a list the recipe does not spell starts from the schema's default
entries, except that a loss providing ``policy_gradient`` replaces the default ``ppo_clip``), set in a single slot
(``advantage``, ``rollout.builder``, ...). A member the recipe also names in its own key is refused (one line: both
places and what is allowed), never merged. The expansion is on the raw recipe before validation, so the resolved
config (``groupwise config``, ``resolved_config.yaml``) shows the members as if written out, and every later check
sees ordinary slots.

Design choices: members named differently from their method (think modes' ``think_mode`` reward,
``mode_balance``, ``mode_token_weight``, optional parts of the method) are not bundled: a bundle is the members that
are useless apart; plug-ins' members are named in their own keys (the bundle is read from groupwise's source).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from groupwise.config.parse import Lines, Spec, fail, registry
from groupwise.registry import bundles


def slot_paths() -> dict[str, tuple[tuple[str, ...], bool, list[dict[str, Any]]]]:
    """kind -> (its slot's key path, whether the slot is a list, the slot's default entries as a recipe spells
    them), read from the schema's component fields."""
    from groupwise.config.schema import RunConfig

    out: dict[str, tuple[tuple[str, ...], bool, list[dict[str, Any]]]] = {}

    def walk(cls: type, path: tuple[str, ...]) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if kind := f.metadata.get("kind"):
                many = bool(f.metadata.get("many"))
                default = [dict(r) for r in f.metadata["default"]] if many else [{"name": f.metadata["default"]}]
                out[kind] = ((*path, f.name), many, default)
            elif dataclasses.is_dataclass(hints[f.name]) and hints[f.name] is not Spec:
                walk(hints[f.name], (*path, f.name))

    walk(RunConfig, ())
    return out


def expand(tree: dict[str, Any], lines: Lines) -> None:
    """Replace ``tree``'s ``method`` key (a name, a mapping with ``name`` and knobs, or a list of those) by its
    members' entries, in place (the module docstring)."""
    raw = tree.pop("method")
    entries = raw if isinstance(raw, list) else [] if raw is None else [raw]
    known, paths = bundles(), slot_paths()
    for i, entry in enumerate(entries):
        at = ("method", str(i)) if isinstance(raw, list) else ("method",)
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or entry["name"] not in known:
            got = entry.get("name") if isinstance(entry, dict) else entry
            fail(lines, at, f"{got!r} is not a method bundle; allowed: {', '.join(known)} (a method with one member "
                            "is named in its stage's key)")
        knobs = {k: v for k, v in entry.items() if k != "name"}
        name = entry["name"]
        members = {kind: registry(kind).get(name) for kind in known[name]}
        fields = {kind: {f.name for f in dataclasses.fields(m.config) if f.init} for kind, m in members.items()}
        allowed = sorted(set().union(*fields.values()))
        if stray := [k for k in knobs if k not in allowed]:
            fail(lines, (*at, stray[0]), f"unknown key for method '{name}' ({', '.join(members)}); allowed: "
                                         f"{', '.join(allowed) or '(none)'}")
        for kind, member in members.items():
            path, many, default = paths[kind]
            mine = {"name": name, **{k: v for k, v in knobs.items() if k in fields[kind]}}
            _place(tree, path, many, default, mine, member, lines, at)


def _place(tree: dict[str, Any], path: tuple[str, ...], many: bool, default: list[dict[str, Any]],
           entry: dict[str, Any], member: Any, lines: Lines, at: tuple[str, ...]) -> None:
    """Put one member's entry into its slot at ``path`` (created where the recipe has no such section)."""
    node = tree
    for depth, key in enumerate(path[:-1]):
        if not isinstance(node.setdefault(key, {}), dict):
            fail(lines, path[:depth + 1], f"expected a mapping, got {node[key]!r}")
        node = node[key]
    key, where = path[-1], lines.where(at)
    if not many:
        if key in node:
            fail(lines, path, f"set here and by method '{entry['name']}' ({where}); allowed: one of the two")
        node[key] = entry
        lines.at[path] = where
        return
    spelled = key in node
    items = node.get(key) if spelled else default
    if not isinstance(items, list):
        fail(lines, path, f"expected a list of {member.kind} entries, got {items!r}")
    names = [x if isinstance(x, str) else x.get("name") if isinstance(x, dict) else None for x in items]
    if entry["name"] in names:
        fail(lines, (*path, str(names.index(entry["name"]))),
             f"'{entry['name']}' named here and by method '{entry['name']}' ({where}); allowed: one of the two")
    if not spelled and "policy_gradient" in _provides(member):  # the method's own policy gradient replaces ppo_clip
        items = [x for x, n in zip(items, names) if "policy_gradient" not in _provides(registry(member.kind).get(n))]
    node[key] = [*items, entry]
    lines.at[(*path, str(len(items)))] = where
    if not spelled:
        lines.at[path] = where


def _provides(member: Any) -> tuple[str, ...]:
    """A member's declared abilities where they do not depend on its config (else none: read at load's checks)."""
    return () if callable(member.provides) else tuple(member.provides)

