"""Validation across sections, after every section parsed on its own: each component config's ``check(run)``,
declared abilities (what a selected component requires another to provide), and what the engines and drivers
refuse. Every error is one line naming the key and what is allowed."""

from __future__ import annotations

from groupwise.config.parse import Spec, registry
from groupwise.config.schema import RunConfig
from groupwise.registry import ConfigError


def loss_needs(cfg: RunConfig) -> set[str]:
    """What the loss terms with non-zero weight read beyond the policy's log-probs (``registry.NEEDS``)."""
    return {n for t in cfg.loss.terms if t.weight != 0 for n in t.entry.needs_of(t.cfg)}


def check(cfg: RunConfig) -> None:
    """Cross-section rules: each component config's ``check(run)``, the declared abilities, the importance-sampling
    and asynchronous-rollout prerequisites, and what the driver, Ray workers and FSDP refuse."""
    for spec in cfg.specs():
        rule = getattr(spec.cfg, "check", None)
        if rule is not None:
            try:
                rule(cfg)
            except ValueError as e:
                raise ConfigError(f"{spec.kind} '{spec.name}': {e}") from None
    _check_abilities(cfg)
    _check_tools(cfg)
    _check_importance_sampling(cfg)
    if cfg.rollout.max_async_level:
        _check_async(cfg)
    from groupwise.catalog import refusal

    generator = cfg.rollout.generator.entry
    for engine, on in (("vllm", "vllm_engine" in generator.abilities("provides", cfg.rollout.generator.cfg)),
                       ("ray", cfg.rollout.workers > 0), ("async", cfg.rollout.max_async_level > 0)):
        why = refusal(cfg, engine) if on else ""
        if why:
            raise ConfigError(f"driver: {why}")
    if cfg.rollout.workers:
        _check_workers(cfg)
    if cfg.optim.autocast != "none":
        for key, value, bad, why in (
                ("model.dtype", cfg.model.dtype, cfg.model.dtype != "float32",
                 "the weights are already 16-bit; allowed: model.dtype=float32"),
                ("trainer.data_parallel", cfg.trainer.data_parallel, cfg.trainer.data_parallel == "fsdp",
                 "autocast under FSDP is not built; use trainer.data_parallel=replicate")):
            if bad:
                raise ConfigError(f"optim.autocast={cfg.optim.autocast} with {key}={value}: {why}")
    if cfg.trainer.data_parallel == "fsdp":
        for key, on in (("model.lora", cfg.model.lora is not None), ("rollout.workers", cfg.rollout.workers > 0)):
            if on:
                raise ConfigError(f"trainer.data_parallel=fsdp: {key} under FSDP is not built; use "
                                  "trainer.data_parallel=replicate with it")


def slots(cfg: RunConfig) -> list[tuple[str, Spec]]:
    """The components that give the others what they provide, with their keys (``RunConfig.slots``): a term with
    weight 0 is computed and logged but gives nothing to the others, so it is left out."""
    return [(k, s) for k, s in cfg.slots() if s.weight != 0]


def _check_abilities(cfg: RunConfig) -> None:
    """Every ability a selected component requires (``Entry.requires``; a loss term's teacher ``needs`` require a
    teacher) is provided by another selected one, and none provides what another ``conflicts`` with."""
    every = [(key, spec, spec.entry) for key, spec in cfg.slots()]
    chosen = [(key, spec, e) for key, spec, e in every if spec.weight != 0]  # ``slots``: those that give
    given = {a for _, spec, e in chosen for a in e.abilities("provides", spec.cfg)}
    for key, spec, entry in every:  # a term with weight 0 is built and computed too: what it requires must exist
        needs = entry.needs_of(spec.cfg) if spec.kind == "loss" and spec.weight != 0 else ()
        wants = (*entry.abilities("requires", spec.cfg), *(n for n in ("teacher", "teacher_topk") if n in needs),
                 *(("teacher",) if "teacher_vocab" in needs else ()))
        for ability in dict.fromkeys(wants):
            if ability not in given:
                raise ConfigError(f"{key}: {spec.kind} '{spec.name}' requires {ability!r}, which no selected "
                                  f"component provides; allowed: add {' or '.join(providers(ability))}")
        for ability in entry.abilities("conflicts", spec.cfg) if spec.weight != 0 else ():
            other = [(k, s) for k, s, e in chosen if s is not spec and ability in e.abilities("provides", s.cfg)]
            if other:
                raise ConfigError(f"{key}: {spec.kind} '{spec.name}' cannot run with {other[0][1].kind} "
                                  f"'{other[0][1].name}' ({other[0][0]}): both {ability!r}; allowed: one of them")


def _check_tools(cfg: RunConfig) -> None:
    """``rollout.tools`` with the text protocol calls one of the task's tools: a task declares each as the ability
    ``tool:<name>``. The chat protocol's tools (an environment's among them) are known once the task is built:
    ``loop/tools.py``, ``offered``."""
    tools = cfg.rollout.tools
    if tools is None or tools.protocol != "text":
        return
    provides = cfg.task.entry.abilities("provides", cfg.task.cfg)
    have = sorted(a.removeprefix("tool:") for a in provides if a.startswith("tool:"))
    if tools.tool not in have:
        what = f"tools {', '.join(have)}" if have else "no tools"
        raise ConfigError(f"rollout.tools.tool={tools.tool!r}: task '{cfg.task.name}' has {what}; allowed: a tool of "
                          "the task (task.name=search has 'search')")


