"""The teacher kinds: ``privileged``, ``frozen``, ``ema`` and ``model``, one teacher-forced pass each.

Each is a weight source × a context:

  privileged  the policy's current weights (no copy; the pass runs in eval mode, no grad), fed a
              privileged context, by default the problem plus its verified solution (OPSD's teacher;
              prime-rl's ``opsd`` also uses the live policy)
  frozen      the initial policy (the same frozen copy as the KL reference, made once)
  ema         a decayed copy, θ_T ← d·θ_T + (1 − d)·θ after every update (d = ``decay``); checkpointed
  model       another local Hugging Face model directory (or ``embedded:<preset>``, the embedded model
              through the same loader); it must share the student's vocabulary (checked at build)

``context`` is a template over ``{prompt}`` (the problem's user text), ``{reference}`` (its reference
solution) and ``{answer}`` (its gold answer), rendered like any prompt (the tokenizer's chat template when it
has one); empty means the student's own prompt. The teacher's prompt is left-padded to the width of its own
micro-batch and the student's completion follows at the same column for every row (``models.forward.pack``),
so the outputs are completion-aligned whatever the contexts' lengths (tests/unit/teachers).

Outputs follow the student's support convention (types.TeacherOutput): the temperature-scaled softmax over
the full vocabulary at ``rollout.temperature``, no top-p / top-k truncation (the generator's behaviour
log-probs use the same convention, docs/conventions.md), so teacher/student gaps are unbiased by a kept
mass. ``top_k`` > 0 adds the teacher's k most likely tokens with the log of the mass outside them (tail,
floored at log 1e-12 so that a support holding all the mass stays finite).
Design choices: EMA decay 0.99 by default (≈ 100-step memory, the length of our lab runs; OPSD's reference
uses 0.999, TRL's SDPO 0.95); the privileged default template ``{prompt}\n<ref>{reference}</ref>`` uses the
embedded tokenizer's reference tags (for a real model, write a template in its own words).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

from groupwise.lazy import no_grad, torch
from groupwise.models.forward import completion_logprobs, pack
from groupwise.teachers import PRIVILEGED_CONTEXT, TEACHERS, TeacherWant, check_template, privileged_problem
from groupwise.types import Problem, Sample, TeacherOutput


def topk_support(vocab_logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [B, T, K], log-probs [B, T, K], tail [B, T] = log(1 − Σ_k p)) of a [B, T, V] log-softmax."""
    values, ids = vocab_logprobs.topk(k, dim=-1)
    kept = torch.logsumexp(values, dim=-1)  # log Σ_k p ≤ 0
    tail = torch.log(-torch.expm1(kept.clamp(max=-1e-12)))  # log(1 − e^kept), stable near kept = 0
    return ids, values, tail


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherConfig:
    context: str = ""
    """Template of the teacher's prompt over {prompt}, {reference}, {answer}; empty: the student's prompt."""
    top_k: int = 0
    """Also return the teacher's top-k support (+ tail mass); needed by terms that declare teacher_topk."""

    def __post_init__(self) -> None:
        check_template(self.context)
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}: must be >= 0 (0: no top-k support)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivilegedConfig(TeacherConfig):
    context: str = PRIVILEGED_CONTEXT

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.context:
            raise ValueError("context: the privileged teacher needs a privileged context (e.g. "
                             "'{prompt}\\n<ref>{reference}</ref>'); for the student's own prompt use 'frozen'")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EMAConfig(TeacherConfig):
    decay: float = 0.99
    """d in θ_T ← d·θ_T + (1 − d)·θ, applied after every update."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay={self.decay}: must be in [0, 1) (0 copies the policy after each step)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelTeacherConfig(TeacherConfig):
    path: str = ""
    """A local Hugging Face model directory with the student's vocabulary, or embedded:<preset>."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.path:
            raise ValueError("path: required (a local Hugging Face model directory)")


