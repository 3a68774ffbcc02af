"""``informative``: the ``random`` selector's draws, minus the prompts whose history predicts a zero-variance group,
skipped before anything is generated for them (issue 45's inexact speed lever).

A group whose G rewards are all equal has zero advantage everywhere: GRPO spends its generation and learns nothing
from it (the real-model lab: 65-74% of its groups while GRPO trains). DAPO's dynamic sampling drops such groups
after generating them; GRESO (Sun et al., "Act Only When It Pays: Efficient Reinforcement Learning for LLM
Reasoning via Selective Rollouts", 2025) skips them before, predicting a prompt's zero variance from its own
history over epochs. A procedural task never repeats a prompt, so here the history is kept per ``key``: the
problem's difficulty level (``Problem.difficulty``, e.g. the number of terms of a chain; the default) or the
problem itself (``key: problem``, for a finite train split revisited over epochs, as in GRESO).

Rule [design]. For each key k an exponential moving average z_k of the zero-variance indicator of its observed
groups, z_k ← (1 − ``decay``)·z_k + decay·[zero variance] per group (the first group sets it); every scored group
of the run is observed (``observe``, called by the rollout stage after the groups are built, scored, transformed
and gathered across ranks, refills included), so the estimate follows the policy as it trains. A candidate drawn
as ``random`` draws (i.i.d. for a procedural split, shuffled epochs otherwise; its own cursor) is skipped with
probability min(z_k, ``max_skip``) once its key has ``min_groups`` observed groups; ``max_skip`` < 1 keeps every
key sampled, so an estimate that went stale (a level the policy has since learned or forgotten) can recover. At
most ``max_draws`` × n candidates are drawn for n problems; if those run out, the last candidates drawn fill the
rest (``select/forced``). Skipping costs a draw from the task, nothing else.

What it changes: the training distribution (fewer problems from the levels the policy always or never solves), so
it is a curriculum as much as a speed lever, and off by default. ``max_skip: 0`` returns exactly ``random``'s
problems (tested). Metrics: ``select/skipped`` (candidates skipped this step), ``select/forced``,
``select/predicted_zero_var`` (mean z of the problems returned; 0 for keys not yet estimated).
"""

from __future__ import annotations

import dataclasses
import random as _random
from typing import Literal

from groupwise.seeding import stable_seed
from groupwise.select import SELECTORS
from groupwise.standard.random_selector import RandomSelector
from groupwise.types import Group, Problem


@dataclasses.dataclass
class InformativeConfig:
    key: Literal["difficulty", "problem"] = "difficulty"
    """Whose history predicts a group's zero variance: the problem's difficulty level, or the problem itself."""
    max_skip: float = 0.9
    """The highest skip probability of a candidate (0: never skip, exactly ``random``)."""
    decay: float = 0.1
    """Weight of a newly observed group in its key's moving average."""
    min_groups: int = 4
    """Observed groups a key needs before its candidates can be skipped."""
    max_draws: int = 20
    """Candidates drawn per problem returned, at most."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_skip < 1:
            raise ValueError(f"select.max_skip={self.max_skip}: a probability in [0, 1) (1 would starve a key of "
                             "the draws that keep its estimate current)")
        if not 0 < self.decay <= 1:
            raise ValueError(f"select.decay={self.decay}: the new group's weight in the moving average, in (0, 1]")
        if self.min_groups < 1 or self.max_draws < 1:
            raise ValueError(f"select.min_groups={self.min_groups}, select.max_draws={self.max_draws}: each >= 1")


def zero_variance(group: Group) -> bool:
    """True when every reward of the group is the same (its GRPO advantages are all zero)."""
    rewards = group.rewards
    return max(rewards) - min(rewards) == 0 if rewards else True


class InformativeSelector:
    def __init__(self, cfg: InformativeConfig, task, seed: int):
        self.cfg, self.seed = cfg, seed
        self.base = RandomSelector(task, seed)
        self.z: dict[str, float] = {}  # key -> moving average of the zero-variance indicator
        self.seen: dict[str, int] = {}  # key -> observed groups
        self.calls = 0  # next() calls so far (the skip draws' seed)
        self.step_metrics = {"select/skipped": 0.0, "select/forced": 0.0, "select/predicted_zero_var": 0.0}
        self._metrics_step = -1

    def key(self, problem: Problem) -> str:
        return str(problem.difficulty) if self.cfg.key == "difficulty" else problem.id

    def skip_probability(self, problem: Problem) -> float:
        k = self.key(problem)
        if self.seen.get(k, 0) < self.cfg.min_groups:
            return 0.0
        return min(self.z[k], self.cfg.max_skip)

    def next(self, step: int, n: int, ctx=None) -> list[Problem]:
        if step != self._metrics_step:  # a step's refills add to its first call's counts
            self._metrics_step, self.step_metrics = step, dict.fromkeys(self.step_metrics, 0.0)
        rng = _random.Random(stable_seed("informative", self.seed, step, self.calls))
        out: list[Problem] = []
        skipped: list[Problem] = []
        drawn = 0
        while len(out) < n and drawn < self.cfg.max_draws * n:  # with nothing skipped: one call, random's draws
            batch = self.base.next(step, n - len(out), ctx)
            drawn += len(batch)
            for p in batch:
                (skipped if rng.random() < self.skip_probability(p) else out).append(p)
        forced = n - len(out)
        out += skipped[len(skipped) - forced:] if forced > 0 else []
        self.step_metrics["select/skipped"] += len(skipped) - max(forced, 0)
        self.step_metrics["select/forced"] += max(forced, 0)
        self.calls += 1
        z = [self.z.get(self.key(p), 0.0) if self.seen.get(self.key(p), 0) >= self.cfg.min_groups else 0.0
             for p in out]
        self.step_metrics["select/predicted_zero_var"] = sum(z) / max(len(z), 1)
        return out

    def observe(self, groups: list[Group]) -> None:
        """The scored groups of the step's rollout (refills included): each updates its key's moving average."""
        for g in groups:
            k, zv = self.key(g.problem), float(zero_variance(g))
            self.z[k] = zv if k not in self.z else (1 - self.cfg.decay) * self.z[k] + self.cfg.decay * zv
            self.seen[k] = self.seen.get(k, 0) + 1

    def metrics(self) -> dict[str, float]:
        return dict(self.step_metrics)

    def state_dict(self) -> dict:
        return {"base": self.base.state_dict(), "z": dict(self.z), "seen": dict(self.seen), "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.base.load_state_dict(state["base"])
        self.z, self.seen, self.calls = dict(state["z"]), dict(state["seen"]), state["calls"]


@SELECTORS.register("informative", config=InformativeConfig, stateful=True, reports=True)
def informative(cfg: InformativeConfig, env) -> InformativeSelector:
    return InformativeSelector(cfg, env.task, env.seed)
