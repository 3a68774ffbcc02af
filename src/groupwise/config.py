"""Run configuration: frozen dataclasses, YAML recipes, dotted CLI overrides, strict validation.

A recipe lists only what differs from the defaults below. A component slot is written as
``{name: <registered name>, <that component's knobs>}`` (or just the name); weighted slots (reward and loss
terms) also take ``weight``. Overrides use dotted paths: ``trainer.steps=3``, ``advantage.name=rloo``,
``loss.terms.0.clip_high=0.28``. Every error is one line naming the file:line or override, the key path,
and what is allowed. Component configs may define ``check(run)`` for cross-section rules.

This module is the schema and its loader only: a ``Spec`` names a component and holds its validated config;
``catalog.build(spec, env)`` (called once, in ``drivers/setup.py``) turns it into the bound object. The
registries are consulted here only to find each component's config class. ``plugins:`` (files or modules)
are imported before anything else is validated, so their components are known by name.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from groupwise.registry import ConfigError, Registry

_WEIGHTED = {"reward", "loss"}


def registry(kind: str) -> Registry[Any]:
    from groupwise.catalog import registry as lookup  # the catalogue imports every stage package

    return lookup(kind)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A selected component: its kind, registered name, validated config, and (for terms) its weight."""

    kind: str
    name: str
    cfg: Any = None
    weight: float = 1.0


def component(kind: str, default: str | Mapping[str, Any]) -> Any:
    raw = {"name": default} if isinstance(default, str) else dict(default)
    return dataclasses.field(default_factory=lambda: _build_spec(kind, dict(raw), "<default>", {}),
                             metadata={"kind": kind, "default": raw["name"]})


def components(kind: str, default: tuple[str | Mapping[str, Any], ...] = ()) -> Any:
    raws = [{"name": d} if isinstance(d, str) else dict(d) for d in default]
    return dataclasses.field(
        default_factory=lambda: tuple(_build_spec(kind, dict(r), "<default>", {}) for r in raws),
        metadata={"kind": kind, "many": True},
    )


