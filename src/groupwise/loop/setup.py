"""Build every component of a run from its config, once: the typed ``Pipeline`` every driver runs.

``build(cfg)`` resolves each ``Spec`` into a bound object with ``bind`` (its registry entry's ``Entry.build``: the one
way any component of any kind is made, loss and reward terms included), one field per stage, each typed by its
stage's Protocol; nothing on the hot path looks a name up again. Declared
abilities (``Entry.stateful`` / ``Entry.reports``) decide which parts are checkpointed and which report
metrics. Build order: the task, the model (and, when a checkpoint is given, its weights; the initial
weights stay available as ``env.initial_policy()`` for the KL reference and a frozen teacher), then the rest.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from groupwise.config import RunConfig, Spec, loss_needs
from groupwise.eval.evaluate import forced_prefix_ids
from groupwise.log import Progress, quiet_libraries
from groupwise.loop import workers
from groupwise.loop.pipeline import CountingGenerator, CountingTeacher, Part, Pipeline, encode
from groupwise.loop.record import Recorder
from groupwise.loop.sync_check import SyncCheck, tolerance
from groupwise.models import fsdp, lora
from groupwise.models.load import load_model, load_pretrained
from groupwise.parallel import data_parallel
from groupwise.registry import BuildEnv, ConfigError
from groupwise.rewards.stage import BoundTerm, RewardStage
from groupwise.tasks.base import Task
from groupwise.update import BoundLoss, Learner


def check_chat_template(cfg: RunConfig, task: Task, tokenizer, say: bool = True) -> None:
    """Chat-message prompts need the tokenizer's chat template: without one the roles would be dropped
    silently. Plain-text prompts fall back to plain text, said once (``say``: the process that does the I/O)."""
    first = next(iter(task.test), None)
    if not cfg.model.chat_template or first is None or getattr(tokenizer, "chat_template", None):
        return
    if not isinstance(first.prompt, str):
        raise ConfigError(f"model.chat_template: the tokenizer of '{cfg.model.path}' has no chat template, "
                          "but the task's prompts are chat messages; allowed: model.chat_template=false "
                          "(the messages' texts joined by newlines), or a model whose tokenizer has a "
                          "chat template")
    if say:
        print(f"groupwise: model.chat_template: the tokenizer of '{cfg.model.path}' has no chat template; prompts "
              "are fed as plain text (model.chat_template=false says so and silences this)", file=sys.stderr)


def _load_policy(cfg: RunConfig, task: Task, checkpoint: Path | None, screen: Progress | None,
                 train: bool = True) -> tuple[Any, Any, Any]:
    """(policy, tokenizer, initial_policy()): the initial weights are kept (as a frozen copy, made on first
    use) also when the policy is resumed from a checkpoint; a LoRA policy's are its base (``lora.BaseView``)."""
    first, tokenizer = load_model(cfg.model, task, screen, cfg.seed, train)
    policy = first
    if checkpoint is not None and cfg.model.lora is not None:
        lora.load_weights(policy, checkpoint / "model")
    elif checkpoint is not None:
        policy, tokenizer = load_pretrained(checkpoint / "model", cfg.model.dtype, cfg.model.device)
    frozen: list[torch.nn.Module] = []

    def initial_policy() -> torch.nn.Module:
        if not frozen and cfg.model.lora is not None:  # the frozen base: the adapter switched off
            frozen.append(lora.BaseView(policy))
        if not frozen:
            frozen.append((copy.deepcopy(first) if first is policy else first).eval().requires_grad_(False))
        return frozen[0]

    return policy, tokenizer, initial_policy


def _generator(cfg: RunConfig, env: BuildEnv, policy: torch.nn.Module, tokenizer) -> CountingGenerator:
    """The run's generator, counted and its weight syncs checked; with ``rollout.tools``, inside the multi-turn
    tool loop (``loop/tools.py``; the sync probe goes to the engine inside it)."""
    engine = bind("generator", cfg.rollout.generator, env).obj
    generator = engine
    if cfg.rollout.tools is not None:
        from groupwise.loop import tools

        generator = tools.wrap(engine, cfg.rollout.tools, env.task, env.tokenizer, cfg.model.path)
    return CountingGenerator(generator, sync_check(cfg, env.task, tokenizer), cfg.rollout.generator.name, policy,
                             engine)


