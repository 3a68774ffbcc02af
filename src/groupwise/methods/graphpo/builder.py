"""``graphpo``: the GraphPO group builder, rollouts as a DAG of reasoning steps with merged equivalent states.

Zhan, Tang, Li et al., "GraphPO: Graph-based Policy Optimization for Reasoning Models", arXiv:2606.18954 (no code;
spec §8 reconstructs the algorithm). Together with the credit component ``graphpo`` (``credit.py`` here: graph-edge
advantages) this is the method; recipes/graphpo_lab.yaml.

Expansion (per problem; every round is one batched generator call over all problems of the step):
  step         one call samples one step: the path so far is appended to the prompt (one prefill pass, not a
               forced prefix decoded token by token), sampling stops at ``delimiter`` (a stop string; ``;`` on the
               lab, a line by default) or after ``step_tokens`` sampled tokens (a chunk, for text without
               delimiters). A node is terminal when its step ended with EOS / the run's stop string, or its path
               reached ``rollout.max_completion_tokens``.
  slots        leaves are budgeted as slots: the root starts with W = ``width`` slots (0: the group size). Each
               round, the live representatives' slots are first re-split evenly over the live classes
               (``allocation: even``: a state reached by several paths gets one share, so the slots of the
               duplicates go to the other frontier states; ``merged``: a class keeps the sum of its members'
               slots, which samples states in the policy's proportions, as chains do); then a node with s slots
               samples min(s, ``branch``) children (``branch`` 0: one per slot) and splits its slots evenly
               between them; a terminal retires its slot. ``branch`` 0 with ``equivalence: none`` is W
               independent chains (GRPO's rollouts, generated step by step); ``branch`` 2 is a binary tree until
               every node holds one slot (shared prefixes: fewer tokens per leaf, so a tree needs a larger W for the
               same budget).
  merging      a new node joins the first existing class it is equivalent to (virtual merge): nodes stay for token
               bookkeeping, only the class's representative (its first member) is expanded, and a joining node
               hands its slots to it. A node never joins a class that is one of its ancestors' (class-level
               predecessors, transitively), so the class graph stays acyclic.
  equivalence  ``exact``: the task's oracle ``canonical_state(problem, partial)`` (the lab: (step index, running
               value); a partial step, no state, never merges), or for a task without one the same state read from
               the text (``state_pattern``: (matches so far, the last match's group 1) when the path ends with a
               match, e.g. running totals ``= (-?\\d+)\\.``); ``embedding``: cos(e(n), e(rep)) ≥ ``kappa``
               (0.92) against the most similar non-ancestor class, e = the ``embedder``'s vector: ``policy``
               (default; the policy's last-layer hidden state at the path's last token, L2-normalised, one
               batched no-grad pass per round) or ``hashed`` (signed hashed character 1-3-grams of the whole
               path text, ``hash_dim`` buckets, a cheap baseline); ``none``: no merging (a tree). Terminal nodes
               merge by extracted final answer in the first two modes (the efficiency advantage's group: paths
               reaching the same answer); a terminal without an answer stays alone.
  budget       ``budget_tokens`` (0: group size × ``rollout.max_completion_tokens``) caps a problem's sampled tokens
               strictly: a round's per-row caps never exceed the remaining budget (an even share when they would),
               and a node the budget leaves unexpanded becomes a cut terminal (``finish_reason`` "length"), which
               is not made a sample and carries no outcome. With ``max_waves`` > 1, once a wave is done another
               starts at the root with min(W, ⌊remaining / (tokens per slot so far)⌋) slots, to spend the budget.

Samples (what the rest of the pipeline sees: ordinary groups, scored by the reward stage): one per terminal leaf that
was not cut (its path from the root), then one per merged non-terminal member m (m's path, continued by a uniform
random walk over its class's children to a terminal, ``ctx.rng("graphpo")``), so every edge lies on the physical
(sampled-in-context) prefix of some sample. Each edge's tokens carry loss in exactly one sample (the first whose
physical prefix holds it): ``loss_mask`` is False on every other copy, so shared tokens are trained once and count once
in the loss's denominators (with or without the graphpo credit); tokens of a virtual continuation were sampled after
a different prefix, so their ``rollout_logprobs`` are NaN. Per sample, ``meta["graphpo"]`` = {``nodes``: the head
node of each edge along the path, ``spans``: [start, end) token span of each, ``terminal``}; ``meta["graphpo_graph"]``
(one dict shared by the group's samples, plain lists indexed by node id): ``parent``, ``cls``, ``terminal``,
``path_len`` (tokens from the root), ``parent_cos`` (cos(e(parent), e(node)); NaN without embeddings), ``key``.

Metrics (means over the step's groups): ``rollout/graphpo_sampled_tokens`` (per problem), ``rollout/graphpo_nodes``,
``rollout/graphpo_merge_frac`` (non-root nodes that joined an existing class), ``rollout/graphpo_states_per_1k``
(distinct canonical states, the task oracle's where it has one, else the classes, per 1,000 sampled tokens),
``rollout/graphpo_samples``, ``rollout/graphpo_waves``, ``rollout/graphpo_cut_frac`` (terminals cut by the budget).
The builder reads the policy (embedder) and keeps per-step metrics, so it runs in the training process only.
"""

