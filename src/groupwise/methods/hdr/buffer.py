"""Headroom-Drift Replay, buffer ``hdr``: arXiv:2609.03941 (H. B. Park, D.-S. Chang, "Headroom-Drift Replay: A
Primitive for Principled Replay Control in GRPO", COLM 2026).

Stage: replay. The fresh GRPO batch is left untouched; HDR appends at most K_rep stored groups, ranked by
headroom (how much probability movement their stored advantages still ask for) and admitted only if their
drift (how far the policy moved on their tokens since generation) is small. With T(g) the group's response
tokens that carry loss and have a generator log-prob, A_i the stored advantage of sample i (the buffer's record):

  token headroom   h_ij(π; g) = 1 − π(a_ij|s_ij) if A_i > 0;  π(a_ij|s_ij) if A_i < 0;  0 if A_i = 0
  group headroom   H(g; π) = (1/|T(g)|) Σ_(i,j)∈T(g) h_ij(π; g)                        (in [0, 1])
  token drift      Δ_ij = log π_θt(a_ij|s_ij) − log π_gen(a_ij|s_ij)
  group drift      D(g; θ_t) = (1/|T(g)|) Σ Δ_ij²   (a mean square: shifts of opposite sign cannot cancel)
  admission        D(g; θ_t) ≤ τ
  Prop. 2          |H(g; π_θt) − H(g; π_gen)| ≤ sqrt(D(g; θ_t)), because |e^x − e^y| ≤ |x − y| for
                   x, y ≤ 0 and mean|Δ| ≤ sqrt(mean Δ²) (Cauchy–Schwarz); so a cached-headroom gap wider
                   than sqrt(D(g)) + sqrt(D(h)) keeps g ranked above h under the current policy.

The paper's step: A generate + score + advantages (the engine), B rank stored groups by cached headroom,
C scan them with one teacher-forced pass each and admit by drift until K_rep are admitted, D update on the
union (the engine: the run's loss and reduction, token_mean by default), E append the step's mixed-outcome
groups FIFO after the update (``add``), so a group is never replayed in the step that produced it. Here:

  B  eligible groups sorted by cached headroom, descending; ties go to the most recently stored group
     (so with equal headroom and τ = ∞ HDR replays exactly what ``fifo`` replays).
  C  the scan runs in chunks of (K_rep − admitted so far) groups, one ``ctx.policy_logprobs`` call per chunk
     (run in the update's micro-batches): every scanned group gets exactly one pass, no group past the point
     where K_rep are admitted is scanned, and nothing is generated. Each scanned group's cached headroom
     becomes H(g; π_θt) (rejected ones too); unscanned groups keep theirs; a new group's cache is H(g; π_gen)
     from its stored log-probs.

Design choices where the paper is silent (spec §1 [design]); store, ingress, eviction and budget rules are
those of ``methods/hdr/store.py``:
  - ratio denominator of replayed tokens: ``replay_ratio_ref: gen`` (default) = the stored π_gen, the true
    behaviour policy (the ratio stays near 1 because drift is gated); ``current`` = log π_θt from the scan,
    a first-epoch ratio of exactly 1. Stored advantages are reused (rewards do not change).
  - ``tau`` must be >= 0 (a negative threshold fails at load); ``tau: .inf`` removes the gate (headroom-only
    prioritised replay; the pass still runs, to refresh the cache); ``replay_groups: 0`` disables replay with
    no model call at all. Rejected groups stay stored until FIFO or ``max_age`` eviction.
  - tokens without a generator log-prob (NaN: edited text) are outside T(g); in the update their denominator
    is the current policy's log-prob (ratio 1). A group with no tokens in T(g) has H = 0 and D = 0.
  - drift is measured once per step, before the update, also when ``optim.ppo_epochs`` > 1.
Metrics: ``replay/accept_rate`` and ``replay/accept_rate_age{1,2,3plus}`` (this step's scanned groups; keys
absent when none were scanned), counts ``replay/scanned_age*`` / ``replay/accepted_age*``,
``replay/headroom_replayed`` (H under π_θt), ``replay/headroom_fresh`` (all fresh groups) and
``replay/headroom_ingress`` (the fresh groups that entered, both under π_gen = the policy of their step),
``replay/drift_scanned`` (mean D) and ``replay/drift_scanned_max``, the mean D by age
``replay/drift_scanned_{age1,age2,age3plus}`` (to set τ for a model and lr: run ``tau: .inf`` a few steps and read
the age-1 drift), ``replay/token_share``, buffer size, age.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from groupwise.lazy import torch
from groupwise.methods.hdr.store import (
    GroupStore,
    StoreConfig,
    behaviour_logprobs,
    finish_add_metrics,
    loss_tokens,
    replay_copy,
)
from groupwise.replay import BUFFERS
from groupwise.types import Group, Replayed

if TYPE_CHECKING:
    from torch import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class HDRConfig(StoreConfig):
    tau: float = dataclasses.field(default=1e-3, metadata={"infinite": True})  # .inf: no gate
    """τ, the drift threshold: admit a stored group if D(g; θ_t) ≤ τ. Must be >= 0; ``.inf`` = no gate.
    The paper uses 1e-3 (single-turn math) and 1e-2 (agentic search). On the lab a pre-registered sweep over
    {1e-3, 1e-2, 1e-1} on a separate seed, scored by training diagnostics only, also picked 1e-3
    (experiments/hdr.py, docs/results.md)."""
    replay_ratio_ref: Literal["gen", "current"] = "gen"
    """Denominator of the PPO ratio on replayed tokens: stored π_gen, or the current policy (ratio 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tau >= 0:
            raise ValueError(f"tau={self.tau}: the drift threshold must be >= 0 (.inf removes the gate; "
                             "replay_groups: 0 disables replay)")


def token_headroom(logprobs: Tensor, sign: Tensor) -> Tensor:
    """h per token: 1 − π where A > 0, π where A < 0, 0 where A = 0 (``sign`` = sign(A_i) per token)."""
    p = logprobs.exp()
    return torch.where(sign > 0, 1.0 - p, torch.where(sign < 0, p, torch.zeros_like(p)))


def group_headroom(logprobs: Tensor, sign: Tensor) -> float:
    """H(g; π) = mean of h over T(g), given flat [M] log π and sign(A) per token; 0 for an empty T(g)."""
    return float(token_headroom(logprobs, sign).mean()) if logprobs.numel() else 0.0


def group_drift(logprobs: Tensor, rollout_logprobs: Tensor) -> float:
    """D(g; θ_t) = mean over T(g) of (log π_θt − log π_gen)², flat [M] tensors; 0 for an empty T(g)."""
    return float(((logprobs - rollout_logprobs) ** 2).mean()) if logprobs.numel() else 0.0


def group_tokens(group: Group, advantages: list[float],
                 logprobs: list[Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """T(g) flattened over the group's samples (float64): (log π_gen, log π given or π_gen, sign(A_i))."""
    gen, cur, sign = [], [], []
    for i, (s, adv) in enumerate(zip(group.samples, advantages)):
        keep = s.loss_mask & torch.isfinite(s.rollout_logprobs)  # [T]
        gen.append(s.rollout_logprobs[keep].double())
        cur.append((logprobs[i] if logprobs is not None else s.rollout_logprobs)[keep].double())
        a = 1.0 if adv > 0 else (-1.0 if adv < 0 else 0.0)
        sign.append(torch.full((int(keep.sum()),), a, dtype=torch.float64))
    return torch.cat(gen), torch.cat(cur), torch.cat(sign)


def reference_headroom(group: Group, advantages: list[float]) -> float:
    """H(g; π_gen) from the stored generator log-probs: the cache value of a newly stored group."""
    gen, _, sign = group_tokens(group, advantages)
    return group_headroom(gen, sign)


def _bucket(age: int) -> str:
    return f"age{age}" if age < 3 else "age3plus"


class HDR:
    """The ``hdr`` buffer: Phases B and C in ``sample``, Phase E in ``add`` (see the module docstring)."""

    def __init__(self, cfg: HDRConfig):
        self.cfg = cfg
        self.store = GroupStore(cfg)
        self._m: dict[str, float] = {}
        self._replay_tokens = 0

    def sample(self, step: int, ctx) -> list[Replayed]:
        evicted = self.store.evicted
        self.store.drop_old(step)
        k = self.store.budget()
        pool = sorted(self.store.eligible(step), key=lambda e: (-e.headroom, -e.index))  # Phase B
        scanned: list[tuple[int, float, float, bool]] = []  # (age, H_current, D, admitted)
        admitted = []
        at = 0
        while len(admitted) < k and at < len(pool):  # Phase C
            chunk = pool[at:at + k - len(admitted)]
            at += len(chunk)
            current = ctx.policy_logprobs([s for e in chunk for s in e.group.samples])  # one pass per group
            row = 0
            for e in chunk:
                cur = current[row:row + len(e.group.samples)]
                row += len(e.group.samples)
                gen, lp, sign = group_tokens(e.group, e.advantages, cur)
                h, d = group_headroom(lp, sign), group_drift(lp, gen)
                e.headroom = h  # cache refresh, admitted or not
                ok = d <= self.cfg.tau
                scanned.append((step - e.step, h, d, ok))
                if ok:
                    admitted.append((e, cur))
        out = [replay_copy(e, [self._old(s.rollout_logprobs, c) for s, c in zip(e.group.samples, cur)],
                           step - e.step) for e, cur in admitted]
        self._replay_tokens = sum(loss_tokens(r.group) for r in out)
        self._m = self._scan_metrics(scanned, k)
        self._m["replay/evicted"] = float(self.store.evicted - evicted)
        if out:
            self._m["replay/age_mean"] = sum(r.group.meta["replay_age"] for r in out) / len(out)
        return out

    def _old(self, stored: Tensor, current: Tensor) -> Tensor:
        if self.cfg.replay_ratio_ref == "current":
            return current.detach().float().clone()
        return behaviour_logprobs(stored, current)

    def _scan_metrics(self, scanned: list[tuple[int, float, float, bool]], k: int) -> dict[str, float]:
        m = {"replay/budget": float(k), "replay/scanned": float(len(scanned)),
             "replay/groups": float(sum(ok for *_, ok in scanned))}
        if scanned:
            m["replay/accept_rate"] = m["replay/groups"] / len(scanned)
            m["replay/drift_scanned"] = sum(d for _, _, d, _ in scanned) / len(scanned)
            m["replay/drift_scanned_max"] = max(d for _, _, d, _ in scanned)
        if m["replay/groups"]:
            m["replay/headroom_replayed"] = sum(h for _, h, _, ok in scanned if ok) / m["replay/groups"]
        for b in ("age1", "age2", "age3plus"):
            hits = [(ok, d) for age, _, d, ok in scanned if _bucket(age) == b]
            m[f"replay/scanned_{b}"], m[f"replay/accepted_{b}"] = float(len(hits)), float(sum(ok for ok, _ in hits))
            if hits:
                m[f"replay/accept_rate_{b}"] = m[f"replay/accepted_{b}"] / len(hits)
                m[f"replay/drift_scanned_{b}"] = sum(d for _, d in hits) / len(hits)
        return m

    def add(self, groups: list[Group], advantages: Tensor, step: int) -> None:  # Phase E
        evicted = self.store.evicted
        new = self.store.add(groups, advantages, step, headroom=reference_headroom)
        finish_add_metrics(self._m, groups, new, self.store, self.store.evicted - evicted,
                           self._replay_tokens)
        self._replay_tokens = 0
        if groups:
            self._m["replay/headroom_fresh"] = sum(
                reference_headroom(g, [float(a) for a in advantages[i, :len(g.samples)]])
                for i, g in enumerate(groups)) / len(groups)
        if new:
            self._m["replay/headroom_ingress"] = sum(e.headroom for e in new) / len(new)

    def metrics(self) -> dict[str, float]:
        return dict(self._m)

    def state_dict(self) -> dict:
        return {"store": self.store.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.store.load_state_dict(state["store"])


@BUFFERS.register("hdr", config=HDRConfig, stateful=True, reports=True)
def hdr(cfg: HDRConfig, env) -> HDR:
    return HDR(cfg)
