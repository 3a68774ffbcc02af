"""Build every component of a run from its config, once: the typed ``Pipeline`` every driver runs.

``build(cfg)`` resolves each ``Spec`` through the catalogue (``catalog.build``) into a bound object, one field
per stage, each typed by its stage's Protocol; nothing on the hot path looks a name up again. Declared
abilities (``Entry.stateful`` / ``Entry.reports``) decide which parts are checkpointed and which report
metrics. Build order: the task, the model (and, when a checkpoint is given, its weights; the initial
weights stay available as ``env.initial_policy()`` for the KL reference and a frozen teacher), then the rest.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from groupwise import catalog
from groupwise.advantages import Advantage, AdvantageTransform
from groupwise.config import RunConfig, loss_needs
from groupwise.credit import Credit
from groupwise.eval.evaluate import forced_prefix_ids
from groupwise.filter import Filter
from groupwise.loop import workers
from groupwise.loop.record import Recorder
from groupwise.loop.workers import ShardRunner
from groupwise.models import fsdp, lora
from groupwise.models.forward import completion_logprobs, pack
from groupwise.models.load import load_model, load_pretrained
from groupwise.registry import BuildEnv, ConfigError, Entry
from groupwise.replay import Buffer
from groupwise.rewards.stage import RewardStage, bind_terms
from groupwise.rollout.base import (
    Generator,
    GroupBuilder,
    GroupTransform,
    RolloutContext,
    SamplingParams,
    close,
    release,
)
from groupwise.rollout.sync_check import Probe, SyncCheck, tolerance
from groupwise.select import Selector
from groupwise.tasks.base import Task, render_prompt, stable_seed
from groupwise.teachers import Teacher, TeacherWant
from groupwise.types import Problem, Sample, TeacherOutput
from groupwise.update import Learner, data_parallel


class CountingGenerator:
    """Wraps a Generator and counts what it does: completion ``tokens``, ``prompt_tokens`` and ``seconds``
    (reset by the driver each step). With a ``check`` (``rollout.sync_check``) it verifies, after every
    ``sync_weights`` and before its first generation, that the engine holds the weights of ``model``
    (``rollout/sync_check.py``), except after a sync the engine reports shared (it samples from ``model``'s own
    parameters: the ``hf`` generator; ``Generator``); the last ``probe`` is what a Ray worker sends back
    (``loop/workers.py``).
    The probe's generation goes to ``engine`` (default ``inner``; under ``rollout.tools``, the engine inside the
    tool loop, so a probe never calls a tool) directly: it is not counted and draws from none of the run's
    streams."""

    def __init__(self, inner: Generator, check: SyncCheck | None = None, name: str = "",
                 model: torch.nn.Module | None = None, engine: Generator | None = None):
        self.inner, self.check, self.name, self.model = inner, check, name, model
        self.engine = engine if engine is not None else inner
        self.probe: Probe | None = None
        self.reset()

    def reset(self) -> None:
        self.tokens, self.prompt_tokens, self.seconds = 0, 0, 0.0

    def generate(self, requests, params, rng):
        if self.check is not None and self.probe is None and self.model is not None:
            self._verify(self.model, logged=False)  # the engine's first weights (vLLM starts from dummy ones)
        t0 = time.perf_counter()
        out = self.inner.generate(requests, params, rng)
        self.seconds += time.perf_counter() - t0
        self.tokens += sum(int(c.completion_ids.numel()) for c in out)
        self.prompt_tokens += sum(int(r.prompt_ids.numel()) for r in requests)
        return out

    def sync_weights(self, model, check_shared: bool = False) -> None:
        """``check_shared``: probe also an engine that shares ``model``'s parameters (a Ray worker: its policy
        came from the driver, and the probe is what the driver compares with its own)."""
        shared = self.inner.sync_weights(model) is True
        if self.check is not None and (check_shared or not shared):
            self._verify(model)

    def _verify(self, model, logged: bool = True) -> None:
        self.probe = self.check.verify(f"generator '{self.name}'", self.engine, model,
                                       lambda: self.inner.sync_weights(model), logged)

    def release(self) -> None:
        release(self.inner)

    def close(self) -> None:
        close(self.inner)


class CountingTeacher:
    """Wraps a Teacher and counts its passes per step: ``teacher/forwards``, ``rows``, ``tokens``, ``seconds``."""

    def __init__(self, inner: Teacher):
        self.inner = inner
        self.counts = dict.fromkeys(("forwards", "rows", "tokens", "seconds"), 0.0)

    def score(self, samples: list[Sample], problems: list[Problem], want: TeacherWant) -> TeacherOutput:
        t0 = time.perf_counter()
        out = self.inner.score(samples, problems, want)
        c = self.counts
        c["forwards"] += 1
        c["rows"] += len(samples)
        c["tokens"] += sum(s.length for s in samples)
        c["seconds"] += time.perf_counter() - t0
        return out

    def on_step(self, step: int, policy) -> None:
        self.inner.on_step(step, policy)

    def metrics(self) -> dict[str, float]:
        out = {f"teacher/{k}": v for k, v in self.counts.items()}
        self.counts = dict.fromkeys(self.counts, 0.0)
        return out


ROLLOUT_PARTS = ("selector", "builder", "transform", "reward", "filter")
"""Key prefixes of the parts the rollout stage runs; the buffer and the teacher run with the update."""


@dataclasses.dataclass(frozen=True)
class Part:
    """A built component, the key its state is checkpointed under, and its entry (declared abilities)."""

    key: str
    obj: Any
    entry: Entry


@dataclasses.dataclass
class Pipeline:
    """Every stage of one policy's run, bound (see ``trainer.rl_step`` for the order they run in)."""

    cfg: RunConfig
    task: Task
    policy: torch.nn.Module
    tokenizer: Any
    selector: Selector
    generator: CountingGenerator
    builder: GroupBuilder
    transforms: list[GroupTransform]
    reward: RewardStage
    filter: Filter
    advantage: Advantage
    advantage_transforms: list[AdvantageTransform]
    replay: Buffer
    credit: list[Credit]
    teacher: CountingTeacher | None
    learner: Learner
    parts: list[Part]
    recorder: Recorder
    shards: ShardRunner | None = None  # builds and scores the step's rollout shards (``loop/workers.py``)
    lag: Any = None  # ``lag.Lag`` with rollout.max_async_level > 0: weight versions and the snapshot pipeline

    def encode(self, problem: Problem) -> Tensor:
        return encode(problem, self.tokenizer, self.cfg.model.chat_template)

    @torch.no_grad()
    def policy_logprobs(self, samples: list[Sample], vocab: bool = False) -> list[Tensor]:
        """One teacher-forced pass of the current policy over stored samples (no grad, eval mode): each row's
        sampled-token log-probs [T], or with ``vocab`` its whole log-softmax [T, V] (callers chunk the rows)."""
        was = self.policy.training
        self.policy.eval()
        dev = next(self.policy.parameters()).device
        out: list[Tensor] = []
        for i in range(0, len(samples), 64):
            chunk = samples[i:i + 64]
            packed = pack([s.prompt_ids for s in chunk], [s.completion_ids for s in chunk],
                          self.learner.settings.pad_id, dev)
            fwd = completion_logprobs(self.policy, packed, self.cfg.rollout.temperature, with_vocab=vocab)
            lp = fwd.vocab_logprobs if vocab else fwd.logprobs
            out += [lp[k, :s.length].cpu() for k, s in enumerate(chunk)]
        self.policy.train(was)
        return out

    def context(self, step: int, shard: int | None = None, draws: dict | None = None) -> RolloutContext:
        """The step's context. ``ctx.rng(stage)`` seeds from (seed, step, stage, n-th draw of that stage this
        step, then the rank with several ranks and the ``shard`` index with several shards); ``draws`` holds
        the per-(stage, shard) counts, shared by every context of a step, so refills continue the streams and a
        shard built in a Ray worker continues from where the driver's count stands."""
        r = self.cfg.rollout
        draws = {} if draws is None else draws
        rank, world = data_parallel()
        ranked = ((rank,) if world > 1 else ()) + ((shard,) if shard is not None else ())

        def rng(stage: str) -> torch.Generator:
            n = draws.get((stage, shard), 0)
            draws[(stage, shard)] = n + 1
            return torch.Generator().manual_seed(stable_seed(self.cfg.seed, step, stage, n, *ranked))

        return RolloutContext(
            generator=self.generator, tokenizer=self.tokenizer, task=self.task,
            score=lambda groups: self.reward(groups, step),
            params=SamplingParams(r.max_completion_tokens, r.temperature, r.top_p, r.stop),
            group_size=r.group_size, step=step, rng=rng, encode=self.encode,
            policy_logprobs=self.policy_logprobs, model=self.policy, eos_id=self.tokenizer.eos_token_id,
            teacher=self.teacher, check=self.reward.check)

    def full_weights(self):
        """A context in which the policy has its whole weights on every rank (FSDP; a no-op otherwise)."""
        return fsdp.full_weights(self.policy)

    def trainer_state(self, optimizer: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a checkpoint holds besides the weights: the optimizer state (``optimizer``: one already gathered,
        under FSDP), the scheduler and every stateful part's state."""
        learner = self.learner
        out = {"optimizer": learner.optimizer.state_dict() if optimizer is None else optimizer,
               "scheduler": learner.scheduler.state_dict(),
               "components": {k: v.state_dict() for k, v in self.stateful().items()}}
        if self.lag is not None:  # the kept weight versions, and the rollout stage's state before its lag
            out["lag"] = self.lag.state_dict()
        return out

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        """The inverse of ``trainer_state``."""
        self.learner.load_optimizer(state["optimizer"])
        self.learner.scheduler.load_state_dict(state["scheduler"])
        for key, part in self.stateful().items():
            part.load_state_dict(state["components"][key])
        if self.lag is not None:
            self.lag.load_state_dict(state["lag"])

    def stateful(self) -> dict[str, Any]:
        """Components whose state is checkpointed, by key (those registered ``stateful=True``)."""
        return {p.key: p.obj for p in self.parts if p.entry.stateful}

    def rollout_parts(self) -> list[Part]:
        """The parts the rollout stage runs (``ROLLOUT_PARTS``): a lagged loop runs them ahead of the update."""
        return [p for p in self.parts if p.key.startswith(ROLLOUT_PARTS)]

    def component_metrics(self, rollout: bool) -> dict[str, float]:
        """Metrics of the parts registered ``reports=True``: with ``rollout`` those of the rollout stage (and
        the reward stage's failure counts, the shards'), read as it ends; else the others (and the teacher's
        pass counts), read after the update."""
        out: dict[str, float] = {}
        for p in self.parts:
            if p.entry.reports and p.key.startswith(ROLLOUT_PARTS) == rollout:
                out.update(p.obj.metrics())
        if rollout:
            out.update(self.reward.metrics())
            if self.shards is not None:
                out.update(self.shards.metrics())
            return out
        if self.generator.check is not None:  # the generator's and the Ray workers' probes (one SyncCheck)
            out.update(self.generator.check.metrics())
        if self.teacher is not None:
            out.update(self.teacher.metrics())
        return out


def encode(problem: Problem, tokenizer, chat_template: bool = True) -> Tensor:
    text = render_prompt(problem, tokenizer, chat_template)
    return torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)


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


