"""``graphpo``: GraphPO's graph-edge advantages (arXiv:2606.18954; spec §8 steps 4-5), on the graph that the
``graphpo`` group builder (methods/graphpo/builder.py) records in each sample's meta.

Every token of an edge u → v (the step that created node v) gets the edge's advantage A(e); rows without graph
meta and replayed rows keep theirs. With terminal rewards R (each terminal's own sample's reward):
  V_own(n)    mean R over the distinct terminals of the sampled paths through n (a merged member's own estimate
              is its one sampled continuation; for a representative, its subtree)
  V(C)        mean R over the distinct terminals reachable from any member of class C (through merges)
  V_pool(n)   V(C(n)) + (1 − w)·(V_own(n) − V(C(n)))  = (1 − w)·V_own + w·V(C); written so that V_own = V(C) gives
              exactly V(C); w = 0: the tree estimate, w = 0.7 the paper's pooling
  r(u → v)    V_pool(v) − V_pool(u), × (1 − cos(e(u), e(v)))^γ_s when γ_s > 0 and the builder embedded both ends
  A_corr(e)   over the correctness group = the edges leaving class C(u) (they all leave its representative, so
              with γ_s = 0 this standardises V_pool(v), the same numbers as r(e) minus a common constant):
              (x − mean x) / (std x + eps), std ddof 1, eps 1e-4, zero-variance group → 0 (the ``grpo``
              advantage's conventions and arithmetic, bit for bit). A group of one edge has no comparison: the
              edge inherits A_corr of the edge into u (the root's only edge: 0), so a chain's later steps carry its
              first step's advantage.
  A_eff(e)    over the efficiency group = the edges into the members of class C(v) (one incoming path per member,
              ℓ = its tokens from the root), only when V(C(v)) > 0 and the group has two or more members:
              −(ℓ − mean ℓ) / (std ℓ + eps), same conventions; else 0
  A(e)        A_corr(e) + μ·A_eff(e)
Neutral setting (pinned in tests/unit/credit/test_graphpo_credit.py): one chain per sample, no merges (``equivalence:
none``, ``branch`` ≥ W, one wave) gives every token its sample's ``grpo`` sequence advantage exactly. Deviations /
design choices: a correctness group of two is standardised too (the spec suggests mean-centring it; standardising
keeps the GRPO reduction for G = 2); shared tokens are trained once because the builder gives loss only to one copy
(``loss_mask``), not by 1/k weights; terminal classes are paths ending in the same final answer.
"""

from __future__ import annotations

import dataclasses
import math