# ----------------------------------------------------------------------------------------- the schema
@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    path: str = "embedded:lab-tiny"
    """A local Hugging Face model directory, or ``embedded:<preset>`` (lab-tiny ~0.8M, lab-small ~4.8M)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    warm_start: bool = True
    """For embedded models: start from the cached SFT warm start on the task's reference traces."""
    warm_start_steps: int = 600
    warm_start_lr: float = 1e-3
    warm_start_batch: int = 64
    chat_template: bool = True
    """Render prompts with the tokenizer's chat template (when it has one)."""

    def __post_init__(self) -> None:
        if self.warm_start_steps < 0 or self.warm_start_batch < 1:
            raise ValueError("warm_start_steps must be >= 0 and warm_start_batch >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    generator: Spec = component("generator", "hf")
    builder: Spec = component("group builder", "standard")
    transforms: tuple[Spec, ...] = components("group transform")
    """Applied in order to scored groups before filtering (QLPO resampling, DRE editing, ...)."""
    prompts_per_step: int = 16
    group_size: int = 8
    max_completion_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1 or self.group_size < 1 or self.max_completion_tokens < 1:
            raise ValueError("prompts_per_step, group_size and max_completion_tokens must be >= 1")
        if not (self.temperature > 0 and 0 < self.top_p <= 1):
            raise ValueError("temperature must be > 0 and top_p in (0, 1]")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardConfig:
    terms: tuple[Spec, ...] = components("reward", ("correctness",))
    """Weighted sum; a term with weight 0 is computed and logged only."""
    verifier_timeout_s: float = 5.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    terms: tuple[Spec, ...] = components("loss", ("ppo_clip",))
    reduction: Literal["token_mean", "seq_mean_token_mean", "seq_sum_const"] = "token_mean"
    """token_mean: over all loss tokens of the optimizer step; seq_mean_token_mean: mean over sequences of
    each sequence's token mean; seq_sum_const: token sum / (sequences x max_completion_tokens) (Dr.GRPO)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 1e-4
    """Sized for the embedded lab models (3e-4 degrades or collapses GRPO on the lab); a 0.5-7B HF model
    usually wants ~1e-6 (full fine-tuning) or ~1e-5 (LoRA)."""
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    grad_clip: float = 1.0
    """Max global grad norm; 0 disables clipping."""
    micro_batch_tokens: int = 8192
    """Token budget (padded prompt + completion) per forward/backward micro-batch."""
    ppo_epochs: int = 1

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.micro_batch_tokens < 1 or self.ppo_epochs < 1 or self.warmup_steps < 0:
            raise ValueError("lr must be > 0, micro_batch_tokens and ppo_epochs >= 1, warmup_steps >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    every: int = 0
    """Evaluate every N steps during training (0: only before and after)."""
    before: bool = True
    after: bool = True
    n_problems: int = 128
    k: int = 4
    temperature: float = 1.0
    greedy: bool = True
    max_completion_tokens: int = 0
    """0 means the rollout's cap."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    steps: int = 100
    save_every: int = 50
    """Checkpoint interval in steps (0 disables periodic checkpoints; the final step is always saved)."""
    keep_last: int = 2
    threads: int = 0
    """torch intra-op threads (0: leave torch's default)."""
    progress: bool = True
    sinks: tuple[Literal["jsonl", "tensorboard", "wandb", "mlflow"], ...] = ("jsonl", "tensorboard")

    def __post_init__(self) -> None:
        if self.steps < 0 or self.save_every < 0 or self.keep_last < 1:
            raise ValueError("steps and save_every must be >= 0, keep_last >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    name: str = "run"
    out_dir: str = "runs"
    """The run writes to ``<out_dir>/<name>``."""
    seed: int = 0
    plugins: tuple[str, ...] = ()
    """Python files (``my_components.py``) or modules (``my_pkg.components``) imported before the recipe is
    validated, so the components they register can be named in it (stored as absolute paths)."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    task: Spec = component("task", "lab")
    select: Spec = component("selector", "random")
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    filter: Spec = component("filter", "none")
    replay: Spec = component("replay buffer", "none")
    advantage: Spec = component("advantage", "grpo")
    advantage_transforms: tuple[Spec, ...] = components("advantage transform")
    credit: tuple[Spec, ...] = components("credit")
    teacher: Spec = component("teacher", "none")
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    def specs(self) -> list[Spec]:
        """Every selected component, in pipeline order."""
        out = [self.task, self.select, self.rollout.generator, self.rollout.builder, *self.rollout.transforms,
               *self.reward.terms, self.filter, self.replay, self.advantage, *self.advantage_transforms,
               *self.credit, self.teacher, *self.loss.terms]
        return out


# ------------------------------------------------------------------------------------------ loading
class _Lines:
    """Where each key path came from, for error messages."""

    def __init__(self) -> None:
        self.at: dict[tuple[str, ...], str] = {}

    def where(self, path: tuple[str, ...]) -> str:
        while path:
            if path in self.at:
                return self.at[path]
            path = path[:-1]
        return self.at.get((), "")


def _node_to_obj(node: yaml.Node, path: tuple[str, ...], lines: _Lines, fname: str) -> Any:
    lines.at[path] = f"{fname}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for k, v in node.value:
            key = str(yaml.safe_load(yaml.serialize(k)))
            lines.at[(*path, key)] = f"{fname}:{k.start_mark.line + 1}"
            out[key] = _node_to_obj(v, (*path, key), lines, fname)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_node_to_obj(v, (*path, str(i)), lines, fname) for i, v in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def _read_yaml(path: Path, lines: _Lines) -> dict[str, Any]:
    try:
        node = yaml.compose(path.read_text())
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


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, lines: _Lines, origin: str) -> None:
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
            nxt = node[k] = {}
        node = nxt
    last = keys[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"{origin}: '{dotted}' indexes a list of {len(node)} items")
        node[int(last)] = value
    else:
        node[last] = value
    lines.at[tuple(keys)] = origin


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
    lines = _Lines()
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
    cfg = _build(RunConfig, tree, (), lines)
    _check(cfg)
    return cfg


def _import_plugins(raw: Any, lines: _Lines) -> list[str]:
    from groupwise import plugins

    refs = [raw] if isinstance(raw, str) else raw
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        _fail(lines, ("plugins",), f"expected a list of files or modules, got {raw!r}")
    out = []
    for i, ref in enumerate(refs):
        try:
            plugins.import_ref(ref)
        except ConfigError as e:
            where = lines.where(("plugins", str(i)))
            raise ConfigError(f"{where + ': ' if where else ''}plugins.{i}: {e}") from None
        out.append(plugins.absolute(ref))
    return out


def _check(cfg: RunConfig) -> None:
    """Cross-section rules: each component's ``check(run)``, and what active loss terms need."""
    for spec in cfg.specs():
        check = getattr(spec.cfg, "check", None)
        if check is not None:
            try:
                check(cfg)
            except ValueError as e:
                raise ConfigError(f"{spec.kind} '{spec.name}': {e}") from None
    for i, spec in enumerate(cfg.loss.terms):
        needs = registry("loss").get(spec.name).needs if spec.weight != 0 else ()
        if any(n.startswith("teacher") for n in needs) and cfg.teacher.name == "none":
            raise ConfigError(f"loss.terms.{i}: '{spec.name}' needs a teacher; set teacher: privileged | frozen | "
                              "ema | model")
        if "teacher_topk" in needs and not getattr(cfg.teacher.cfg, "top_k", 0):
            raise ConfigError(f"loss.terms.{i}: '{spec.name}' needs the teacher's top-k support; set teacher.top_k")


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path) or "<root>"


def _fail(lines: _Lines, path: tuple[str, ...], msg: str) -> typing.NoReturn:
    where = lines.where(path)
    raise ConfigError(f"{where + ': ' if where else ''}{_dotted(path)}: {msg}")


def _build(cls: type, raw: Any, path: tuple[str, ...], lines: _Lines) -> Any:
    if not isinstance(raw, dict):
        _fail(lines, path, f"expected a mapping of {cls.__name__} fields, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in raw if k not in fields]
    if unknown:
        _fail(lines, (*path, unknown[0]), f"unknown key; allowed: {', '.join(sorted(fields)) or '(none)'}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        sub = (*path, name)
        kind = f.metadata.get("kind")
        if kind and f.metadata.get("many"):
            if not isinstance(raw[name], list):
                _fail(lines, sub, f"expected a list of {kind} entries")
            kwargs[name] = tuple(_build_spec(kind, r, (*sub, str(i)), lines) for i, r in enumerate(raw[name]))
        elif kind:
            value = raw[name]
            if isinstance(value, dict) and "name" not in value:  # refine the default component's knobs
                value = {"name": f.metadata["default"], **value}
            kwargs[name] = _build_spec(kind, value, sub, lines)
        else:
            kwargs[name] = _coerce(raw[name], hints[name], sub, lines)
    try:
        return cls(**kwargs)
    except ValueError as e:
        _fail(lines, path, str(e))


def _build_spec(kind: str, raw: Any, path: tuple[str, ...] | str, lines: _Lines | dict) -> Spec:
    if isinstance(path, str):  # a default from the schema
        path, lines = (), _Lines()
    assert isinstance(lines, _Lines)
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        _fail(lines, path, f"a {kind} entry needs 'name' (one of: {', '.join(registry(kind).names())})")
    raw = dict(raw)
    name = raw.pop("name")
    weight = 1.0
    if kind in _WEIGHTED and "weight" in raw:
        weight = _coerce(raw.pop("weight"), float, (*path, "weight"), lines)
    where = lines.where((*path, "name"))
    try:
        entry = registry(kind).get(name)
    except ConfigError as e:
        raise ConfigError(f"{where + ': ' if where else ''}{_dotted(path)}: {e}") from None
    cfg = _build(entry.config, raw, path, lines)
    return Spec(kind, name, cfg, weight)


def _coerce(value: Any, tp: Any, path: tuple[str, ...], lines: _Lines) -> Any:
    """``value`` checked against (and converted to) the annotation ``tp``; a mismatch is a one-line error."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(tp), tp, path, lines)
    if origin is Literal:
        if value not in typing.get_args(tp):
            _fail(lines, path, f"{value!r} is not allowed; allowed: {', '.join(map(str, typing.get_args(tp)))}")
        return value
    if origin is tuple:
        return _coerce_tuple(value, typing.get_args(tp), path, lines)
    if origin is dict:
        if not isinstance(value, dict):
            _fail(lines, path, f"expected a mapping, got {value!r}")
        return {str(k): _coerce(v, typing.get_args(tp)[1], (*path, str(k)), lines) for k, v in value.items()}
    if tp in _SCALARS:
        return _SCALARS[tp](value, path, lines)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path, lines)
    raise TypeError(f"config type {tp!r} at {_dotted(path)} is not supported")


def _coerce_union(value: Any, args: tuple[Any, ...], tp: Any, path: tuple[str, ...], lines: _Lines) -> Any:
    if value is None and type(None) in args:
        return None
    for a in args:
        if a is type(None):
            continue
        try:
            return _coerce(value, a, path, lines)
        except ConfigError:
            pass
    _fail(lines, path, f"{value!r} is not a valid {tp}")


def _coerce_tuple(value: Any, args: tuple[Any, ...], path: tuple[str, ...], lines: _Lines) -> tuple[Any, ...]:
    if isinstance(value, str | int | float):
        value = [value]
    if not isinstance(value, list | tuple):
        _fail(lines, path, f"expected a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_coerce(v, args[0], (*path, str(i)), lines) for i, v in enumerate(value))
    if len(value) != len(args):
        _fail(lines, path, f"expected {len(args)} items, got {len(value)}")
    return tuple(_coerce(v, a, (*path, str(i)), lines) for i, (v, a) in enumerate(zip(value, args)))


def _coerce_bool(value: Any, path: tuple[str, ...], lines: _Lines) -> bool:
    if isinstance(value, bool):
        return value
    _fail(lines, path, f"expected true or false, got {value!r}")


def _coerce_int(value: Any, path: tuple[str, ...], lines: _Lines) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(float(value)) if float(value).is_integer() else int(value)
        except ValueError:
            pass
    _fail(lines, path, f"expected an integer, got {value!r}")


def _coerce_float(value: Any, path: tuple[str, ...], lines: _Lines) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    _fail(lines, path, f"expected a number, got {value!r}")


def _coerce_str(value: Any, path: tuple[str, ...], lines: _Lines) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    _fail(lines, path, f"expected a string, got {value!r}")


_SCALARS = {bool: _coerce_bool, int: _coerce_int, float: _coerce_float, str: _coerce_str}


# ------------------------------------------------------------------------------------------ dumping
def to_dict(obj: Any) -> Any:
    """The resolved config as plain YAML-able data (every default spelled out; a callable given through the
    Python API is written as ``module:qualname``)."""
    if isinstance(obj, Spec):
        out: dict[str, Any] = {"name": obj.name}
        if obj.kind in _WEIGHTED:
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


def dump(cfg: RunConfig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
