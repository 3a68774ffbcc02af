"""The catalogue of component kinds: every stage package, imported explicitly, and its registry.

Reading this file tells which stages exist; ``groupwise list`` prints them. A stage package is its interface only
(Protocol, registry, the helpers its members share); the members live in their methods' rooms (``methods/``) and
among the standard components (``standard/``), are found in the source (``registry.source_index``) and
imported when named, plus users' plugins (``plugins.py``: recipe ``plugins:`` and the ``groupwise.plugins``
entry-point group), which register exactly like built-ins.
"""

from __future__ import annotations

from typing import Any

from groupwise import (
    advantages,
    credit,
    drivers,
    filter,
    losses,
    plugins,
    replay,
    rewards,
    rollout,
    select,
    tasks,
    teachers,
)
from groupwise.registry import Registry

KINDS: dict[str, Registry[Any]] = {r.kind: r for r in (
    tasks.TASKS, select.SELECTORS, rollout.GENERATORS, rollout.BUILDERS, rollout.TRANSFORMS, rewards.REWARDS,
    filter.FILTERS, replay.BUFFERS, advantages.ADVANTAGES, advantages.ADVANTAGE_TRANSFORMS, credit.CREDIT,
    teachers.TEACHERS, losses.LOSSES, drivers.DRIVERS)}
"""kind -> registry, in pipeline order."""


def registry(kind: str) -> Registry[Any]:
    plugins.load_entry_points()
    return KINDS[kind]


WORKER_KINDS = ("generator", "group builder", "reward")
"""The kinds a Ray rollout worker builds and runs (``loop/workers.py``); every other kind runs in the driver."""


def worker_refusal(entry: Any) -> str:
    """Why ``entry`` may not run inside a Ray rollout worker ("" when it may): state kept there would be lost with
    the worker and never checkpointed, metrics from it would never reach the step's."""
    if entry.kind not in WORKER_KINDS:
        return ""
    if entry.stateful:
        return "keeps checkpointed state"
    if entry.reports:
        return "reports metrics from its own state"
    return "must run in the training process (driver_only)" if entry.driver_only else ""


def support(entry: Any) -> dict[str, str]:
    """One member's row of the support matrix (docs/methods.md): ``yes``, ``driver`` (runs in the training
    process, whatever the engine) or ``no: <reason>`` (refused at load), for the vLLM generator, for Ray rollout
    workers and for asynchronous rollouts (``rollout.max_async_level`` > 0, ``config/check.py``). With vLLM every
    stage but the generator is unchanged: they reach generation only through the ``Generator`` interface, which the
    vLLM lane runs every lab recipe through (tests/vllm_lane/test_vllm_methods.py)."""
    if entry.kind == "driver":  # a driver lists what it refuses on its config class (and its check() refuses it)
        refused = getattr(entry.config, "REFUSES", {})
        return {k: f"no: {refused[k]}" if k in refused else "yes" for k in ("vllm", "ray", "async")}
    vllm = "yes" if entry.kind != "generator" or "vllm_engine" in entry.abilities("provides", None) else "—"
    why = worker_refusal(entry)
    ray = f"no: {why}" if why else "yes" if entry.kind in WORKER_KINDS else "driver"
    return {"vllm": vllm, "ray": ray, "async": async_refusal(entry) or "yes"}


def async_refusal(entry: Any) -> str:
    """``no: <reason>`` when ``entry`` cannot run with asynchronous rollouts (the load check, ``config/check.py``:
    a generator that cannot sample from a weight snapshot, a teacher that reads the weights being updated), else
    "". A teacher's abilities are read for its default config (one with a required field reads none here)."""
    if entry.kind == "generator" and not (entry.snapshot or entry.own_weights):
        return "no: cannot sample from a weight snapshot"
    if entry.kind == "teacher":
        try:
            provides = entry.abilities("provides", entry.config())
        except (TypeError, ValueError):
            provides = ()
        if "reads_live_policy" in provides:
            return "no: reads the weights being updated"
    return ""


SUPPORT_LEGEND = ("yes: runs with it; driver: runs in the training process, unchanged (Ray workers run only the "
                  "generator, the group builder and the reward terms); —: not applicable (another generator); "
                  "no: refused at load, with the reason. async rollouts: rollout.max_async_level > 0 (yes: the "
                  "load check accepts it).")


def support_table() -> list[str]:
    """The support matrix as markdown rows (``groupwise list --support``, which prints ``SUPPORT_LEGEND`` under it;
    docs/methods.md shows a copy), one row per registered member, plug-ins included, from ``support``: generated,
    never hand-kept."""
    out = ["| kind | member | vLLM generator | Ray workers | async rollouts |", "|---|---|---|---|---|"]
    for kind in KINDS:
        for e in registry(kind).entries():
            row = support(e)
            out.append(f"| {kind} | `{e.name}` | {row['vllm']} | {row['ray']} | {row['async']} |")
    return out


def refusal(cfg: Any, engine: str) -> str:
    """The one-line load error for a driver that refuses ``engine`` (``vllm`` / ``ray`` / ``torchrun`` / ``async``),
    or ""."""
    why = getattr(type(cfg.driver.cfg), "REFUSES", {}).get(engine, "")
    return f"driver '{cfg.driver.name}' does not run with {engine}: {why}" if why else ""