def processes(cfg: RunConfig, world: int) -> None:
    """What several training processes (torchrun / accelerate: ``world`` = ``WORLD_SIZE`` > 1) refuse, checked
    when a run starts and before anything is built (a recipe is loaded in one process too: ``groupwise config``):
    the driver's ``REFUSES["torchrun"]`` and a vLLM engine (one engine per process is not built)."""
    if world <= 1:
        return
    from groupwise.catalog import refusal

    why = refusal(cfg, "torchrun")
    if why:
        raise ConfigError(f"driver: {why}")
    gen = cfg.rollout.generator
    if "vllm_engine" in gen.entry.abilities("provides", gen.cfg):
        raise ConfigError(f"rollout.generator {gen.name} under torchrun / accelerate (several processes) is not "
                          "built; allowed: one process, or generator hf")


def providers(ability: str) -> list[str]:
    """Who could provide ``ability``, for an error message: ``kind 'name'``, and when that depends on its knobs,
    the first line of its ``provides`` docstring (which says how)."""
    from groupwise.catalog import KINDS

    out = []
    for reg in KINDS.values():
        for e in reg.entries():
            if not callable(e.provides):
                out += [f"{e.kind} '{e.name}'"] if ability in e.provides else []
                continue
            doc = (e.provides.__doc__ or "").strip()
            try:
                default = e.abilities("provides", e.config())
            except Exception:  # a config class without defaults for every field: named if its doc names it
                default = (ability,) if ability in doc else ()
            if ability in default:
                out.append(f"{e.kind} '{e.name}'")
            elif ability in doc:
                out.append(f"{e.kind} '{e.name}' ({doc.splitlines()[0].rstrip('.')})")
    return out or ["a component that provides it (none is registered)"]


def _check_importance_sampling(cfg: RunConfig) -> None:
    """An importance-sampling mode needs a generator whose completions carry its own sampling log-probs."""
    mode, gen = cfg.loss.importance_sampling.mode, cfg.rollout.generator.name
    if mode != "none" and not cfg.rollout.generator.entry.logprobs:
        with_logprobs = [n for n in registry("generator").names() if registry("generator").get(n).logprobs]
        raise ConfigError(f"loss.importance_sampling.mode={mode}: generator '{gen}' returns no sampling "
                          "log-probs; allowed: mode none, or a generator that does "
                          f"({', '.join(with_logprobs)})")


def _check_workers(cfg: RunConfig) -> None:
    """``rollout.workers`` needs ray, and every component that runs in a worker (generator, builder, reward
    terms) must keep no state there: a ``stateful``, ``reports`` or ``driver_only`` member is refused."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(f"rollout.workers={cfg.rollout.workers} needs ray, which is not installed: "
                          "pip install 'groupwise[ray]'") from None
    slots = [("rollout.generator", cfg.rollout.generator), ("rollout.builder", cfg.rollout.builder),
             *((f"reward.terms.{i}", t) for i, t in enumerate(cfg.reward.terms))]
    from groupwise.catalog import worker_refusal

    for where, spec in slots:
        why = worker_refusal(spec.entry)
        if why:
            raise ConfigError(f"{where}: {spec.kind} '{spec.name}' {why}, which would live in a Ray worker; "
                              "allowed with rollout.workers: 0 (its shards then run in this process)")


def _check_async(cfg: RunConfig) -> None:
    """``rollout.max_async_level`` > 0 runs the rollout stage on a weight snapshot while a background thread
    updates the policy: the generator must be rebuildable on a snapshot (``snapshot``) or load one into its own
    engine (``own_weights``), and nothing in the rollout stage may read the weights being updated
    (``loop/lag.py``). Ray workers hold their own copies and are given the snapshot's."""
    k, gen = cfg.rollout.max_async_level, cfg.rollout.generator.name
    entry = cfg.rollout.generator.entry
    if not (entry.snapshot or entry.own_weights):
        ok = [e.name for e in registry("generator").entries() if e.snapshot or e.own_weights]
        raise ConfigError(f"rollout.max_async_level={k}: generator '{gen}' cannot sample from a weight snapshot; "
                          f"allowed: rollout.max_async_level=0, or generator {' | '.join(ok)}")
    for key, on, why in (
            ("trainer.data_parallel", cfg.trainer.data_parallel == "fsdp", "FSDP gathers weights collectively"),
            ("teacher", "reads_live_policy" in cfg.teacher.entry.abilities("provides", cfg.teacher.cfg),
             f"teacher '{cfg.teacher.name}' reads the weights being updated")):
        if on:
            raise ConfigError(f"rollout.max_async_level={k}: not built with {key} here ({why}); allowed: "
                              f"rollout.max_async_level=0 with it")


