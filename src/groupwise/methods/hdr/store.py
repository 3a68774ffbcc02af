"""Replay buffers ``fifo`` (naive replay) and ``random``, and the group store they share with ``hdr``.

Stage: replay (protocol in ``replay/__init__.py``). The engine calls ``sample(step, ctx)`` after the fresh
groups got their advantages and ``add(fresh_groups, advantages, step)`` after the update, so the fresh stream is never
changed: a buffer only appends stored groups to the step's update.

Store (shared by every buffer here and by ``hdr``):
  ingress   a fresh group enters only if its outcomes are mixed: ``mixed_reward`` = rewards not all equal
            (the HDR paper's rule, arXiv:2609.03941 Phase A), ``mixed_correct`` = the answer-correctness bit
            not all equal (the paper's answer-based indicator for multi-component rewards, where a format or
            length term makes almost every group "mixed"), ``all`` = every group (a design choice, not the
            paper's: the control that tells replay's reuse apart from its selection of groups with a signal).
  storage   a copy of the group (tensors cloned) with the step that produced it, the sequence advantages
            its samples were trained on in that step (after advantage transforms; the buffer's own record)
            and their generator log-probs (``rollout_logprobs`` = log π_gen at the sampling temperature).
  eviction  FIFO: beyond ``capacity`` groups the oldest insertions go first; with ``max_age`` > 0 a group
            older than that many steps is dropped before sampling (a safety valve).
  budget    K_rep = ``replay_groups`` if set, else round(``replay_ratio`` × fresh groups offered by the last
            ``add``) with ratio 0.5 by default (the paper's "fresh 256 + replay 128"; the spec counts groups).
  replay    a ``Replayed`` copy (``replayed=True``) with its stored advantages; each sample carries
            behaviour log-probs ``old_logprobs`` = stored π_gen (the true behaviour policy, so the PPO ratio is
            π_θ/π_gen). Tokens without a generator log-prob (NaN: text an editor wrote) get the current policy's,
            i.e. ratio 1, from one teacher-forced pass over just those samples; otherwise no model call is made.
  never     a group is never replayed in the step that produced it (``stored step < step``).

``fifo``: the K most recently stored groups (the paper's "GRPO + naive replay" baseline).
``random``: K stored groups drawn uniformly without replacement from ``ctx.rng("replay")``.
Metrics: ``replay/buffer_size``, ``replay/groups``, ``replay/age_mean``, ``replay/token_share`` (replayed loss
tokens / all loss tokens of the update), ``replay/ingress_frac``, ``replay/evicted``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Literal

from groupwise.lazy import torch
from groupwise.replay import BUFFERS
from groupwise.types import Group, Problem, Replayed, Sample

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreConfig:
    capacity: int = 64
    """C: the most groups stored; the oldest insertions are evicted first."""
    replay_groups: int | None = None
    """K_rep: groups replayed per step (0 disables replay). Mutually exclusive with ``replay_ratio``."""
    replay_ratio: float | None = None
    """K_rep = round(ratio × fresh groups of the last step) if ``replay_groups`` is unset (default 0.5)."""
    max_age: int = 0
    """Drop groups older than this many steps before sampling (0: no age limit, FIFO eviction only)."""
    ingress: Literal["mixed_reward", "mixed_correct", "all"] = "mixed_reward"
    """Which fresh groups enter: ``mixed_reward`` (rewards not all equal), ``mixed_correct`` or ``all``."""

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity={self.capacity}: must be >= 1 (groups)")
        if self.replay_groups is not None and self.replay_ratio is not None:
            raise ValueError("set either replay_groups or replay_ratio, not both")
        if self.replay_groups is not None and self.replay_groups < 0:
            raise ValueError(f"replay_groups={self.replay_groups}: must be >= 0")
        if self.replay_ratio is not None and not self.replay_ratio >= 0:
            raise ValueError(f"replay_ratio={self.replay_ratio}: must be >= 0")
        if self.max_age < 0:
            raise ValueError(f"max_age={self.max_age}: must be >= 0 (0 means no limit)")
        if self.ingress not in ("mixed_reward", "mixed_correct", "all"):
            raise ValueError(f"ingress={self.ingress!r}: allowed mixed_reward, mixed_correct, all")


def admitted(group: Group, ingress: str) -> bool:
    """Ingress test: the group's outcomes are not all equal (it carries a learning signal); any group with ``all``."""
    if ingress == "all":
        return True
    values = [s.reward if ingress == "mixed_reward" else s.correct for s in group.samples]
    return len(values) > 1 and max(values) != min(values)