from __future__ import annotations

import dataclasses
import math
import re
import zlib
from typing import Any, Literal, Protocol, runtime_checkable

from groupwise.lazy import no_grad, torch
from groupwise.registry import ConfigError
from groupwise.rollout import BUILDERS
from groupwise.rollout.base import Request, RolloutContext
from groupwise.types import Group, Problem, Sample


@runtime_checkable
class StateOracle(Protocol):
    """A task that can name the exact state a partial completion has reached (``None``: not at a step boundary)."""

    def canonical_state(self, problem: Problem, partial: str) -> Any: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraphPOConfig:
    width: int = 0
    """W, leaf slots per wave (0: rollout.group_size)."""
    branch: int = 0
    """Most children sampled from one node per expansion (0: one per slot; with equivalence none, W chains = GRPO;
    2: a binary tree until every node holds one slot)."""
    allocation: Literal["even", "merged"] = "even"
    """How a round's slots go to the live classes: ``even`` re-splits them evenly over the distinct states (budget
    moves from re-sampling a state to other frontier states); ``merged``: a class keeps its members' slots."""
    max_waves: int = 1
    """Most waves of W slots from the root while the budget lasts (1: one wave; the budget only caps it)."""
    budget_tokens: int = 0
    """Sampled tokens per problem (0: rollout.group_size × rollout.max_completion_tokens)."""
    step_tokens: int = 32
    """Most sampled tokens per step (a chunk boundary when no delimiter came)."""
    delimiter: str = "\n"
    """The step boundary, a stop string (the lab: ';')."""
    equivalence: Literal["exact", "embedding", "none"] = "exact"
    state_pattern: str = ""
    """``exact`` from the text, for a task without ``canonical_state`` ("": the task's oracle): a regex whose group 1
    is a step's result; a path ending with a match (trailing whitespace aside) is in state (matches so far, the last
    group 1), any other path in none. Running totals: ``= (-?\\d+)\\.``, ``5 - 2 = 3. 3 - 10 = -7.`` → (2, "-7")."""
    kappa: float = 0.92
    """Cosine threshold of ``embedding`` equivalence."""
    embedder: Literal["policy", "hashed"] = "policy"
    hash_dim: int = 256

    def __post_init__(self) -> None:
        if self.width < 0 or self.branch < 0 or self.max_waves < 1 or self.budget_tokens < 0 or self.step_tokens < 1:
            raise ValueError(f"width={self.width}, branch={self.branch}, max_waves={self.max_waves}, budget_tokens="
                             f"{self.budget_tokens}, step_tokens={self.step_tokens}: "
                             "need width, branch, budget_tokens >= 0 "
                             "(0: group size, one child per slot, G × max tokens) and max_waves, step_tokens >= 1")
        if not self.delimiter:
            raise ValueError("delimiter='': a step boundary needs a non-empty stop string (the lab: ';')")
        try:
            groups = re.compile(self.state_pattern).groups
        except re.error as e:
            raise ValueError(f"state_pattern={self.state_pattern!r}: not a regex ({e})") from None
        if self.state_pattern and groups < 1:
            raise ValueError(f"state_pattern={self.state_pattern!r}: needs a capture group (the step's result)")
        if not 0.0 < self.kappa <= 1.0 or self.hash_dim < 8:
            raise ValueError(f"kappa={self.kappa}, hash_dim={self.hash_dim}: kappa in (0, 1] and hash_dim >= 8")

    def provides(self) -> tuple[str, ...]:
        """``rollout_graph`` (each sample's path); with ``equivalence: embedding`` also ``endpoint_similarity``."""
        return ("rollout_graph",) + (("endpoint_similarity",) if self.equivalence == "embedding" else ())

    def check(self, run) -> None:
        if self.budget_tokens and self.budget_tokens < run.rollout.max_completion_tokens:
            raise ValueError(f"budget_tokens={self.budget_tokens} is below rollout.max_completion_tokens="
                             f"{run.rollout.max_completion_tokens}: one path must fit (0: G × max tokens)")