from groupwise.advantages.stats import group_centred, group_constant, group_std
from groupwise.credit import CREDIT
from groupwise.lazy import torch
from groupwise.types import TokenBatch


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraphPOCreditConfig:
    w: float = 0.7
    """Pooling weight of the class value V(C) in V_pool (0: tree advantages)."""
    mu: float = 1.0
    """Weight μ of the efficiency advantage (0: correctness only)."""
    eps: float = 1e-4
    """Added to the std of every standardised group (the grpo advantage's default)."""
    gamma_s: float = 0.0
    """Similarity discount exponent γ_s of the edge reward (0: off; needs embedding equivalence)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.w <= 1.0 or self.mu < 0 or self.eps < 0 or self.gamma_s < 0:
            raise ValueError(f"w={self.w}, mu={self.mu}, eps={self.eps}, gamma_s={self.gamma_s}: need w in [0, 1] "
                             "and mu, eps, gamma_s >= 0")

    def requires(self) -> tuple[str, ...]:
        """The rollout graph (the 'graphpo' builder records it); with γ_s > 0 also its endpoint embeddings (the
        builder's ``equivalence: embedding``)."""
        return ("rollout_graph",) + (("endpoint_similarity",) if self.gamma_s > 0 else ())


def standardise(x: list[float], eps: float) -> list[float]:
    """(x − mean) / (std + eps), ddof 1; constant or single-value groups → 0 (the grpo advantage's arithmetic)."""
    t = torch.tensor([x], dtype=torch.float64)
    m = torch.ones_like(t, dtype=torch.bool)
    centred, std = group_centred(t, m), group_std(t, m, 1)
    spread = ~group_constant(t, m) & (std > 0)
    return torch.where(spread, centred / (std + eps).clamp(min=1e-300), torch.zeros_like(centred))[0].tolist()


def values(graph: dict, paths: list[list[int]], reward: dict[int, float], w: float) -> tuple[list[float], list[float]]:
    """(V_pool, V(C(n))) of every node n (see the module docstring); ``paths``: the samples' node lists (no root)."""
    parent, cls, terminal = graph["parent"], graph["cls"], graph["terminal"]
    n = len(parent)
    kids: dict[int, list[int]] = {}
    members: dict[int, list[int]] = {}
    for j in range(n):
        members.setdefault(cls[j], []).append(j)
        if parent[j] >= 0:
            kids.setdefault(cls[parent[j]], []).append(j)
    reach: dict[int, set[int]] = {}

    def reachable(c: int) -> set[int]:  # classes form a DAG (the builder never merges into an ancestor)
        if c not in reach:
            reach[c] = {m for m in members[c] if terminal[m]} if terminal[members[c][0]] else \
                set().union(*(({x} if terminal[x] else reachable(cls[x])) for x in kids.get(c, [])))
            reach[c] &= reward.keys()  # terminals no sample ends in (cut by the budget) carry no outcome
        return reach[c]

    own: list[set[int]] = [set() for _ in range(n)]
    for p in paths:
        for j in [0, *p]:
            own[j].add(p[-1])
    mean = lambda ts: sum(reward[t] for t in ts) / len(ts) if ts else 0.0  # noqa: E731
    v_cls = [mean(reachable(cls[j])) for j in range(n)]
    return [v + (1 - w) * (mean(own[j]) - v) if own[j] else v for j, v in enumerate(v_cls)], v_cls


def edge_advantages(graph: dict, paths: list[list[int]], reward: dict[int, float],
                    cfg: GraphPOCreditConfig) -> dict[int, float]:
    """A(e) for every edge, keyed by its head node."""
    parent, cls, plen, cos = graph["parent"], graph["cls"], graph["path_len"], graph["parent_cos"]
    v, v_cls = values(graph, paths, reward, cfg.w)
    out_groups: dict[int, list[int]] = {}
    in_groups: dict[int, list[int]] = {}
    trained = sorted({h for p in paths for h in p})  # edges on some sample's path (not those the builder dropped)
    for j in trained:
        out_groups.setdefault(cls[parent[j]], []).append(j)
        in_groups.setdefault(cls[j], []).append(j)
    corr: dict[int, float] = {}
    for j in trained:  # ids grow with creation, so parents come first and inheritance is defined
        group = out_groups[cls[parent[j]]]
        if len(group) == 1:
            corr[j] = corr.get(parent[j], 0.0)
        elif j == group[0]:
            x = [_edge_reward(v, parent, cos, h, cfg.gamma_s) for h in group]
            corr.update(zip(group, standardise(x, cfg.eps)))
    eff = dict.fromkeys(trained, 0.0)
    for group in in_groups.values():
        if len(group) > 1 and v_cls[group[0]] > 0:
            eff.update(zip(group, (-a for a in standardise([float(plen[h]) for h in group], cfg.eps))))
    return {j: corr[j] + cfg.mu * eff[j] for j in trained}


def _edge_reward(v: list[float], parent: list[int], cos: list[float], h: int, gamma_s: float) -> float:
    if gamma_s == 0 or math.isnan(cos[h]):
        return v[h]  # r(e) = V_pool(v) − V_pool(u) with u common to the group: standardising V_pool(v) is the same
    return (v[h] - v[parent[h]]) * max(1.0 - cos[h], 0.0) ** gamma_s


@CREDIT.register("graphpo", config=GraphPOCreditConfig, requires=GraphPOCreditConfig.requires)
def graphpo(batch: TokenBatch, cfg: GraphPOCreditConfig) -> TokenBatch:
    adv = batch.advantages.clone()  # [B, T]
    rows: dict[int, list[int]] = {}
    for b, s in enumerate(batch.samples):
        if "graphpo" in s.meta and not bool(batch.replayed[b]):
            rows.setdefault(int(batch.group_index[b]), []).append(b)
    for members in rows.values():
        graph = batch.samples[members[0]].meta["graphpo_graph"]
        paths = [batch.samples[b].meta["graphpo"]["nodes"] for b in members]
        reward: dict[int, float] = {}
        for b, p in zip(members, paths):
            reward.setdefault(p[-1], float(batch.samples[b].reward))
        a = edge_advantages(graph, paths, reward, cfg)
        for b, p in zip(members, paths):
            for head, (start, end) in zip(p, batch.samples[b].meta["graphpo"]["spans"]):
                adv[b, start:end] = a[head]
    return dataclasses.replace(batch, advantages=adv * batch.completion_mask)