def _load_policy(cfg: RunConfig, task: Task, checkpoint: Path | None, progress,
                 train: bool = True) -> tuple[Any, Any, Any]:
    """(policy, tokenizer, initial_policy()): the initial weights are kept (as a frozen copy, made on first
    use) also when the policy is resumed from a checkpoint; a LoRA policy's are its base (``lora.BaseView``)."""
    first, tokenizer = load_model(cfg.model, task, progress, cfg.seed, train)
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
    tool loop (``rollout/tools.py``; the sync probe goes to the engine inside it)."""
    engine = catalog.build(cfg.rollout.generator, env)
    generator = engine
    if cfg.rollout.tools is not None:
        from groupwise.rollout import tools

        generator = tools.wrap(engine, cfg.rollout.tools, env.task, env.tokenizer)
    return CountingGenerator(generator, sync_check(cfg, env.task, tokenizer), cfg.rollout.generator.name, policy,
                             engine)


def sync_check(cfg: RunConfig, task: Task, tokenizer) -> SyncCheck | None:
    """The run's weight-sync check (``rollout.sync_check``); none with ``none`` or when the generator's log-probs are
    scripted (``logprobs=False``: nothing to compare). The probe prompt is the task's first training problem."""
    r = cfg.rollout
    if r.sync_check == "none" or not catalog.registry(r.generator.kind).get(r.generator.name).logprobs:
        return None
    return SyncCheck(r.sync_check, tolerance(r.sync_check_tol, cfg.model.dtype),
                     encode(task.train[0], tokenizer, cfg.model.chat_template), tokenizer.pad_token_id)


