"""The schema: one frozen dataclass per recipe section, every field a knob with its default and its range checks
(``__post_init__``: a one-line ``field=value: allowed ...``). A component slot is a ``Spec`` field
(``component`` / ``components``): its default is a registered name, its config that member's own class."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from groupwise.config.parse import Spec, build_spec


def component(kind: str, default: str | Mapping[str, Any]) -> Any:
    raw = {"name": default} if isinstance(default, str) else dict(default)
    return dataclasses.field(default_factory=lambda: build_spec(kind, dict(raw), "<default>", {}),
                             metadata={"kind": kind, "default": raw["name"]})


def components(kind: str, default: tuple[str | Mapping[str, Any], ...] = ()) -> Any:
    raws = [{"name": d} if isinstance(d, str) else dict(d) for d in default]
    return dataclasses.field(
        default_factory=lambda: tuple(build_spec(kind, dict(r), "<default>", {}) for r in raws),
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
    """A device torch accepts: ``cpu``, ``cuda``, ``cuda:<index>`` and ``mps`` are read here, any other string is
    asked of torch (so reading a recipe on such a device does not import torch)."""
    if re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        return True
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


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
    warm_start: bool | Literal["auto"] = "auto"
    """Start from the cached SFT warm start on the task's reference traces (``models/warm_start.py``). ``auto``:
    embedded models do, pretrained ones start as they are; ``true``: a pretrained model too (a format warm-up,
    its LoRA adapter merged in when ``model.lora`` is set); ``false``: neither."""
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

    @property
    def warm_starts(self) -> bool:
        """Whether this model starts from a warm start, as ``models/load.py`` decides: ``auto`` is true for an
        embedded model and false for a pretrained one, ``true`` for both, and never with ``warm_start_steps: 0``
        (else ``warm_start_steps``, ``_lr`` and ``_batch`` are unused)."""
        embedded = self.path.startswith("embedded:")
        return self.warm_start_steps > 0 and (self.warm_start is True or (self.warm_start == "auto" and embedded))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolsConfig:
    """Multi-turn rollouts with a task's tools or environment (``loop/tools.py``): the model calls a tool, the
    result is appended (masked out of the loss), and the model goes on."""

    protocol: Literal["text", "chat"] = "text"
    """``text``: the model writes ``<tool>query</tool>`` and gets ``<result>…</result>`` (one tool, ``tool``);
    ``chat``: the tokenizer's chat template carries them, as transformers and TRL do (the tools as OpenAI-style JSON
    schemas in the prompt, the model's own call format, ``tool`` messages; several tools, ``tools``), and a task's
    environment episodes (OpenEnv, verifiers) reply through it (``loop/chat_tools.py``)."""
    tool: str = "search"
    """``text``: the task's tool (``task.tools[tool]``)."""
    tools: tuple[str, ...] = ()
    """``chat``: the task's tools offered to the model; empty: all of them."""
    mcp: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, hash=False)
    """``chat``: MCP servers whose tools are offered too, by name: the command line of each, a stdio child process
    (``{calc: [python, servers/calc.py]}``; its tools ``calc_<tool>``; ``pip install 'groupwise[mcp]'``)."""
    max_turns: int = 4
    """Model turns per rollout (at most max_turns − 1 tool calls are run)."""
    turn_tokens: int = 32
    """New model tokens per turn (rollout.max_completion_tokens caps model and tool tokens together)."""
    result_tokens: int = 64
    """A tool result is cut to this many tokens (``text``: tags included; ``chat``: its content)."""
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
        bad = next((n for n, argv in self.mcp.items() if not n.isidentifier() or not argv), None)
        if bad is not None:
            raise ValueError(f"mcp.{bad}: allowed a name that is an identifier (the tools' prefix) with a non-empty "
                             "command line, e.g. {calc: [python, servers/calc.py]}")
        if self.protocol == "text" and self.mcp:
            raise ValueError("mcp: MCP tools go through the chat template; allowed with protocol=text: none, or "
                             "protocol=chat")
        if self.protocol == "text" and self.tools:
            raise ValueError(f"tools={list(self.tools)}: the chat protocol's; allowed with protocol=text: tool "
                             "(one tool), or protocol=chat")
        if self.protocol == "chat" and self.tool != "search":
            raise ValueError(f"tool={self.tool!r}: the text protocol's; allowed with protocol=chat: tools=[...] "
                             "(empty: every tool of the task)")


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
    trainer's weights (``loop/sync_check.py``): ``resync`` counts a stale engine in ``sync/failures``, syncs
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
    loop. Generators that support it are registered ``snapshot=True`` (``hf``, ``fake``: rebuilt on the copy) or
    ``own_weights=True`` (``vllm``: the engine is shared and loaded with the copy); Ray workers are given the
    copy's weights."""
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
    worker_memory_mb: int = 4096
    """The memory a worker process of user code (a verifier, a ``python`` reward function under ``process``
    isolation) may allocate beyond what it inherits from the trainer at the fork (``RLIMIT_AS``: address space,
    so a library that reserves large virtual ranges counts them); a call over it is a counted failure and the
    worker is replaced; 0: no limit."""
    fail_fast: bool = True
    """Stop the run after a step in which a reward term failed on every sample (it raised, timed out or
    returned no usable number each time: e.g. a conversational reward function on plain-text prompts), in one
    line naming it with its first error; false: keep going, the term adding nothing to those samples (its
    failures counted in ``reward/<term>_errors`` as always)."""

    def __post_init__(self) -> None:
        _rules(self, ("verifier_timeout_s", lambda v: v >= 0, ">= 0 (0 disables the timeout)"),
               ("term_timeout_s", lambda v: v >= 0, ">= 0 (0 disables the timeout)"),
               ("worker_memory_mb", lambda v: v >= 0, ">= 0 (0: no limit)"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImportanceSamplingConfig:
    """Sampler-trainer mismatch correction: every loss term's per-token loss is multiplied by a weight made of
    r = exp(old_logprobs − rollout_logprobs), per token, per row (the product over its loss tokens) or by the
    row's geometric mean, within the band [``clip_min``, ``cap``] (``losses/mismatch.py``). Under top-p both
    log-probs keep the full vocabulary's support, so r carries no kept-mass factor (docs/scaling.md)."""

    mode: Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_mask",
                  "seq_mask_tis"] = "none"
    """none: no weight (the loss as without this section, bit for bit); TRL's ``vllm_importance_sampling_mode``:
    ``*_truncate`` clamps r to the band, ``*_mask`` zeroes it outside (the tokens or rows stay in the denominators,
    as in TRL); ``geometric_mask`` (SkyRL's ``sequence_mask_metric: geometric``) zeroes the rows whose geometric-mean
    ratio leaves the band and weighs the others 1; ``seq_mask_tis`` (NeMo-RL / OpenRLHF) the same rows, the others
    weighed by their untruncated token r."""
    cap: float = 3.0
    """The band's upper bound: TRL's ``vllm_importance_sampling_clip_max`` (its default, 3); SkyRL's
    ``geo_mask_high`` (1.01), NeMo-RL's ``truncated_importance_sampling_ratio``."""
    clip_min: float | None = None
    """The band's lower bound: TRL's ``vllm_importance_sampling_clip_min`` (null: none); SkyRL's ``geo_mask_low``
    (0.99), NeMo-RL's ``truncated_importance_sampling_ratio_min``; needed by the geometric modes. ICEPOP's band is
    ``token_mask`` with clip_min 0.5, cap 5."""

    def __post_init__(self) -> None:
        _rules(self, ("cap", lambda v: v > 1, "> 1 (w = 1 is no mismatch; a cap at or below it truncates or "
                                              "masks matching tokens)"),
               ("clip_min", lambda v: v is None or 0 <= v < 1, "null or in [0, 1) (w = 1 is no mismatch; a bound "
                                                               "at or above it raises or masks matching tokens)"))
        if self.clip_min is not None and self.mode == "none":
            raise ValueError(f"clip_min={self.clip_min}: mode none applies no weight; allowed: clip_min null, or a "
                             "mode other than none")
        if self.clip_min is None and self.mode in ("geometric_mask", "seq_mask_tis"):
            raise ValueError(f"mode={self.mode} needs the band's lower bound; allowed: clip_min in [0, 1) (SkyRL "
                             "0.99, NeMo-RL 0.999) with cap (SkyRL 1.01, NeMo-RL 1.002)")


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
    shared_prefix: bool | None = None
    """Run each distinct prompt of a micro-batch once in the update's passes (policy, KL reference, behaviour
    log-probs of asynchronous rollouts, stored-sample log-probs for replay and the like): the G completions of a
    group share their prompt's forward and its share of the backward (``forward.shared_prefix_logprobs``), and the
    prefix all the micro-batch's prompts share (a system prompt) runs once too. The same log-probs and gradient as
    the unshared pass up to float summation order (``tests/unit/update/test_shared_prefix.py``: full fine-tuning,
    LoRA, the KL reference, left-padded prompts of different lengths; ``test_fsdp.py``, ``test_common_prefix.py``),
    so it is on by default; false runs every row's prompt (for measuring the saving, benchmarks/levers.py). Under
    FSDP the common prefix is not run apart (each pass must make as many model calls on every rank). A policy with
    dropout in training (a LoRA ``dropout`` > 0, or the model's own, e.g. GPT-2's 0.1) would share one dropout mask
    over a prompt's rows, which the unshared update does not: null (the default) is on except there, where it runs
    the unshared update; true asks for it and is refused there, in one line."""
    skip_inert_rows: bool = True
    """Rows that can carry no loss (all loss weights 0, or all-zero advantages under ``advantage_only`` terms) skip
    their forward and backward; false runs them anyway: the same update, for measuring the saving
    (benchmarks/levers.py)."""
    nonfinite: Literal["restore", "stop"] = "restore"
    """A step that leaves a parameter NaN/inf: ``restore`` the pre-step weights (keeps one copy of the trainable
    parameters each step; right for the lab's small models) or ``stop`` the run with a one-line error (no
    copy; for large models), the last checkpoint intact either way."""
    autocast: Literal["none", "bf16"] = "none"
    """``bf16``: the update's model passes (the policy's forward, whose backward then runs in the same dtypes; the
    KL reference; behaviour and stored-sample log-probs, ``Learner.logprobs``) run under ``torch.autocast`` to
    bfloat16 on the model's device: matmuls take bf16 inputs, while the weights, gradients and AdamW state stay fp32
    (standard mixed precision) and the log-softmax and sampled-token gather run in fp32 on the upcast logits
    (``forward._from_logits``). Inexact, so off by default: the trainer's log-probs move by the bf16 rounding of
    the activations and logits (SmolLM2-135M, ``benchmarks/real_model.py autocast``: mean |Δ log p| 6e-3 a token,
    max 0.2, the gradient 4-5% off in relative norm, for a 1.4-1.5x faster update on an avx512_bf16 CPU). PPO's ratio
    is still exactly 1 at the first epoch (``old_logprobs`` are that epoch's own detached log-probs, same numerics),
    but the generator's fp32 rollout log-probs now differ from the trainer's: ``mismatch/*`` measures it, and
    ``loss.importance_sampling`` corrects for it (recommended with bf16). The frozen teacher's pass
    (``standard/teachers.py``) stays at the model's dtype. Requires ``model.dtype: float32`` (a 16-bit model has
    nothing to autocast) and ``trainer.data_parallel: replicate`` (autocast under FSDP2 is not built or tested:
    ``models/fsdp.py`` has no mixed-precision policy); fp16 is not offered (it would need loss scaling)."""

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
    sinks: tuple[Literal["jsonl", "tensorboard", "wandb", "mlflow", "trackio"], ...] = ("jsonl", "tensorboard")
    """Where step metrics go besides the screen: ``metrics.jsonl``, TensorBoard, W&B / MLflow (``pip install
    groupwise[tracking]``), Trackio (``pip install groupwise[trackio]``: a local store, ``trackio show``)."""
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

    def slots(self) -> list[tuple[str, Spec]]:
        """Every selected component with its key, in pipeline order (the one list of the recipe's component
        slots; terms with weight 0 included)."""
        r = self.rollout
        return [("task", self.task), ("select", self.select), ("rollout.generator", r.generator),
                ("rollout.builder", r.builder), *((f"rollout.transforms.{i}", t) for i, t in enumerate(r.transforms)),
                *((f"reward.terms.{i}", t) for i, t in enumerate(self.reward.terms)), ("filter", self.filter),
                ("replay", self.replay), ("advantage", self.advantage),
                *((f"advantage_transforms.{i}", t) for i, t in enumerate(self.advantage_transforms)),
                *((f"credit.{i}", t) for i, t in enumerate(self.credit)), ("teacher", self.teacher),
                *((f"loss.terms.{i}", t) for i, t in enumerate(self.loss.terms)), ("driver", self.driver)]

    def specs(self) -> list[Spec]:
        """Every selected component, in pipeline order."""
        return [spec for _, spec in self.slots()]