def loss_tokens(group: Group) -> int:
    return sum(int(s.loss_mask.sum()) for s in group.samples)


def _stored_sample(s: Sample) -> Sample:
    return dataclasses.replace(s, prompt_ids=s.prompt_ids.detach().clone(),
                               completion_ids=s.completion_ids.detach().clone(),
                               rollout_logprobs=s.rollout_logprobs.detach().float().clone(),
                               loss_mask=s.loss_mask.detach().clone(), old_logprobs=None,
                               reward_terms=dict(s.reward_terms), meta=dict(s.meta))


def behaviour_logprobs(stored: Tensor, current: Tensor | None) -> Tensor:
    """π_gen where the generator sampled the token, the current policy's log-prob where it did not (NaN)."""
    if current is None:
        return stored.clone()
    return torch.where(torch.isfinite(stored), stored, current.to(stored.dtype))


def replay_copy(entry: Entry, old_logprobs: list[Tensor], age: int) -> Replayed:
    """The group as replayed: a copy with ``replayed=True``, behaviour log-probs in ``old_logprobs`` and the
    stored advantages."""
    group = entry.group
    samples = [dataclasses.replace(s, old_logprobs=lp, reward_terms=dict(s.reward_terms), meta=dict(s.meta))
               for s, lp in zip(group.samples, old_logprobs)]
    copy = dataclasses.replace(group, samples=samples, replayed=True, meta={**group.meta, "replay_age": age})
    return Replayed(copy, torch.tensor(entry.advantages, dtype=torch.float64))


@dataclasses.dataclass
class Entry:
    group: Group  # the stored copy
    advantages: list[float]  # [G] the sequence advantages its samples were trained on
    step: int  # the step that produced it (age = step now - this)
    index: int  # insertion counter: FIFO order and the recency tie-break
    headroom: float = 0.0  # cached group headroom (used by hdr)


class GroupStore:
    """Stored groups in insertion order, with ingress, FIFO/age eviction, the replay budget and state."""

    def __init__(self, cfg: StoreConfig):
        self.cfg = cfg
        self.entries: list[Entry] = []
        self.inserted = 0
        self.last_fresh = 0
        self.evicted = 0

    def budget(self) -> int:
        if self.cfg.replay_groups is not None:
            return self.cfg.replay_groups
        ratio = 0.5 if self.cfg.replay_ratio is None else self.cfg.replay_ratio
        return int(math.floor(ratio * self.last_fresh + 0.5))

    def drop_old(self, step: int) -> None:
        if self.cfg.max_age:
            keep = [e for e in self.entries if step - e.step <= self.cfg.max_age]
            self.evicted += len(self.entries) - len(keep)
            self.entries = keep

    def eligible(self, step: int) -> list[Entry]:
        return [e for e in self.entries if e.step < step]  # never the step that produced the group

    def add(self, groups: list[Group], advantages: Tensor, step: int, headroom=None) -> list[Entry]:
        """Store the groups that pass ingress with their advantages ``[N, G]`` (``headroom(group, advantages)``
        seeds the hdr cache); return the new entries."""
        self.last_fresh = len(groups)
        new = []
        for i, g in enumerate(groups):
            if not admitted(g, self.cfg.ingress):
                continue
            stored = dataclasses.replace(g, samples=[_stored_sample(s) for s in g.samples], replayed=False,
                                         meta=dict(g.meta))
            adv = [float(a) for a in advantages[i, :len(g.samples)]]
            new.append(Entry(stored, adv, step, self.inserted, headroom(stored, adv) if headroom else 0.0))
            self.inserted += 1
        self.entries += new
        overflow = max(len(self.entries) - self.cfg.capacity, 0)
        self.entries = self.entries[overflow:]  # FIFO: insertion order is kept, so the front is the oldest
        self.evicted += overflow
        return new

    def state_dict(self) -> dict:
        return {"entries": [{"group": group_state(e.group), "advantages": list(e.advantages), "step": e.step,
                             "index": e.index, "headroom": e.headroom} for e in self.entries],
                "inserted": self.inserted, "last_fresh": self.last_fresh}

    def load_state_dict(self, state: dict) -> None:
        self.entries = [Entry(group_from_state(e["group"]), e["advantages"], e["step"], e["index"], e["headroom"])
                        for e in state["entries"]]
        self.inserted, self.last_fresh = state["inserted"], state["last_fresh"]