def build(cfg: RunConfig, checkpoint: Path | None = None, progress=None, io: bool = True,
          worker: bool = False, train: bool = True) -> Pipeline:
    """``io=False`` (the other ranks of a multi-process run): the rollout recorder writes nothing. ``worker``
    (inside a Ray rollout worker): no teacher, no reference model, and its shards run in that process.
    ``train=False`` (``groupwise eval``): the model's memory check counts its weights only."""
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    task = catalog.build(cfg.task, BuildEnv(run=cfg, seed=cfg.seed))
    policy, tokenizer, initial = _load_policy(cfg, task, checkpoint, progress, train)
    check_chat_template(cfg, task, tokenizer, say=io and not worker)
    e = cfg.eval  # a bad eval.forced_prefix fails here, not at the first eval
    forced_prefix_ids(tokenizer, e.forced_prefix, e.max_completion_tokens or cfg.rollout.max_completion_tokens)
    env = BuildEnv(run=cfg, seed=cfg.seed, task=task, policy=policy, tokenizer=tokenizer, initial_policy=initial,
                   encode=lambda p: encode(p, tokenizer, cfg.model.chat_template))
    parts: list[Part] = []

    def make(key: str, spec) -> Any:
        entry = catalog.registry(spec.kind).get(spec.name)
        obj = entry.build(spec.cfg, env)
        parts.append(Part(key, obj, entry))
        return obj

    selector, builder = make("selector", cfg.select), make("builder", cfg.rollout.builder)
    transforms = [make(f"transform{i}", t) for i, t in enumerate(cfg.rollout.transforms)]
    terms = bind_terms(cfg.reward.terms, env)
    parts += [Part(f"reward{i}/{t.entry.name}", t.term, t.entry) for i, t in enumerate(terms)]
    filter_, buffer = make("filter", cfg.filter), make("buffer", cfg.replay)
    needs = loss_needs(cfg) if not worker else set()  # a worker only builds and scores rollouts
    # like the reference model, a teacher exists only when an active loss term reads it
    teacher = make("teacher", cfg.teacher) if needs & {"teacher", "teacher_topk", "teacher_vocab"} else None
    counted = CountingTeacher(teacher) if teacher is not None else None
    ref = initial() if "ref" in needs else None  # made before sharding: a full replica (models/fsdp.py)
    if cfg.trainer.data_parallel == "fsdp" and data_parallel()[1] > 1 and not worker:
        fsdp.shard(policy)  # in place: every component built above holds the sharded policy
    learner = Learner.from_config(policy, cfg, tokenizer.pad_token_id, ref, counted)
    resume_step = int(checkpoint.name.split("_")[-1]) if checkpoint is not None else None
    rc = cfg.reward
    reward = RewardStage(task, terms, rc.verifier_timeout_s, rc.term_timeout_s, rc.verifier_isolation,
                         rc.fail_fast)
    pipe = Pipeline(
        cfg=cfg, task=task, policy=policy, tokenizer=tokenizer, selector=selector,
        generator=_generator(cfg, env, policy, tokenizer), builder=builder,
        transforms=transforms, reward=reward, filter=filter_,
        advantage=catalog.build(cfg.advantage), advantage_transforms=[catalog.build(t) for t in cfg.advantage_transforms],
        replay=buffer, credit=[catalog.build(c) for c in cfg.credit], teacher=counted, learner=learner,
        parts=parts, recorder=Recorder(cfg.run_dir if io else None, cfg.trainer.record_groups if io else 0, tokenizer,
                                       task, resume_step, teacher))
    # the recorder's teacher gap: the pipeline's own policy pass, and the bare teacher (uncounted in teacher/*);
    # its sampler-trainer gap: the update's π_old, when the generator's log-probs are its sampling distribution's
    pipe.recorder.policy_logprobs = pipe.policy_logprobs
    if catalog.registry(cfg.rollout.generator.kind).get(cfg.rollout.generator.name).logprobs:
        pipe.recorder.trainer_logprobs = learner.old_logprobs
    pipe.shards = workers.InProcess(pipe) if worker or not cfg.rollout.workers else workers.RayWorkers(pipe)
    if cfg.rollout.max_async_level and train and not worker:  # rollouts on a weight snapshot (loop/lag.py)
        from groupwise.loop.lag import Lag

        # the snapshot's generator is checked against the snapshot (``Lag.at`` syncs it after each copy)
        pipe.lag = Lag(pipe, lambda model: _generator(cfg, dataclasses.replace(env, policy=model), model, tokenizer))
    return pipe