def prompt_tools(cfg: RunConfig, task: Task) -> list[dict] | None:
    """The tool schemas rendered into every prompt (``rollout.tools.protocol: chat`` with tools), else None."""
    if cfg.rollout.tools is None or cfg.rollout.tools.protocol != "chat":
        return None
    from groupwise.loop import tools

    return tools.schemas(cfg.rollout.tools, task)


def prompt_encoder(cfg: RunConfig, task: Task, tokenizer) -> Callable[[Any], torch.Tensor]:
    """``pipeline.encode`` with the run's chat-template setting and tool schemas bound: a problem's prompt ids."""
    return functools.partial(encode, tokenizer=tokenizer, chat_template=cfg.model.chat_template,
                             tools=prompt_tools(cfg, task))


def sync_check(cfg: RunConfig, task: Task, tokenizer) -> SyncCheck | None:
    """The run's weight-sync check (``rollout.sync_check``); none with ``none`` or when the generator's log-probs are
    scripted (``logprobs=False``: nothing to compare). The probe prompt is the task's first training problem; the
    tolerance's default follows the sampler's precision (``model.dtype``, or bfloat16 / int8 for the ``hf`` generator's
    ``dtype: bf16`` or ``int8``, whose probe gap is its rounding)."""
    r = cfg.rollout
    if r.sync_check == "none" or not r.generator.entry.logprobs:
        return None
    sampler = {"bf16": "bfloat16", "int8": "int8"}.get(getattr(r.generator.cfg, "dtype", "model"), cfg.model.dtype)
    return SyncCheck(r.sync_check, tolerance(r.sync_check_tol, sampler),
                     prompt_encoder(cfg, task, tokenizer)(task.train[0]), tokenizer.pad_token_id)


def bind(key: str, spec: Spec, env: BuildEnv) -> Part:
    """The one way a config ``Spec`` becomes a component: its registry entry builds it (``Entry.build``: a
    factory's ``factory(cfg, env)``, a function's config bound), kept with its entry (declared abilities) and the
    key a checkpoint stores its state under."""
    entry = spec.entry
    return Part(key, entry.build(spec.cfg, env), entry)


def _bind_terms(prefix: str, specs: tuple[Spec, ...], env: BuildEnv, parts: list[Part] | None) -> list[Part]:
    """Each weighted term built under ``<prefix><i>/<name>`` (added to ``parts``)."""
    bound = [bind(f"{prefix}{i}/{s.name}", s, env) for i, s in enumerate(specs)]
    if parts is not None:
        parts += bound
    return bound


def reward_terms(specs: tuple[Spec, ...], env: BuildEnv, parts: list[Part] | None = None) -> list[BoundTerm]:
    """The ``reward.terms``, built, each with its weight and metric label (added to ``parts``)."""
    bound = _bind_terms("reward", specs, env, parts)
    return [BoundTerm(p.entry.metric_name(s.cfg), s.weight, p.obj, p.entry) for p, s in zip(bound, specs)]


def loss_terms(specs: tuple[Spec, ...], env: BuildEnv, parts: list[Part] | None = None) -> list[BoundLoss]:
    """The ``loss.terms``, built, each with its weight and what it reads (its entry's ``needs`` for its config)."""
    bound = _bind_terms("loss", specs, env, parts)
    return [BoundLoss(s.name, s.weight, p.obj, p.entry, p.entry.needs_of(s.cfg)) for p, s in zip(bound, specs)]


def process_settings(cfg: RunConfig) -> None:
    """This process's settings for a run, before any data or model loads: torch's threads (``trainer.threads``),
    and no third-party progress bars (``log.quiet_libraries``)."""
    quiet_libraries()
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)


