"""Shared by the replay tests: hand-made stored groups and a recording stand-in for the rollout context."""

import dataclasses
import math

import torch

from groupwise.types import Group, Problem, Sample


def sample(logprobs, advantage=0.0, reward=None, correct=None, mask=None):
    """A sample whose generator log-probs are ``logprobs`` (one per completion token)."""
    lp = torch.tensor(logprobs, dtype=torch.float32)
    n = lp.numel()
    reward = float(advantage > 0) if reward is None else reward
    return Sample(prompt_ids=torch.tensor([5, 6, 7]), completion_ids=torch.arange(10, 10 + n),
                  rollout_logprobs=lp,
                  loss_mask=torch.ones(n, dtype=torch.bool) if mask is None else torch.tensor(mask),
                  finish_reason="stop", reward=reward,
                  correct=bool(reward > 0) if correct is None else correct, meta={"adv": advantage})


def advantages(groups):
    """The [N, G] advantages the test assigned to each sample (``sample(..., advantage)``), zero-padded."""
    out = torch.zeros(len(groups), max((len(g.samples) for g in groups), default=0), dtype=torch.float64)
    for i, g in enumerate(groups):
        for j, s in enumerate(g.samples):
            out[i, j] = s.meta["adv"]
    return out


def add(buf, groups, step):
    """Offer ``groups`` to ``buf`` with their test-assigned advantages, as the engine does after an update."""
    buf.add(groups, advantages(groups), step)


def replayed_groups(out):
    """The groups of a buffer's ``sample`` result (each a ``Replayed`` with its stored advantages)."""
    return [r.group for r in out]


def group(samples, step=0, pid="p"):
    problem = Problem(id=pid, prompt="1+1", answer="2", meta={"xs": (1, 1)})
    return Group(problem=problem, samples=samples, step=step)


def mixed_group(pid, step=0, pos=-0.5, neg=-0.5, tokens=2):
    """Two samples, a success (A = +1, tokens at log-prob ``pos``) and a failure (A = -1, at ``neg``):
    H(π_gen) = ((1 - e^pos) + e^neg) / 2."""
    return tag([group([sample([pos] * tokens, 1.0), sample([neg] * tokens, -1.0)], step=step, pid=pid)])[0]


class Ctx:
    """A rollout-context stand-in that records every ``policy_logprobs`` call. The "current policy" gives a
    stored sample its generator log-probs plus ``shift[pid]`` (NaN read as -2), or ``current[(pid, row)]``
    when given; generation is forbidden."""

    def __init__(self, shift=None, current=None, seed=0):
        self.shift, self.current = shift or {}, current or {}
        self.calls: list[list[Sample]] = []
        self.seed = seed

    def policy_logprobs(self, samples):
        self.calls.append(list(samples))
        out = []
        for s in samples:
            key = (s.meta.get("pid"), s.meta.get("row"))
            if key in self.current:
                out.append(torch.tensor(self.current[key], dtype=torch.float32))
            else:
                shift = self.shift.get(s.meta.get("pid"), 0.0)
                out.append(torch.nan_to_num(s.rollout_logprobs, nan=-2.0) + shift)
        return out

    def scanned(self):
        """Problem ids in the order their samples were passed, one entry per sample."""
        return [s.meta.get("pid") for call in self.calls for s in call]

    def rng(self, stage):
        return torch.Generator().manual_seed(self.seed * 1000 + len(stage))

    @property
    def generator(self):
        raise AssertionError("a replay buffer must not generate")


def tag(groups):
    """Mark each sample with its group's problem id and its row (the Ctx's lookup keys)."""
    for g in groups:
        for i, s in enumerate(g.samples):
            s.meta["pid"], s.meta["row"] = g.problem.id, i
    return groups


def close(a, b, tol=1e-6):
    return math.isclose(a, b, rel_tol=0, abs_tol=tol)


FAKE = ["rollout.generator.name=fake",
        "rollout.generator.completions=['<answer>0</answer>', '<answer>1</answer>']"]
TINY = ["model.warm_start=false", "task.modulus=2", "task.test_size=4", "rollout.prompts_per_step=3",
        "rollout.group_size=4", "rollout.max_completion_tokens=12", "trainer.threads=1", "seed=3"]


def components(*overrides):
    """A run's components on the untrained tiny model, with scripted completions whose groups are always mixed
    (answers 0 and 1 alternate; lab answers are 0 or 1 with modulus 2)."""
    from groupwise.config import load
    from groupwise.loop.setup import build

    return build(load(None, [*TINY, *FAKE, *overrides]))


def record_updates(c):
    """Wrap the learner so every update's rows are recorded (the samples as the update saw them, and each row's
    sequence advantage, read from the first loss token of its TokenBatch row)."""
    seen: list[list[tuple[Sample, float]]] = []
    real = c.learner.step

    def step(batch):
        first = [float(batch.advantages[i][batch.completion_mask[i]][0]) if batch.completion_mask[i].any() else 0.0
                 for i in range(len(batch.samples))]
        seen.append([(dataclasses.replace(s), a) for s, a in zip(batch.samples, first)])
        return real(batch)

    c.learner.step = step
    return seen
