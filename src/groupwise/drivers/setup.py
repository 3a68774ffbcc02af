"""Build every component of a run from its config, once; shared by all drivers."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from groupwise.config import RunConfig
from groupwise.models.forward import completion_logprobs, pack
from groupwise.models.load import load_model, load_pretrained
from groupwise.rewards.scorer import Scorer
from groupwise.rollout.base import RolloutContext, SamplingParams
from groupwise.tasks.base import render_prompt, stable_seed
from groupwise.types import Group, Problem, Sample
from groupwise.update import Learner, build_optimizer


class CountingGenerator:
    """Wraps a Generator and counts what it does: completion ``tokens``, ``prompt_tokens`` and ``seconds``
    (reset by the driver each step)."""

    def __init__(self, inner):
        self.inner = inner
        self.reset()

    def reset(self) -> None:
        self.tokens, self.prompt_tokens, self.seconds = 0, 0, 0.0

    def generate(self, requests, params, rng):
        t0 = time.perf_counter()
        out = self.inner.generate(requests, params, rng)
        self.seconds += time.perf_counter() - t0
        self.tokens += sum(int(c.completion_ids.numel()) for c in out)
        self.prompt_tokens += sum(int(r.prompt_ids.numel()) for r in requests)
        return out

    def sync_weights(self, model) -> None:
        self.inner.sync_weights(model)


@dataclasses.dataclass
class Components:
    cfg: RunConfig
    task: Any
    policy: torch.nn.Module
    tokenizer: Any
    generator: Any
    scorer: Scorer
    builder: Any
    transforms: list[Any]
    filter: Any
    buffer: Any
    selector: Any
    teacher: Any
    learner: Learner

    def encode(self, problem: Problem) -> Tensor:
        text = render_prompt(problem, self.tokenizer, self.cfg.model.chat_template)
        return torch.tensor(self.tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)

    @torch.no_grad()
    def policy_logprobs(self, samples: list[Sample]) -> list[Tensor]:
        """One teacher-forced pass of the current policy over stored samples (no grad, eval mode)."""
        was = self.policy.training
        self.policy.eval()
        dev = next(self.policy.parameters()).device
        out: list[Tensor] = []
        for i in range(0, len(samples), 64):
            chunk = samples[i:i + 64]
            packed = pack([s.prompt_ids for s in chunk], [s.completion_ids for s in chunk],
                          self.learner.pad_id, dev)
            lp, _, _ = completion_logprobs(self.policy, packed, self.cfg.rollout.temperature)
            out += [lp[k, :s.length].cpu() for k, s in enumerate(chunk)]
        self.policy.train(was)
        return out

    def context(self, step: int) -> RolloutContext:
        r = self.cfg.rollout
        counters: dict[str, itertools.count] = {}

        def rng(stage: str) -> torch.Generator:  # (seed, step, stage, n-th use in this step)
            n = next(counters.setdefault(stage, itertools.count()))
            return torch.Generator().manual_seed(stable_seed(self.cfg.seed, step, stage, n))

        return RolloutContext(
            generator=self.generator, tokenizer=self.tokenizer, task=self.task,
            score=lambda groups: self.scorer(groups, step),
            params=SamplingParams(r.max_completion_tokens, r.temperature, r.top_p, r.stop),
            group_size=r.group_size, step=step, rng=rng, encode=self.encode,
            policy_logprobs=self.policy_logprobs, model=self.policy, eos_id=self.tokenizer.eos_token_id)

    def build_groups(self, problems: list[Problem], ctx: RolloutContext) -> list[Group]:
        groups = self.builder(problems, ctx)
        for transform in self.transforms:
            groups = transform(groups, ctx)
        return groups

    def parts(self) -> dict[str, Any]:
        """Every stateful-capable component, by a stable name (reward terms included)."""
        return {"selector": self.selector, "buffer": self.buffer, "builder": self.builder, "teacher": self.teacher,
                **{f"transform{i}": t for i, t in enumerate(self.transforms)},
                **{f"reward{i}/{name}": term for i, (name, _, term) in enumerate(self.scorer.terms)}}

    def component_metrics(self) -> dict[str, float]:
        """Metrics that components expose through an optional ``metrics() -> dict`` (e.g. a control loop)."""
        out: dict[str, float] = {}
        for part in self.parts().values():
            if hasattr(part, "metrics"):
                out.update(part.metrics())
        return out

    def stateful(self) -> dict[str, Any]:
        """Components whose state is checkpointed (by name)."""
        return {k: v for k, v in self.parts().items() if hasattr(v, "state_dict")}


def build(cfg: RunConfig, checkpoint: Path | None = None, progress=None) -> Components:
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    task = cfg.task.entry()(cfg.task.cfg, cfg.seed)
    policy, tokenizer = load_model(cfg.model, task, progress)
    ref = None
    if any("ref" in getattr(s.cfg, "needs", ()) for s in cfg.loss.terms if s.weight != 0):
        ref = copy.deepcopy(policy).eval().requires_grad_(False)  # the initial policy, also after a resume
    if checkpoint is not None:
        policy, tokenizer = load_pretrained(checkpoint / "model", cfg.model.dtype, cfg.model.device)
    generator = CountingGenerator(cfg.rollout.generator.entry()(cfg.rollout.generator.cfg, policy, tokenizer))
    teacher = cfg.teacher.entry()(cfg.teacher.cfg, policy, tokenizer)
    optimizer, scheduler = build_optimizer(policy, cfg.optim, cfg.trainer.steps)
    learner = Learner(policy, optimizer, scheduler, cfg.loss, cfg.optim,
                      tokenizer.pad_token_id, cfg.rollout.temperature, cfg.rollout.max_completion_tokens, ref,
                      teacher)
    return Components(
        cfg=cfg, task=task, policy=policy, tokenizer=tokenizer, generator=generator,
        scorer=Scorer(task, cfg.reward.terms, cfg.reward.verifier_timeout_s),
        builder=cfg.rollout.builder.entry()(cfg.rollout.builder.cfg),
        transforms=[t.entry()(t.cfg) for t in cfg.rollout.transforms],
        filter=cfg.filter.entry()(cfg.filter.cfg), buffer=cfg.replay.entry()(cfg.replay.cfg),
        selector=cfg.select.entry()(cfg.select.cfg, task, cfg.seed), teacher=teacher, learner=learner)
