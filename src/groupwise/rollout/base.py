"""The Generator, GroupBuilder and GroupTransform protocols, sampling parameters, and the context handed to
group builders, transforms, selectors and replay buffers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from groupwise.adapters import base_model
from groupwise.lazy import torch
from groupwise.types import Completion, Group, Problem, Sample

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()


@dataclasses.dataclass
class Request:
    """One row to generate. ``prefix`` tokens are forced (prefilled) before sampling starts and count
    toward ``max_tokens``; a row-level ``max_tokens`` overrides the params' cap (per-mode caps). ``problem``: the
    problem the prompt asks (set by ``sample_groups`` and the eval; a task's environment episodes need it,
    ``loop/tools.py``); engines ignore it."""

    prompt_ids: Tensor  # [P] long
    prefix: tuple[int, ...] = ()
    max_tokens: int | None = None
    problem: Problem | None = None


@runtime_checkable
class Generator(Protocol):
    """A sampling engine.

    ``generate`` returns exactly one Completion per request, in order. ``rollout_logprobs`` are the sampler's
    own log-probs of the returned tokens under the distribution it drew from, logits / temperature over the
    full vocabulary (before top-p: on the trainer's support, see ``types.Completion``); for temperature 0 they
    are the temperature-1 log-probs. A generator registered with ``logprobs=False`` returns scripted values.
    Identical prompts may share one prefill.
    ``sync_weights`` is called after every optimizer step (a no-op when the generator shares the
    training model's parameters, as the ``hf`` backend does); it returns True only when the engine samples from
    ``model``'s own parameters, so nothing can go stale and the weight-sync check (``loop/sync_check.py``)
    skips its probe; any other return (None) means "probe me": an engine holding a copy must not return True (the
    check verifies the claim, ``sync_check.shares``: the engine's ``model`` holds ``model``'s parameter storage;
    an engine without one, or a false claim, is probed as a copy).
    Two optional methods, for engines that hold
    memory or processes (``vllm``): ``release()``, called when a step's rollout stage ends (free memory for
    the update; the next ``generate`` takes it back), and ``close()``, called once when the run ends.
    """

    def generate(self, requests: list[Request], params: SamplingParams, rng: torch.Generator) -> list[Completion]: ...

    def sync_weights(self, model: torch.nn.Module) -> bool | None: ...


def eos_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS and every EOS of the model's generation config, those
    inside the model's vocabulary (an id past it can never be sampled)."""
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = {tokenizer.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])}
    vocab = getattr(getattr(base_model(model), "config", None), "vocab_size", None)
    return sorted(e for e in eos if e is not None and (vocab is None or e < vocab))


def release(generator) -> None:
    """Tell a generator the rollout stage is over (its optional ``release``; see ``Generator``)."""
    if hasattr(generator, "release"):
        generator.release()


def close(generator) -> None:
    """Shut a generator down at the end of a run (its optional ``close``; see ``Generator``)."""
    if hasattr(generator, "close"):
        generator.close()


@runtime_checkable
class GroupBuilder(Protocol):
    """Turns the step's problems into groups of samples, unscored (the loop scores every returned group).

    A builder shapes how samples are produced: forced prefixes, per-row caps, several generator calls (trees,
    draft-then-answer). It may set ``Sample.disqualified`` to grade a sample incorrect without verifying it
    (e.g. a rollout that broke its mode's cap)."""

    def __call__(self, problems: list[Problem], ctx: RolloutContext) -> list[Group]: ...


@runtime_checkable
class GroupTransform(Protocol):
    """Rewrites scored groups (drop, resample, edit, append); samples it creates or edits must be scored with
    ``ctx.score`` (the loop checks that every sample reaching the advantage stage was scored)."""

    def __call__(self, groups: list[Group], ctx: RolloutContext) -> list[Group]: ...