class ModelTeacher:
    """One teacher-forced pass of ``model()`` over (teacher context + the student's completion)."""

    def __init__(self, cfg: TeacherConfig, model: Callable[[], torch.nn.Module], env):
        self.cfg, self.model = cfg, model
        self.encode, self.pad_id = env.encode, env.tokenizer.pad_token_id
        self.temperature = env.run.rollout.temperature

    def context_ids(self, sample: Sample, problem: Problem) -> torch.Tensor:
        if not self.cfg.context:
            return sample.prompt_ids
        return self.encode(privileged_problem(problem, self.cfg.context))

    @no_grad
    def score(self, samples: list[Sample], problems: list[Problem], want: TeacherWant) -> TeacherOutput:
        model = self.model()
        dev = next(model.parameters()).device
        packed = pack([self.context_ids(s, p) for s, p in zip(samples, problems)],
                      [s.completion_ids for s in samples], self.pad_id, dev)
        was = model.training
        model.eval()
        try:
            fwd = completion_logprobs(model, packed, self.temperature, with_vocab=want.topk or want.vocab)
        finally:
            model.train(was)
        out = TeacherOutput(fwd.logprobs)
        if want.topk:  # its own k (``teacher_topk`` is provided only with top_k > 0)
            out.topk_ids, out.topk_logprobs, out.tail_logprob = topk_support(fwd.vocab_logprobs, self.cfg.top_k)
        if want.vocab:
            out.vocab_logprobs = fwd.vocab_logprobs
        return out

    def on_step(self, step: int, policy: torch.nn.Module) -> None:
        pass


class EMATeacher(ModelTeacher):
    """``ModelTeacher`` over its own decayed copy of the policy, moved in ``on_step`` and checkpointed."""

    def __init__(self, cfg: EMAConfig, env):
        self.weights = copy.deepcopy(env.policy).eval().requires_grad_(False)
        super().__init__(cfg, lambda: self.weights, env)
        self.decay = cfg.decay

    @no_grad
    def on_step(self, step: int, policy: torch.nn.Module) -> None:
        for t, p in zip(self.weights.parameters(), policy.parameters()):
            t.mul_(self.decay).add_(p.detach(), alpha=1.0 - self.decay)

    def state_dict(self) -> dict:
        return {"weights": {k: v.detach().clone() for k, v in self.weights.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.weights.load_state_dict(state["weights"])


def load_teacher_model(cfg: ModelTeacherConfig, env) -> torch.nn.Module:
    from groupwise.models.load import load_model

    model_cfg = dataclasses.replace(env.run.model, path=cfg.path, lora=None)  # the student's adapter is its own
    model, tokenizer = load_model(model_cfg, env.task, train=False)  # frozen: weights only
    if tokenizer.get_vocab() != env.tokenizer.get_vocab():
        raise ValueError(f"teacher.path={cfg.path!r}: its tokenizer's vocabulary differs from the student's; "
                         "token-level distillation needs the same vocabulary")
    return model.eval().requires_grad_(False)


def abilities(cfg: TeacherConfig) -> tuple[str, ...]:
    """Every teacher scores samples (``teacher``); with ``top_k`` > 0 also its top-k support (``teacher_topk``). The
    privileged teacher adds ``reads_live_policy``: it is the policy being trained, shown the reference."""
    return ("teacher",) + (("teacher_topk",) if cfg.top_k else ())


@TEACHERS.register("privileged", config=PrivilegedConfig, provides=lambda cfg: (*abilities(cfg), "reads_live_policy"))
def privileged(cfg: PrivilegedConfig, env) -> ModelTeacher:
    policy = env.policy
    return ModelTeacher(cfg, lambda: policy, env)


@TEACHERS.register("frozen", config=TeacherConfig, provides=abilities)
def frozen(cfg: TeacherConfig, env) -> ModelTeacher:
    initial = env.initial_policy()
    return ModelTeacher(cfg, lambda: initial, env)


@TEACHERS.register("ema", config=EMAConfig, stateful=True, provides=abilities)
def ema(cfg: EMAConfig, env) -> EMATeacher:
    return EMATeacher(cfg, env)


@TEACHERS.register("model", config=ModelTeacherConfig, provides=abilities)
def model(cfg: ModelTeacherConfig, env) -> ModelTeacher:
    weights = load_teacher_model(cfg, env)
    return ModelTeacher(cfg, lambda: weights, env)

