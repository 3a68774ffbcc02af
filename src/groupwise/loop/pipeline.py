"""The ``Pipeline``: every stage of one policy's run, bound, and what the stages hand each other within a step
(``Rollout``, ``Work``). ``setup.build`` makes one; ``trainer.rl_step`` runs it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from groupwise.advantages import Advantage, AdvantageTransform
from groupwise.config import RunConfig
from groupwise.credit import Credit
from groupwise.filter import Filter
from groupwise.log import Progress, counting, work
from groupwise.loop.record import Recorder
from groupwise.loop.sync_check import Probe, SyncCheck, shares
from groupwise.models import fsdp
from groupwise.parallel import data_parallel
from groupwise.registry import Entry
from groupwise.replay import Buffer
from groupwise.rewards.stage import RewardStage
from groupwise.rollout.base import (
    Generator,
    GroupBuilder,
    GroupTransform,
    RolloutContext,
    SamplingParams,
    close,
    release,
)
from groupwise.seeding import stable_seed
from groupwise.select import Selector
from groupwise.tasks.base import Task, render_prompt
from groupwise.teachers import Teacher, TeacherWant
from groupwise.types import Group, Problem, Replayed, Sample, ScoredBatch, TeacherOutput, TokenBatch
from groupwise.update import Learner


class CountingGenerator:
    """Wraps a Generator and counts what it does: completion ``tokens``, ``prompt_tokens`` and ``seconds``
    (reset by the driver each step). With a ``check`` (``rollout.sync_check``) it verifies, after every
    ``sync_weights`` and before its first generation, that the engine holds the weights of ``model``
    (``loop/sync_check.py``), except after a sync the engine reports shared (it samples from ``model``'s own
    parameters: the ``hf`` generator; ``Generator``) and the claim holds (``sync_check.shares``; a false claim is
    probed as a copy); the last ``probe`` is what a Ray worker sends back (``loop/workers.py``).
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
        with work(len(requests)):  # the screen's counter (an eval's, a step's generation): one per completion
            out = self.inner.generate(requests, params, rng)
        self.seconds += time.perf_counter() - t0
        self.tokens += sum(int(c.completion_ids.numel()) for c in out)
        self.prompt_tokens += sum(int(r.prompt_ids.numel()) for r in requests)
        return out

    def sync_weights(self, model, check_shared: bool = False) -> None:
        """``check_shared``: probe also an engine that shares ``model``'s parameters (a Ray worker: its policy
        came from the driver, and the probe is what the driver compares with its own)."""
        claimed = self.inner.sync_weights(model) is True
        shared = claimed and shares(self.engine, model)
        if self.check is not None and (check_shared or not shared):
            self._verify(model, false_claim=claimed and not shared)

    def _verify(self, model, logged: bool = True, false_claim: bool = False) -> None:
        said = " (its sync_weights returned True, yet it does not share the trainer's parameters)"
        with counting(None):  # the probe's completion is not one the screen's counter waits for
            self.probe = self.check.verify(f"generator '{self.name}'{said if false_claim else ''}", self.engine,
                                           model, lambda: self.inner.sync_weights(model), logged)

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


class Shards(Protocol):
    """Builds and scores the step's problems, shard by shard, in this process or in Ray actors (``loop/workers.py``:
    ``InProcess``, ``RayWorkers``); ``draws`` are the step's seed counters."""

    def __call__(self, problems: list[Problem], step: int, draws: dict) -> list[Group]: ...

    def sync_weights(self, policy: torch.nn.Module) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class Pending(Protocol):
    """An update running in the background (``Lagged.start``): ``result()`` joins it and returns its metrics."""

    def result(self) -> dict[str, float]: ...


class Lagged(Protocol):
    """Asynchronous rollouts (``rollout.max_async_level`` > 0; ``loop/lag.py``: ``Lag``): the kept weight versions,
    the snapshot pipeline (``view``) the rollout stage runs on, and the rollout run ahead (``ahead``)."""

    view: Pipeline
    mode: str  # the snapshot's check (``rollout.sync_check``)
    verified: int | None  # the version the snapshot was verified to hold (None: not checked)
    ahead: Rollout | None

    def keep(self, step: int) -> None: ...

    def at(self, step: int) -> tuple[Pipeline, int]: ...

    def take(self, step: int) -> Rollout | None: ...

    def behaviour(self, tokens: TokenBatch, step: int) -> None: ...

    def start(self, step: int, fn: Callable[[], dict[str, float]]) -> Pending: ...

    def capture(self) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


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
    shards: Shards | None = None  # builds and scores the step's rollout shards (``loop/workers.py``)
    lag: Lagged | None = None  # with rollout.max_async_level > 0: weight versions and the snapshot pipeline
    screen: Progress = dataclasses.field(default_factory=lambda: Progress(0, 0, False))  # the run's (its phases)
    prompt_tools: list[dict] | None = None  # tool schemas in every prompt (``rollout.tools.protocol: chat``)

    def encode(self, problem: Problem) -> Tensor:
        return encode(problem, self.tokenizer, self.cfg.model.chat_template, self.prompt_tools)

    def policy_logprobs(self, samples: list[Sample], vocab: bool = False) -> list[Tensor]:
        """The current policy's teacher-forced log-probs of stored samples (``Learner.logprobs``: the update's
        micro-batches and forward, so ``optim.shared_prefix`` applies): each row's sampled-token log-probs [T],
        or with ``vocab`` its whole log-softmax [T, V]."""
        return self.learner.logprobs(self.policy, samples, vocab)

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
        checks = [self.generator.check]  # the generator's and the Ray workers' probes (one SyncCheck)
        if self.lag is not None and self.lag.view.generator is not self.generator:  # the snapshot's own engine
            checks.append(self.lag.view.generator.check)  # (and, with Ray workers, theirs)
        got = [c.metrics() for c in checks if c is not None]
        if self.lag is not None and self.lag.mode != "none":  # the snapshot checked against the trainer's weights
            got.append(self.lag.metrics())
        if got:
            out.update({"sync/failures": sum(g["sync/failures"] for g in got),
                        "perf/sync_check_s": sum(g["perf/sync_check_s"] for g in got)})
            gaps = [g["sync/probe_dlogp"] for g in got if "sync/probe_dlogp" in g]
            if gaps:  # only a probe that ran has a gap (``SyncCheck.metrics``)
                out["sync/probe_dlogp"] = max(gaps)
        if self.teacher is not None:
            out.update(self.teacher.metrics())
        return out


def encode(problem: Problem, tokenizer, chat_template: bool = True, tools: list[dict] | None = None) -> Tensor:
    text = render_prompt(problem, tokenizer, chat_template, tools)
    return torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)


@dataclasses.dataclass
class Rollout:
    """One step's rollout stage, as the rest of the step reads it."""

    step: int
    groups: list[Group]  # kept by the filter: the step's training groups
    rollouts: list[Group]  # everything generated this step, refills included (rollout metrics, the recorder)
    seen: list  # the recorder's view of the shards' groups, before the transforms
    draws: dict  # the step's seed counters per (stage, shard): replay continues them
    filtered: dict[str, float]  # the filter's metrics
    metrics: dict[str, float]  # the rollout stage's components', staleness and perf metrics


@dataclasses.dataclass
class Work:
    """A step between its rollout stage and its update."""

    rollout: Rollout
    batch: ScoredBatch
    adv: Tensor  # [N, G]
    replayed: list[Replayed]
    tokens: TokenBatch