@dataclasses.dataclass
class Node:
    parent: int  # -1 for the root
    ids: list[int]  # the path's tokens from the root
    lps: list[float]  # their generation log-probs
    start: int  # where this node's edge starts in ``ids``
    terminal: bool = False
    finish: str = ""
    cls: int = -1
    slots: int = 0
    key: Any = None  # the task oracle's state (also kept in embedding mode, for the states metric)
    emb: torch.Tensor | None = None
    cut: bool = False  # ended by the budget, unfinished


@dataclasses.dataclass
class Graph:
    problem: Problem
    prompt: torch.Tensor
    budget: int
    nodes: list[Node] = dataclasses.field(default_factory=list)
    members: list[list[int]] = dataclasses.field(default_factory=list)  # per class; the first is the representative
    pred: list[set[int]] = dataclasses.field(default_factory=list)  # per class: classes of its members' parents
    keys: dict[Any, int] = dataclasses.field(default_factory=dict)  # exact key -> class
    used: int = 0  # sampled tokens
    issued: int = 0  # slots issued over all waves
    waves: int = 0
    merged: int = 0

    def new_class(self, n: int) -> int:
        self.members.append([n])
        self.pred.append(set())
        return len(self.members) - 1

    def ancestors(self, c: int) -> set[int]:
        """Class ``c`` and every class it can be reached from."""
        seen, todo = {c}, [c]
        while todo:
            for p in self.pred[todo.pop()] - seen:
                seen.add(p)
                todo.append(p)
        return seen


def hashed_embedding(text: str, dim: int) -> torch.Tensor:
    """Signed hashed character 1-3-gram counts of ``text``, L2-normalised (crc32: stable across processes)."""
    v = torch.zeros(dim, dtype=torch.float64)
    for n in (1, 2, 3):
        for i in range(len(text) - n + 1):
            h = zlib.crc32(text[i:i + n].encode())
            v[h % dim] += 1.0 if (h >> 16) & 1 else -1.0
    return v / v.norm().clamp(min=1e-12)


@no_grad
def policy_embeddings(model, prompts: list[torch.Tensor], paths: list[list[int]]) -> list[torch.Tensor]:
    """The policy's last-layer hidden state at the last token of prompt ⊕ path, one right-padded batch."""
    seqs = [torch.cat([p, torch.tensor(x, dtype=torch.long)]) for p, x in zip(prompts, paths)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attn = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], attn[i, :len(s)] = s, 1
    was = model.training
    model.eval()
    try:
        dev = next(model.parameters()).device
        hidden = model(input_ids=ids.to(dev), attention_mask=attn.to(dev), output_hidden_states=True).hidden_states[-1]
    finally:
        model.train(was)
    last = torch.tensor([len(s) - 1 for s in seqs], device=hidden.device)
    h = hidden[torch.arange(len(seqs), device=hidden.device), last].double().cpu()
    return list(h / h.norm(dim=-1, keepdim=True).clamp(min=1e-12))


def pattern_state(pattern: str, partial: str) -> tuple[int, str] | None:
    """(matches of ``pattern`` in ``partial``, the last one's group 1) when ``partial`` ends with that match (trailing
    whitespace aside), else None: the lab oracle's (steps written, last result) read from the text."""
    found = list(re.finditer(pattern, partial))
    if not found or partial[found[-1].end():].strip():
        return None
    return len(found), found[-1].group(1).strip()


