"""Run configuration: frozen dataclasses, YAML recipes, dotted CLI overrides, strict validation.

A recipe lists only what differs from the defaults below. A component slot is written as
``{name: <registered name>, <that component's knobs>}`` (or just the name); weighted slots (reward and loss
terms) also take ``weight``. Overrides use dotted paths: ``trainer.steps=3``, ``advantage.name=rloo``,
``loss.terms.0.clip_high=0.28``. Every error is one line naming the file:line or override, the key path,
and what is allowed (a range error raised by an override cites the override). Float knobs must be finite
(``.nan`` / ``.inf`` fail at load) except the knobs whose field says ``infinite`` (``INFINITE``); duplicate YAML keys
fail naming both lines. An override may index a default list the recipe does not spell out
(``loss.terms.0.clip_high=0.28``). Component configs may define ``check(run)`` for cross-section rules.
``diff(a, b)`` lists the dotted keys where two resolved configs differ (e.g. a resume with new overrides).

This module is the schema and its loader only: a ``Spec`` names a component and holds its validated config;
``catalog.build(spec, env)`` (called once, in ``loop/setup.py``) turns it into the bound object. The
registries are consulted here only to find each component's config class. ``plugins:`` (files or modules)
are imported before anything else is validated, so their components are known by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from groupwise.registry import ConfigError, Registry

_WEIGHTED = {"reward", "loss"}

INFINITE = "infinite"
"""Field metadata of a float knob whose documented meaning includes an infinity (``tau: .inf`` = no gate,
``token_clip: .inf`` = no clip): ``dataclasses.field(default=..., metadata={"infinite": True})``. Every other
float knob must be finite: ``.nan`` / ``.inf`` fail at load."""


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
        metadata={"kind": kind, "many": True, "default": raws},
    )


def _rules(obj: Any, *rules: tuple[str, Callable[[Any], bool], str]) -> None:
    """``__post_init__`` checks: the first ``(field, ok, allowed)`` whose value fails raises a one-line
    ``field=value: allowed ...`` (the loader adds the file:line or override and the section)."""
    for name, ok, allowed in rules:
        value = getattr(obj, name)
        if not ok(value):
            raise ValueError(f"{name}={value!r}: allowed {allowed}")


def _device_ok(device: str) -> bool:
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


# ----------------------------------------------------------------------------------------- the schema
@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """Train a LoRA adapter (through ``peft``) instead of every weight: ``W + (alpha / r) B A``, B = 0 at the
    start, so the adapted model equals its base at step 0. The base weights stay frozen and are shared with the
    reference / frozen teacher (the adapter switched off), so no second copy of the model is kept."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("all-linear",)
    """Module names (or name suffixes) to adapt; ``all-linear`` is every linear layer but the output head."""

    def __post_init__(self) -> None:
        _rules(self, ("r", lambda v: v >= 1, ">= 1"), ("alpha", lambda v: v > 0, "> 0"),
               ("dropout", lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
               ("target_modules", lambda v: len(v) >= 1, "a non-empty list of module names, or [all-linear]"))


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
    lora: LoraConfig | None = None
    """Train a LoRA adapter instead of the full model (``pip install groupwise[lora]``); ``model.lora={}`` for
    the defaults."""

    def __post_init__(self) -> None:
        _rules(self, ("device", _device_ok, "a torch device: cpu, cuda, cuda:<index>, mps, ..."),
               ("warm_start_steps", lambda v: v >= 0, ">= 0"), ("warm_start_lr", lambda v: v > 0, "> 0"),
               ("warm_start_batch", lambda v: v >= 1, ">= 1"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolsConfig:
    """Multi-turn rollouts with a task's tool (``rollout/tools.py``): the model writes ``<tool>query</tool>``,
    the tool's result is appended as ``<result>…</result>`` (masked out of the loss), and the model goes on."""

    tool: str = "search"
    """The task's tool (``task.tools[tool]``)."""
    max_turns: int = 4
    """Model turns per rollout (at most max_turns − 1 tool calls are run)."""
    turn_tokens: int = 32
    """New model tokens per turn (rollout.max_completion_tokens caps model and tool tokens together)."""
    result_tokens: int = 64
    """A tool result, tags included, is cut to this many tokens."""
    timeout_s: float = 5.0
    """Per turn: the turn's calls (run concurrently) must answer within this many seconds."""
    workers: int = 8
    isolation: Literal["auto", "thread", "process"] = "auto"
    """``thread``: calls run in daemon threads of this process (a call stuck in C code holding the GIL stalls
    the run); ``process``: each of ``workers`` forked processes runs calls, one that overruns is killed;
    ``auto``: ``process`` for a plug-in task's tool on Linux, ``thread`` for groupwise's own
    (``groupwise/isolation.py``)."""

    def __post_init__(self) -> None:
        _rules(self, ("max_turns", lambda v: v >= 1, ">= 1"), ("turn_tokens", lambda v: v >= 1, ">= 1"),
               ("result_tokens", lambda v: v >= 1, ">= 1"), ("timeout_s", lambda v: v > 0, "> 0"),
               ("workers", lambda v: v >= 1, ">= 1"))


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
    tools: ToolsConfig | None = None
    """Multi-turn tool use for every rollout and eval sample (``rollout.tools={}``: the search tool)."""
    shards: int = 1
    """Rollout shards per step: the step's problems are dealt round-robin (shard i gets problems i, i + shards,
    ...), and each shard is built and scored with its index in every rollout seed, so the samples depend on
    ``shards`` and never on ``workers`` or on which worker ran a shard. 1: one shard, the seeds of a run
    without this field; ``shards = prompts_per_step``: per-group seeding (every group its own streams)."""
    workers: int = 0
    """Ray actors that build and score the shards (``pip install 'groupwise[ray]'``, ``loop/workers.py``);
    0: the shards run one after another in this process. At most ``shards``."""
    sync_check: Literal["none", "resync", "error"] = "resync"
    """After every weight sync, a probe checks that the engine (the generator, each Ray worker) samples from the
    trainer's weights (``rollout/sync_check.py``): ``resync`` counts a stale engine in ``sync/failures``, syncs
    again and stops the run if it is still stale; ``error`` stops the run at once, in one line naming the
    engine; ``none`` checks nothing. Cost: one greedy generate of 32 tokens and one forward per probe; the
    default ``hf`` generator shares the policy's parameters and is probed once, before its first generation."""
    sync_check_tol: float = 0.0
    """The probe's tolerance on mean |Δ log p| between engine and trainer; 0: by ``model.dtype`` (1e-3 in
    float32, 5e-2 in bfloat16 / float16)."""
    max_async_level: int = 0
    """K: asynchronous rollouts with a fixed lag (``loop/lag.py``). Step t's rollouts are sampled by policy
    version max(0, t − K) (version = updates applied), on a frozen copy of the weights, while step t − 1's
    update runs in a background thread; their PPO behaviour log-probs are that version's. 0: the synchronous
    loop. Generators that support it are registered ``snapshot=True`` (``hf``, ``fake``)."""
    async_timeout_s: float = 3600.0
    """With ``max_async_level`` > 0: the longest the loop waits for a background update before it stops the
    run in one line (a hung update); the last checkpoint is intact."""

    def __post_init__(self) -> None:
        _rules(self, ("shards", lambda v: v >= 1, ">= 1"), ("workers", lambda v: v >= 0, ">= 0 (0: in-process)"),
               ("sync_check_tol", lambda v: v >= 0, ">= 0 (0: by model.dtype)"),
               ("max_async_level", lambda v: v >= 0, ">= 0 (0: synchronous rollouts)"),
               ("async_timeout_s", lambda v: v > 0, "> 0 (seconds)"))
        if self.sync_check == "none" and self.sync_check_tol:
            raise ValueError(f"sync_check_tol={self.sync_check_tol}: unused with sync_check=none; allowed: drop it, "
                             "or sync_check=resync / error")
        if self.workers > self.shards:
            raise ValueError(f"workers={self.workers}: allowed 0 or at most rollout.shards ({self.shards}): each "
                             "worker builds whole shards")
        _rules(self, ("prompts_per_step", lambda v: v >= 1, ">= 1"),
               ("group_size", lambda v: v >= 2,
                ">= 2 (a group-relative advantage gives a group of one no signal)"),
               ("max_completion_tokens", lambda v: v >= 1, ">= 1"), ("temperature", lambda v: v > 0, "> 0"),
               ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardConfig:
    terms: tuple[Spec, ...] = components("reward", ("correctness",))
    """Weighted sum; a term with weight 0 is computed and logged only."""
    verifier_timeout_s: float = 5.0
    """Per verifier call; 0 disables the timeout (SIGALRM, main thread only)."""
    term_timeout_s: float = 300.0
    """Per call of a reward term (one call scores the step's groups); a term over it adds nothing and is
    counted in ``reward/<term>_errors``; 0 disables it (SIGALRM, main thread only)."""
    verifier_isolation: Literal["auto", "alarm", "process"] = "auto"
    """``alarm``: verify in this process under SIGALRM (cannot interrupt C code); ``process``: in a forked
    worker that is killed and replaced when it overruns; ``auto``: ``process`` for a plug-in task's verifier on
    Linux, ``alarm`` for groupwise's own tasks (``groupwise/isolation.py``)."""
    fail_fast: bool = True
    """Stop the run after a step in which a reward term failed on every sample (it raised, timed out or
    returned no usable number each time: e.g. a conversational reward function on plain-text prompts), in one
    line naming it with its first error; false: keep going, the term adding nothing to those samples (its
    failures counted in ``reward/<term>_errors`` as always)."""

    def __post_init__(self) -> None:
        _rules(self, ("verifier_timeout_s", lambda v: v >= 0, ">= 0 (0 disables the timeout)"),
               ("term_timeout_s", lambda v: v >= 0, ">= 0 (0 disables the timeout)"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImportanceSamplingConfig:
    """Sampler-trainer mismatch correction (TRL's ``vllm_importance_sampling_mode`` / ``_clip_max``): every
    loss term's per-token loss is multiplied by w = exp(old_logprobs − rollout_logprobs), per token or
    (sequence modes) the product over the row's loss tokens, truncated at ``cap`` or zeroed above it
    (``losses/mismatch.py``)."""

    mode: Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = "none"
    """none: no weight (the loss as without this section, bit for bit); ``*_truncate``: min(w, cap);
    ``*_mask``: 0 where w > cap (the tokens or rows stay in the denominators, as in TRL)."""
    cap: float = 3.0
    """TRL's ``vllm_importance_sampling_clip_max`` (its default, 3)."""

    def __post_init__(self) -> None:
        _rules(self, ("cap", lambda v: v > 1, "> 1 (w = 1 is no mismatch; a cap at or below it truncates or "
                                              "masks matching tokens)"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    terms: tuple[Spec, ...] = components("loss", ("ppo_clip",))
    reduction: Literal["token_mean", "seq_mean_token_mean", "seq_sum_const"] = "token_mean"
    """token_mean: over all loss tokens of the optimizer step; seq_mean_token_mean: mean over sequences of
    each sequence's token mean; seq_sum_const: token sum / (sequences x max_completion_tokens) (Dr.GRPO)."""
    importance_sampling: ImportanceSamplingConfig = dataclasses.field(
        default_factory=ImportanceSamplingConfig)
    """Correct the gap between the generator's log-probs and the trainer's (default: none)."""


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
    shared_prefix: bool = False
    """Run each distinct prompt of a micro-batch once in the update's forwards (policy and reference): the G
    completions of a group share their prompt's forward and its share of the backward
    (``forward.shared_prefix_logprobs``; equal to the unshared pass up to float summation order). Worth it when
    prompts are long next to completions."""
    skip_inert_rows: bool = True
    """Rows that can carry no loss (all loss weights 0, or all-zero advantages under ``advantage_only`` terms) skip
    their forward and backward; false runs them anyway: the same update, for measuring the saving
    (benchmarks/levers.py)."""
    nonfinite: Literal["restore", "stop"] = "restore"
    """A step that leaves a parameter NaN/inf: ``restore`` the pre-step weights (keeps one copy of the trainable
    parameters each step; right for the lab's small models) or ``stop`` the run with a one-line error (no
    copy; for large models), the last checkpoint intact either way."""

    def __post_init__(self) -> None:
        _rules(self, ("lr", lambda v: v > 0, "> 0"),
               ("betas", lambda v: all(0 <= b < 1 for b in v), "two numbers in [0, 1)"),
               ("weight_decay", lambda v: v >= 0, ">= 0"), ("eps", lambda v: v >= 0, ">= 0"),
               ("warmup_steps", lambda v: v >= 0, ">= 0"),
               ("grad_clip", lambda v: v >= 0, ">= 0 (0 disables clipping)"),
               ("micro_batch_tokens", lambda v: v >= 1, ">= 1"), ("ppo_epochs", lambda v: v >= 1, ">= 1"))


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
    forced_prefix: str = ""
    """Text prefilled after the prompt of every eval sample, greedy included ("": none), e.g. ``<LG>`` to judge
    a think-modes policy in its Long mode. Tokenized without special tokens; it must decode back to itself and
    leave room for one generated token (checked at build, ``eval/evaluate.py``). Its tokens are completion
    tokens as a builder's forced prefix is in training: in each record's ``text``, counted in ``length`` and
    toward ``max_completion_tokens``, never sampled. No per-mode cap applies (eval caps every sample at
    ``max_completion_tokens``; for <LG> with ``cap_lg: 0`` that is the training cap)."""

    def __post_init__(self) -> None:
        _rules(self, ("every", lambda v: v >= 0, ">= 0 (0: only before and after)"),
               ("n_problems", lambda v: v >= 1, ">= 1"), ("k", lambda v: v >= 1, ">= 1"),
               ("temperature", lambda v: v >= 0, ">= 0 (0 samples greedily)"),
               ("max_completion_tokens", lambda v: v >= 0, ">= 0 (0: the rollout's cap)"))


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
    record_groups: int = 2
    """Groups of each kind (trained, filtered, dropped, replayed) written per step to ``rollouts.jsonl`` for
    ``groupwise inspect`` (0: record nothing; docs/inspect.md)."""
    data_parallel: Literal["replicate", "fsdp"] = "replicate"
    """With several processes (torchrun / accelerate): every rank holds the whole model and the gradients are
    all-reduced (``replicate``), or each holds a shard of the weights, gradients and optimizer state (``fsdp``,
    PyTorch's FSDP2: ``models/fsdp.py``). One process: no effect."""

    def __post_init__(self) -> None:
        _rules(self, ("steps", lambda v: v >= 0, ">= 0"),
               ("save_every", lambda v: v >= 0, ">= 0 (0: only the final step)"),
               ("keep_last", lambda v: v >= 1, ">= 1"),
               ("threads", lambda v: v >= 0, ">= 0 (0: torch's default)"))
        if self.record_groups < 0:
            raise ValueError(f"record_groups={self.record_groups}: must be >= 0 (0 records nothing)")


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
    driver: Spec = component("driver", "single")
    """How policies are arranged around the RL step (``drivers/__init__.py``): ``single`` (one policy), or a
    multi-policy / federated driver, which builds every policy's pipeline from the sections above."""

    def __post_init__(self) -> None:
        _rules(self, ("name", lambda v: bool(v) and v not in (".", "..") and not re.search(r"[/\\\0]", v),
                      "a plain directory name (no path separator, not '.' or '..'): the run writes to "
                      "<out_dir>/<name>"),
               ("out_dir", bool, "a non-empty directory path"))

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    def specs(self) -> list[Spec]:
        """Every selected component, in pipeline order."""
        out = [self.task, self.select, self.rollout.generator, self.rollout.builder, *self.rollout.transforms,
               *self.reward.terms, self.filter, self.replay, self.advantage, *self.advantage_transforms,
               *self.credit, self.teacher, *self.loss.terms, self.driver]
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
        first: dict[str, int] = {}
        for k, v in node.value:
            key = str(yaml.safe_load(yaml.serialize(k)))
            if key in first:
                raise ConfigError(f"{fname}:{k.start_mark.line + 1}: {_dotted((*path, key))}: duplicate key "
                                  f"(first at {fname}:{first[key]}); allowed: each key once")
            first[key] = k.start_mark.line + 1
            lines.at[(*path, key)] = f"{fname}:{k.start_mark.line + 1}"
            out[key] = _node_to_obj(v, (*path, key), lines, fname)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_node_to_obj(v, (*path, str(i)), lines, fname) for i, v in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def _read_yaml(path: Path, lines: _Lines) -> dict[str, Any]:
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


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, lines: _Lines, origin: str) -> None:
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
    _check_out_dir(cfg, lines)
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


def loss_needs(cfg: RunConfig) -> set[str]:
    """What the loss terms with non-zero weight read beyond the policy's log-probs (``registry.NEEDS``)."""
    return {n for t in cfg.loss.terms if t.weight != 0 for n in registry("loss").get(t.name).needs_of(t.cfg)}


def _check(cfg: RunConfig) -> None:
    """Cross-section rules: each component's ``check(run)``, and what active loss terms need."""
    for spec in cfg.specs():
        check = getattr(spec.cfg, "check", None)
        if check is not None:
            try:
                check(cfg)
            except ValueError as e:
                raise ConfigError(f"{spec.kind} '{spec.name}': {e}") from None
    _check_abilities(cfg)
    _check_importance_sampling(cfg)
    if cfg.rollout.max_async_level:
        _check_async(cfg)
    from groupwise.catalog import refusal

    generator = registry("generator").get(cfg.rollout.generator.name)
    for engine, on in (("vllm", "vllm_engine" in generator.abilities("provides", cfg.rollout.generator.cfg)),
                       ("ray", cfg.rollout.workers > 0), ("async", cfg.rollout.max_async_level > 0)):
        why = refusal(cfg, engine) if on else ""
        if why:
            raise ConfigError(f"driver: {why}")
    if cfg.rollout.workers:
        _check_workers(cfg)
    if cfg.trainer.data_parallel == "fsdp":
        for key, on in (("model.lora", cfg.model.lora is not None), ("rollout.workers", cfg.rollout.workers > 0)):
            if on:
                raise ConfigError(f"trainer.data_parallel=fsdp: {key} under FSDP is not built; use "
                                  "trainer.data_parallel=replicate with it")


def slots(cfg: RunConfig) -> list[tuple[str, Spec]]:
    """Every selected component with its key, in pipeline order; a term with weight 0 is computed and logged
    but gives nothing to the others, so it is left out."""
    r = cfg.rollout
    out = [("task", cfg.task), ("select", cfg.select), ("rollout.generator", r.generator),
           ("rollout.builder", r.builder), *((f"rollout.transforms.{i}", t) for i, t in enumerate(r.transforms)),
           *((f"reward.terms.{i}", t) for i, t in enumerate(cfg.reward.terms)), ("filter", cfg.filter),
           ("replay", cfg.replay), ("advantage", cfg.advantage),
           *((f"advantage_transforms.{i}", t) for i, t in enumerate(cfg.advantage_transforms)),
           *((f"credit.{i}", t) for i, t in enumerate(cfg.credit)), ("teacher", cfg.teacher),
           *((f"loss.terms.{i}", t) for i, t in enumerate(cfg.loss.terms)), ("driver", cfg.driver)]
    return [(k, s) for k, s in out if s.weight != 0]


def _check_abilities(cfg: RunConfig) -> None:
    """Every ability a selected component requires (``Entry.requires``; a loss term's teacher ``needs`` require a
    teacher) is provided by another selected one, and none provides what another ``conflicts`` with."""
    chosen = [(key, spec, registry(spec.kind).get(spec.name)) for key, spec in slots(cfg)]
    given = {a: (key, spec) for key, spec, e in chosen for a in e.abilities("provides", spec.cfg)}
    for key, spec, entry in chosen:
        needs = entry.needs_of(spec.cfg) if spec.kind == "loss" else ()
        wants = (*entry.abilities("requires", spec.cfg), *(n for n in ("teacher", "teacher_topk") if n in needs),
                 *(("teacher",) if "teacher_vocab" in needs else ()))
        for ability in dict.fromkeys(wants):
            if ability not in given:
                raise ConfigError(f"{key}: {spec.kind} '{spec.name}' requires {ability!r}, which no selected "
                                  f"component provides; allowed: add {' or '.join(providers(ability))}")
        for ability in entry.abilities("conflicts", spec.cfg):
            other = [(k, s) for k, s, e in chosen if s is not spec and ability in e.abilities("provides", s.cfg)]
            if other:
                raise ConfigError(f"{key}: {spec.kind} '{spec.name}' cannot run with {other[0][1].kind} "
                                  f"'{other[0][1].name}' ({other[0][0]}): both {ability!r}; allowed: one of them")


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
            try:
                default = e.abilities("provides", e.config())
            except Exception:  # a config class without defaults for every field: named if its doc names it
                default = (ability,) if ability in (e.provides.__doc__ or "") else ()
            doc = (e.provides.__doc__ or "").strip().splitlines()
            if ability in default:
                out.append(f"{e.kind} '{e.name}'")
            elif doc and ability in e.provides.__doc__:
                out.append(f"{e.kind} '{e.name}' ({doc[0].strip().rstrip('.')})")
    return out or ["a component that provides it (none is registered)"]


def _check_importance_sampling(cfg: RunConfig) -> None:
    """An importance-sampling mode needs a generator whose completions carry its own sampling log-probs."""
    mode, gen = cfg.loss.importance_sampling.mode, cfg.rollout.generator.name
    if mode != "none" and not registry("generator").get(gen).logprobs:
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
        why = worker_refusal(registry(spec.kind).get(spec.name))
        if why:
            raise ConfigError(f"{where}: {spec.kind} '{spec.name}' {why}, which would live in a Ray worker; "
                              "allowed with rollout.workers: 0 (its shards then run in this process)")


def _check_async(cfg: RunConfig) -> None:
    """``rollout.max_async_level`` > 0 runs the rollout stage on a weight snapshot while a background thread
    updates the policy: the generator must be rebuildable on a snapshot, and nothing in the rollout stage may
    read the weights being updated (``loop/lag.py``)."""
    k, gen = cfg.rollout.max_async_level, cfg.rollout.generator.name
    entry = registry("generator").get(gen)
    if not entry.snapshot:
        ok = [n for n in registry("generator").names() if registry("generator").get(n).snapshot]
        raise ConfigError(f"rollout.max_async_level={k}: generator '{gen}' cannot sample from a weight snapshot; "
                          f"allowed: rollout.max_async_level=0, or generator {' | '.join(ok)}")
    for key, on, why in (
            ("rollout.workers", cfg.rollout.workers > 0, "Ray workers hold the current weights, not a snapshot"),
            ("trainer.data_parallel", cfg.trainer.data_parallel == "fsdp", "FSDP gathers weights collectively"),
            ("teacher", "reads_live_policy" in registry("teacher").get(cfg.teacher.name).abilities(
                "provides", cfg.teacher.cfg), f"teacher '{cfg.teacher.name}' reads the weights being updated")):
        if on:
            raise ConfigError(f"rollout.max_async_level={k}: not built with {key} here ({why}); allowed: "
                              f"rollout.max_async_level=0 with it")


def _check_out_dir(cfg: RunConfig, lines: _Lines) -> None:
    """``<out_dir>/<name>`` must be creatable: its nearest existing ancestor (or itself) is a directory."""
    path = cfg.run_dir
    while not path.exists() and path != path.parent:
        path = path.parent
    if path.exists() and not path.is_dir():
        key = "name" if path == cfg.run_dir else "out_dir"
        _fail(lines, (key,), f"{getattr(cfg, key)!r}: {path} is a file; allowed: a directory (or a path that "
                             "does not exist yet)")


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path) or "<root>"


def _fail(lines: _Lines, path: tuple[str, ...], msg: str,
          at: tuple[str, ...] | None = None) -> typing.NoReturn:
    """Raise ``<file:line or override of at (default path)>: <path>: msg``."""
    where = lines.where(path if at is None else at)
    raise ConfigError(f"{where + ': ' if where else ''}{_dotted(path)}: {msg}")


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
        _fail(lines, path, str(e), at=_blame(path, raw, str(e)))


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
    """A finite float (``.nan`` / ``.inf`` fail: they pass range checks such as ``lr > 0`` and poison the run;
    the ``INFINITE`` knobs never reach here with an infinity)."""
    out = None
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        with contextlib.suppress(ValueError, OverflowError):  # OverflowError: an integer beyond float range
            out = float(value)
    if out is None:
        _fail(lines, path, f"expected a number, got {value!r}")
    if not math.isfinite(out):
        _fail(lines, path, f"{value!r} is not allowed; allowed: a finite number")
    return out


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