def group_state(g: Group) -> dict:
    """A group as plain containers and tensors (torch.save-able, no groupwise classes pickled)."""
    return {"problem": dataclasses.asdict(g.problem), "samples": [dataclasses.asdict(s) for s in g.samples],
            "step": g.step, "replayed": g.replayed, "policy_version": g.policy_version, "meta": dict(g.meta)}


def group_from_state(d: dict) -> Group:
    return Group(problem=Problem(**d["problem"]), samples=[Sample(**s) for s in d["samples"]], step=d["step"],
                 replayed=d["replayed"], policy_version=d.get("policy_version", d["step"]), meta=dict(d["meta"]))


class SimpleReplay:
    """``fifo`` / ``random``: pick K stored groups by recency or uniformly; no model call (see module doc)."""

    def __init__(self, cfg: StoreConfig, order: str):
        self.cfg, self.order = cfg, order
        self.store = GroupStore(cfg)
        self._m: dict[str, float] = {}
        self._replay_tokens = 0

    def sample(self, step: int, ctx) -> list[Replayed]:
        before = self.store.evicted
        self.store.drop_old(step)
        pool = self.store.eligible(step)
        k = min(self.store.budget(), len(pool))
        if self.order == "fifo":
            chosen = sorted(pool, key=lambda e: -e.index)[:k]  # most recent first
        else:
            pick = torch.randperm(len(pool), generator=ctx.rng("replay"))[:k].tolist() if k else []
            chosen = [pool[i] for i in pick]
        unknown = [s for e in chosen for s in e.group.samples
                   if not bool(torch.isfinite(s.rollout_logprobs).all())]
        current = dict(zip(map(id, unknown), ctx.policy_logprobs(unknown))) if unknown else {}
        out = [replay_copy(e, [behaviour_logprobs(s.rollout_logprobs, current.get(id(s)))
                               for s in e.group.samples], step - e.step) for e in chosen]
        self._m = {"replay/buffer_size": float(len(self.store.entries)),
                   "replay/budget": float(self.store.budget()),
                   "replay/groups": float(len(out)), "replay/evicted": float(self.store.evicted - before)}
        if out:
            self._m["replay/age_mean"] = sum(step - e.step for e in chosen) / len(chosen)
        self._replay_tokens = sum(loss_tokens(r.group) for r in out)
        return out

    def add(self, groups: list[Group], advantages: Tensor, step: int) -> None:
        before = self.store.evicted
        new = self.store.add(groups, advantages, step)
        finish_add_metrics(self._m, groups, new, self.store, self.store.evicted - before, self._replay_tokens)
        self._replay_tokens = 0

    def metrics(self) -> dict[str, float]:
        return dict(self._m)

    def state_dict(self) -> dict:
        return {"store": self.store.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.store.load_state_dict(state["store"])


def finish_add_metrics(m: dict[str, float], fresh: list[Group], new: list[Entry], store: GroupStore,
                       evicted: int, replay_tokens: int) -> None:
    """Metrics known only after ``add``: token share of replay in the update, ingress share, buffer size."""
    total = replay_tokens + sum(loss_tokens(g) for g in fresh)
    m["replay/token_share"] = replay_tokens / total if total else 0.0
    m["replay/ingress_frac"] = len(new) / len(fresh) if fresh else 0.0
    m["replay/buffer_size"] = float(len(store.entries))
    m["replay/evicted"] = m.get("replay/evicted", 0.0) + evicted


@BUFFERS.register("fifo", config=StoreConfig, stateful=True, reports=True)
def fifo(cfg: StoreConfig, env) -> SimpleReplay:
    return SimpleReplay(cfg, "fifo")


@BUFFERS.register("random", config=StoreConfig, stateful=True, reports=True)
def random(cfg: StoreConfig, env) -> SimpleReplay:
    return SimpleReplay(cfg, "random")