class GraphPOBuilder:
    def __init__(self, cfg: GraphPOConfig, task):
        self.cfg, self.task = cfg, task
        self.state = ((lambda problem, partial: pattern_state(cfg.state_pattern, partial)) if cfg.state_pattern
                      else task.canonical_state if isinstance(task, StateOracle) else None)
        self._step, self._stats = -1, []

    def __call__(self, problems: list[Problem], ctx: RolloutContext) -> list[Group]:
        cfg = self.cfg
        width = cfg.width or ctx.group_size
        budget = cfg.budget_tokens or ctx.group_size * ctx.params.max_tokens
        graphs = [Graph(p, ctx.encode(p), budget) for p in problems]
        for g in graphs:
            g.nodes.append(Node(parent=-1, ids=[], lps=[], start=0))
            g.nodes[0].cls = g.new_class(0)
        gen = ctx.rng("graphpo/generate")
        while True:
            for g in graphs:
                self._plan_wave(g, width)
            work = [(g, i) for g in graphs for i in self._live(g)]
            if not work:
                break
            self._expand(work, ctx, gen)
        for g in graphs:
            self._finish(g)
        walk = ctx.rng("graphpo")
        groups = [Group(problem=g.problem, samples=self._samples(g, ctx, walk), step=ctx.step) for g in graphs]
        if ctx.step != self._step:  # statistics cover every call of one step (refills included)
            self._step, self._stats = ctx.step, []
        self._stats += [self._graph_stats(g, len(grp.samples)) for g, grp in zip(graphs, groups)]
        return groups

    def _live(self, g: Graph) -> list[int]:
        return [i for i, n in enumerate(g.nodes) if n.slots > 0 and not n.terminal]

    def _plan_wave(self, g: Graph, width: int) -> None:
        """Start a wave at the root when nothing is left to expand and the budget allows one more slot."""
        if self._live(g) or g.waves >= self.cfg.max_waves:
            return
        slots = width if g.waves == 0 else min(width, int((g.budget - g.used) // max(g.used / max(g.issued, 1), 1)))
        if slots >= 1 and g.used < g.budget:
            g.nodes[0].slots, g.issued, g.waves = slots, g.issued + slots, g.waves + 1

    def _expand(self, work: list[tuple[Graph, int]], ctx: RolloutContext, gen: torch.Generator) -> None:
        """One round: every live representative samples its children, then the new nodes are merged."""
        reqs, made = self._requests(work, ctx.params.max_tokens)
        params = dataclasses.replace(ctx.params, stop=(*ctx.params.stop, self.cfg.delimiter))
        outs = ctx.generator.generate(reqs, params, gen) if reqs else []
        new = []
        for (g, i, share), c in zip(made, outs):
            p = g.nodes[i]
            ids, lps = p.ids + c.completion_ids.tolist(), p.lps + c.rollout_logprobs.tolist()
            g.used += c.completion_ids.numel()
            step_text = ctx.tokenizer.decode(c.completion_ids.tolist(), skip_special_tokens=True)
            ended = c.finish_reason == "stop" and not step_text.endswith(self.cfg.delimiter)  # EOS / run stop string
            node = Node(parent=i, ids=ids, lps=lps, start=len(p.ids), slots=share,
                        terminal=ended or len(ids) >= ctx.params.max_tokens, finish="stop" if ended else "length")
            g.nodes.append(node)
            new.append((g, len(g.nodes) - 1, ctx.tokenizer.decode(ids, skip_special_tokens=True)))
        self._classify(new, ctx)

    def _requests(self, work: list[tuple[Graph, int]], max_len: int) -> tuple[list[Request], list[tuple]]:
        """Slots re-split over the live classes (``allocation``), then min(slots, branch) children per live node,
        its slots split evenly between them; each row's cap is the step cap, cut so
        that a problem's caps never exceed its remaining budget (an even share of it when they would)."""
        if self.cfg.allocation == "even":
            for g in {id(g): g for g, _ in work}.values():
                live = [i for h, i in work if h is g]
                total = sum(g.nodes[i].slots for i in live)  # >= len(live): every live node holds a slot
                for r, i in enumerate(live):
                    g.nodes[i].slots = total // len(live) + (r < total % len(live))
        plan = []
        for g, i in work:
            n = g.nodes[i]
            kids = min(n.slots, self.cfg.branch or n.slots)
            plan += [(g, i, n.slots // kids + (k < n.slots % kids)) for k in range(kids)]
            n.slots = 0
        caps = [min(self.cfg.step_tokens, max_len - len(g.nodes[i].ids)) for g, i, _ in plan]
        for g in {id(g): g for g, _, _ in plan}.values():
            rows = [k for k, (h, _, _) in enumerate(plan) if h is g]
            left = g.budget - g.used
            if sum(caps[k] for k in rows) > left:
                for r, k in enumerate(rows):
                    caps[k] = min(caps[k], left // len(rows) + (r < left % len(rows)))
        keep = [k for k in range(len(plan)) if caps[k] >= 1]  # a node left with no row is cut in _finish
        # the path so far is part of the prompt (one prefill pass), so the completion is the new step only
        reqs = [Request(torch.cat([plan[k][0].prompt,
                                   torch.tensor(plan[k][0].nodes[plan[k][1]].ids, dtype=torch.long)]),
                        max_tokens=caps[k]) for k in keep]
        return reqs, [plan[k] for k in keep]

    def _finish(self, g: Graph) -> None:
        """A non-terminal node whose class has no children (the budget ended its path) becomes a cut terminal."""
        expanded = {g.nodes[n.parent].cls for n in g.nodes[1:]}
        for n in g.nodes[1:]:
            if not n.terminal and n.cls not in expanded:
                n.terminal, n.finish, n.cut = True, "length", True

    def _classify(self, new: list[tuple[Graph, int, str]], ctx: RolloutContext) -> None:
        cfg = self.cfg
        for g, i, text in new:
            n = g.nodes[i]
            if n.terminal:
                answer = ctx.task.extract_answer(text)
                n.key = ("answer", answer) if answer is not None else None
            elif self.state is not None:
                n.key = self.state(g.problem, text)
        if cfg.equivalence == "embedding":
            inner = [(g, i, text) for g, i, text in new if not g.nodes[i].terminal]
            if cfg.embedder == "hashed":
                embs = [hashed_embedding(text, cfg.hash_dim) for _, _, text in inner]
            else:
                embs = policy_embeddings(ctx.model, [g.prompt for g, _, _ in inner],
                                         [g.nodes[i].ids for g, i, _ in inner])
            for (g, i, _), e in zip(inner, embs):
                g.nodes[i].emb = e
        for g, i, _ in new:
            self._merge(g, i)

    def _merge(self, g: Graph, i: int) -> None:
        n, cfg = g.nodes[i], self.cfg
        parent_cls = g.nodes[n.parent].cls
        target = None
        if cfg.equivalence != "none" and n.key is not None and (n.terminal or cfg.equivalence == "exact"):
            target = g.keys.get(n.key)
        elif cfg.equivalence == "embedding" and not n.terminal:
            target = self._nearest(g, i, g.ancestors(parent_cls))
        if target is not None and (target in g.ancestors(parent_cls) or g.nodes[g.members[target][0]].cut):
            target = None  # never merge with an ancestor (the class graph stays acyclic) or into a cut path
        if target is None:
            n.cls = g.new_class(i)
            if n.key is not None and cfg.equivalence != "none" and (n.terminal or cfg.equivalence == "exact"):
                g.keys[n.key] = n.cls
        else:
            n.cls = target
            g.members[target].append(i)
            g.merged += 1
            rep = g.nodes[g.members[target][0]]
            if not n.terminal:
                rep.slots += n.slots  # the class is expanded once, with every member's slots
            n.slots = 0
        g.pred[n.cls].add(parent_cls)
        if n.terminal:
            n.slots = 0

    def _nearest(self, g: Graph, i: int, ancestors: set[int]) -> int | None:
        """The non-terminal, non-ancestor class whose representative is most similar to node i, if cos >= kappa."""
        e, best, arg = g.nodes[i].emb, -2.0, None
        for c, ms in enumerate(g.members):
            rep = g.nodes[ms[0]]
            if rep.emb is None or rep.terminal or ms[0] == i or c in ancestors:
                continue
            cos = float(e @ rep.emb)
            if cos > best:
                best, arg = cos, c
        return arg if arg is not None and best >= self.cfg.kappa else None

    def _samples(self, g: Graph, ctx: RolloutContext, walk: torch.Generator) -> list[Sample]:
        """One sample per terminal leaf, then one per merged non-terminal member (continued at random)."""
        children: dict[int, list[int]] = {}
        for j, n in enumerate(g.nodes):
            if n.parent >= 0:
                children.setdefault(g.nodes[n.parent].cls, []).append(j)
        paths = [[j] for j, n in enumerate(g.nodes) if n.terminal and not n.cut]
        for ms in g.members:
            for m in ms[1:]:
                path = [m]
                while not g.nodes[path[-1]].terminal:  # a walk into a cut path is dropped
                    kids = children[g.nodes[path[-1]].cls]
                    path.append(kids[int(torch.randint(len(kids), (1,), generator=walk))])
                if len(path) > 1 and not g.nodes[path[-1]].cut:
                    paths.append(path)
        owned: set[int] = set()
        shared = graph_record(g)
        return [self._sample(g, path, owned, shared, ctx) for path in paths]

    def _sample(self, g: Graph, path: list[int], owned: set[int], shared: dict, ctx: RolloutContext) -> Sample:
        """``path``: a node reached physically, then its virtual continuation (heads of the following edges)."""
        chain, j = [], path[0]
        while j > 0:
            chain.append(j)
            j = g.nodes[j].parent
        heads = chain[::-1] + path[1:]
        ids, lps, mask, spans = [], [], [], []
        for k, h in enumerate(heads):
            n = g.nodes[h]
            edge = n.ids[n.start:]
            physical = k < len(chain)
            spans.append([len(ids), len(ids) + len(edge)])
            ids += edge
            lps += n.lps[n.start:] if physical else [math.nan] * len(edge)
            mask += [physical and h not in owned] * len(edge)
            if physical:
                owned.add(h)
        last = g.nodes[heads[-1]]
        return Sample(prompt_ids=g.prompt, completion_ids=torch.tensor(ids, dtype=torch.long),
                      rollout_logprobs=torch.tensor(lps, dtype=torch.float32),
                      loss_mask=torch.tensor(mask, dtype=torch.bool), finish_reason=last.finish,
                      text=ctx.tokenizer.decode(ids, skip_special_tokens=True),
                      meta={"graphpo": {"nodes": heads, "spans": spans, "terminal": heads[-1]},
                            "graphpo_graph": shared})

    def _graph_stats(self, g: Graph, samples: int) -> dict[str, float]:
        oracle = self.state is not None
        states = {n.key if oracle else n.cls for n in g.nodes[1:] if not oracle or n.key is not None}
        terminals = [n for n in g.nodes if n.terminal]
        return {"sampled_tokens": float(g.used), "nodes": float(len(g.nodes)),
                "merge_frac": g.merged / max(len(g.nodes) - 1, 1),
                "states_per_1k": 1000.0 * len(states) / max(g.used, 1), "samples": float(samples),
                "waves": float(g.waves), "cut_frac": sum(n.cut for n in terminals) / max(len(terminals), 1)}

    def metrics(self) -> dict[str, float]:
        if not self._stats:
            return {}
        return {f"rollout/graphpo_{k}": sum(s[k] for s in self._stats) / len(self._stats) for k in self._stats[0]}


def graph_record(g: Graph) -> dict:
    """The graph as plain lists indexed by node id (shared by the group's samples; the credit stage reads it)."""
    cos = [math.nan] + [float(n.emb @ g.nodes[n.parent].emb) if n.emb is not None and g.nodes[n.parent].emb is not None
                        else math.nan for n in g.nodes[1:]]
    return {"parent": [n.parent for n in g.nodes], "cls": [n.cls for n in g.nodes],
            "terminal": [n.terminal for n in g.nodes], "path_len": [len(n.ids) for n in g.nodes], "parent_cos": cos,
            "key": [repr(n.key) if n.key is not None else None for n in g.nodes]}


@BUILDERS.register("graphpo", config=GraphPOConfig, reports=True, driver_only=True, provides=GraphPOConfig.provides)
def graphpo(cfg: GraphPOConfig, env) -> GraphPOBuilder:
    if cfg.equivalence == "exact" and not cfg.state_pattern and not isinstance(env.task, StateOracle):
        raise ConfigError(f"rollout.builder.equivalence: 'exact' needs a task with canonical_state(problem, partial) "
                          f"(task '{getattr(env.task, 'name', '?')}' has none) or a state_pattern; use 'embedding' "
                          "or 'none'")
    return GraphPOBuilder(cfg, env.task)