@dataclasses.dataclass
class RolloutContext:
    """What a group builder or transform may use: generation, scoring, and teacher-forced log-probs."""

    generator: Generator
    tokenizer: Any
    task: Any
    score: Callable[[list[Group]], None]  # the reward stage: fills correct / reward / reward_terms in place
    params: SamplingParams
    group_size: int
    step: int
    rng: Callable[[str], torch.Generator]  # a generator seeded from (run seed, step, stage)
    encode: Callable[[Problem], Tensor]  # prompt token ids
    policy_logprobs: Callable[..., list[Tensor]]  # (samples, vocab=False): teacher-forced, current policy, no grad
    model: Any = None  # the policy itself, for components that probe it (e.g. attention maps); never train it here
    eos_id: int = 0
    teacher: Any = None  # the run's teacher (teachers.Teacher, passes counted), for transforms that need it early
    check: Callable[[Problem, str], bool] | None = None  # the run's bounded verifier (timeout / isolation); raises

    def sample_groups(self, problems: list[Problem], n: int | None = None, prefixes=None,
                      max_tokens=None, stage: str = "rollout") -> list[Group]:
        """Generate ``n`` (default G) samples per problem and return unscored groups.

        ``prefixes[i][j]`` / ``max_tokens[i][j]`` optionally set the forced prefix / cap of sample j of
        problem i. Forced prefix tokens get ``loss_mask=False``.
        """
        n = n or self.group_size
        prompts = [self.encode(p) for p in problems]
        reqs = [Request(prompts[i], tuple(prefixes[i][j]) if prefixes else (),
                        max_tokens[i][j] if max_tokens else None, problems[i])
                for i in range(len(problems)) for j in range(n)]
        outs = self.generator.generate(reqs, self.params, self.rng(stage))
        groups = []
        for i, p in enumerate(problems):
            samples = [to_sample(prompts[i], c, self.tokenizer) for c in outs[i * n:(i + 1) * n]]
            groups.append(Group(problem=p, samples=samples, step=self.step))
        return groups


def verified(ctx: RolloutContext, problem: Problem, text: str) -> bool:
    """The verdict on ``text`` for a transform's diagnostic check, through the run's bounded verifier (the
    reward stage's timeout and isolation; the task's own ``verify`` where a context has none); a verifier that
    raises or times out means "not verified", never a crash or a hang of the transform."""
    try:
        return bool((ctx.check or ctx.task.verify)(problem, text))
    except Exception:  # noqa: BLE001
        return False


def to_sample(prompt_ids: Tensor, c: Completion, tokenizer) -> Sample:
    forced = c.forced if c.forced is not None else torch.zeros_like(c.completion_ids, dtype=torch.bool)
    text = tokenizer.decode(c.completion_ids.tolist(), skip_special_tokens=True)
    return Sample(prompt_ids=prompt_ids, completion_ids=c.completion_ids, rollout_logprobs=c.rollout_logprobs,
                  loss_mask=~forced, finish_reason=c.finish_reason, text=text, meta=dict(c.meta))


def char_ends(ids: list[int], tokenizer) -> list[int]:
    """ends[k] = length of the decoded text of ids[:k+1] (the completion text as ``to_sample`` decodes it)."""
    pieces = [tokenizer.decode([t], skip_special_tokens=True) for t in ids]
    full = tokenizer.decode(ids, skip_special_tokens=True)
    if "".join(pieces) == full:  # per-token decoding is exact (character and tag vocabularies)
        out, n = [], 0
        for p in pieces:
            n += len(p)
            out.append(n)
        return out
    return [len(tokenizer.decode(ids[:k + 1], skip_special_tokens=True)) for k in range(len(ids))]


def token_index(ends: list[int], char: int) -> int | None:
    """The number of tokens whose text ends exactly at ``char`` (None if ``char`` is inside a token)."""
    if char == 0:
        return 0
    for k, e in enumerate(ends):
        if e == char:
            return k + 1
        if e > char:
            return None
    return None