def build(cfg: RunConfig, checkpoint: Path | None = None, screen: Progress | None = None, io: bool = True,
          worker: bool = False, train: bool = True) -> Pipeline:
    """``io=False`` (the other ranks of a multi-process run): the rollout recorder writes nothing. ``worker``
    (inside a Ray rollout worker): no teacher, no reference model, and its shards run in that process.
    ``train=False`` (``groupwise eval``): the model's memory check counts its weights only. ``screen``: the run's,
    where a GGUF conversion or a warm start built on first use shows as its own phase (``models/load.py``)."""
    process_settings(cfg)
    task = bind("task", cfg.task, BuildEnv(run=cfg, seed=cfg.seed)).obj
    policy, tokenizer, initial = _load_policy(cfg, task, checkpoint, screen, train)
    check_chat_template(cfg, task, tokenizer, say=io and not worker)
    e = cfg.eval  # a bad eval.forced_prefix fails here, not at the first eval
    forced_prefix_ids(tokenizer, e.forced_prefix, e.max_completion_tokens or cfg.rollout.max_completion_tokens)
    env = BuildEnv(run=cfg, seed=cfg.seed, task=task, policy=policy, tokenizer=tokenizer, initial_policy=initial,
                   encode=prompt_encoder(cfg, task, tokenizer))
    parts: list[Part] = []

    def make(key: str, spec: Spec) -> Any:
        parts.append(bind(key, spec, env))
        return parts[-1].obj

    selector, builder = make("selector", cfg.select), make("builder", cfg.rollout.builder)
    transforms = [make(f"transform{i}", t) for i, t in enumerate(cfg.rollout.transforms)]
    terms = reward_terms(cfg.reward.terms, env, parts)
    filter_, buffer = make("filter", cfg.filter), make("buffer", cfg.replay)
    needs = loss_needs(cfg) if not worker else set()  # a worker only builds and scores rollouts
    # like the reference model, a teacher exists only when an active loss term reads it
    teacher = make("teacher", cfg.teacher) if needs & {"teacher", "teacher_topk", "teacher_vocab"} else None
    counted = CountingTeacher(teacher) if teacher is not None else None
    ref = initial() if "ref" in needs else None  # made before sharding: a full replica (models/fsdp.py)
    if cfg.trainer.data_parallel == "fsdp" and data_parallel()[1] > 1 and not worker:
        fsdp.shard(policy)  # in place: every component built above holds the sharded policy
    learner = Learner.from_config(policy, cfg, tokenizer.pad_token_id, loss_terms(cfg.loss.terms, env, parts), ref,
                                  counted)
    resume_step = int(checkpoint.name.split("_")[-1]) if checkpoint is not None else None
    # the recorder's teacher gap: the pipeline's own policy pass, and the bare teacher (uncounted in teacher/*);
    # its sampler-trainer gap: the update's π_old, when the generator's log-probs are its sampling distribution's
    recorder = Recorder(cfg.run_dir if io else None, cfg.trainer.record_groups if io else 0, tokenizer, task,
                        resume_step, teacher, functools.partial(learner.logprobs, policy),
                        learner.old_logprobs if cfg.rollout.generator.entry.logprobs else None)
    rc = cfg.reward
    reward = RewardStage(task, terms, rc.verifier_timeout_s, rc.term_timeout_s, rc.verifier_isolation,
                         rc.fail_fast, rc.worker_memory_mb)
    pipe = Pipeline(
        cfg=cfg, task=task, policy=policy, tokenizer=tokenizer, selector=selector,
        generator=_generator(cfg, env, policy, tokenizer), builder=builder,
        transforms=transforms, reward=reward, filter=filter_,
        advantage=make("advantage", cfg.advantage),
        advantage_transforms=[make(f"advantage_transform{i}", t) for i, t in enumerate(cfg.advantage_transforms)],
        replay=buffer, credit=[make(f"credit{i}", c) for i, c in enumerate(cfg.credit)], teacher=counted,
        learner=learner, parts=parts, prompt_tools=prompt_tools(cfg, task), recorder=recorder)
    pipe.shards = workers.InProcess(pipe) if worker or not cfg.rollout.workers else workers.RayWorkers(pipe, build)
    if cfg.rollout.max_async_level and train and not worker:  # rollouts on a weight snapshot (loop/lag.py)
        from groupwise.loop.lag import Lag

        # the snapshot's generator is checked against the snapshot (``Lag.at`` syncs it after each copy)
        pipe.lag = Lag(pipe, lambda model: _generator(cfg, dataclasses.replace(env, policy=model), model, tokenizer),
                       cfg.rollout.generator.entry.own_weights)
    return pipe
