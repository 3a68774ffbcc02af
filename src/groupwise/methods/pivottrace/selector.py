"""``pivottrace``: pivot density from attention dynamics, and three-way triage of an unlabelled pool.

Paper: G. Zhu, S. Yang, H. Wang et al., "Smart Picks in the Dark: Towards Efficient RLVR for Reasoning via
Tracing Metacognitive Pivots", arXiv 2606.04503 (2026). Only the abstract is public (the code repository is a
placeholder), so the spec (specs-09-16.md §13) rates its confidence LOW: the abstract
names the ingredients (attention dynamics → metacognitive pivots → pivot density as uncertainty →
annotate / train / skip routing under a labelling budget) and everything concrete below is reconstructed.

Setting. A pool of ``pool_size`` training problems (the first items of ``task.train``) whose answers are
treated as hidden. A problem is "annotated" when the selector decides to reveal its gold answer; at most
⌊label_budget · pool_size⌋ problems are ever annotated. The selector returns annotated problems unchanged
(the engine's scorer then verifies against the gold answer: standard RLVR) and confident unannotated ones
with ``answer`` replaced by a majority-vote pseudo-label (the scorer then rewards agreement with the
majority: unsupervised, TTRL-style RLVR); skipped problems are not returned until a later triage.

Probe [design]. For each unannotated problem x, sample K_p = ``probe_samples`` traces from the policy
(``ctx.sample_groups``, the rollout's temperature and token cap; stage ``select``), then one teacher-forced
pass with eager attention (``attention.py``). Let a_t be the attention row of the query that generates
completion token t (input position P−1+t), averaged over all heads of the last L_a layers (``layers``;
default the last third, at least one).

Attention shift d_t, t = 1..T−1 (``scorer``):
  js        d_t = JS(p_t ‖ q_t),  p_t = renorm(a_t restricted to keys < q(t)),  q_t = renorm(a_{t−1}),
            where q(t) is the query position of row t: both rows over the keys they share (the spec's
            "a_t[:t−1] vs renorm(a_{t−1})"). JS(p‖q) = ½KL(p‖m) + ½KL(q‖m), m = ½(p+q), natural log, so
            0 ≤ d_t ≤ ln 2; 0·log 0 = 0.
  lookback  d_t = |m_t − m_{t−1}|, m_t = attention mass of row t on the prompt (keys < P) and on keys more
            than w = ``lookback_window`` positions back (keys < q(t) − w).
Pivot detection (per trace): t is a pivot iff d_t is a local maximum (d_t > d_{t−1} and d_t ≥ d_{t+1};
missing neighbours count as −∞, so plateaus give one pivot, at their left end) and
d_t > max(med(d) + κ·1.4826·MAD(d), ``min_shift``) with κ = ``kappa`` (robust per-trace statistics; the
1.4826 factor makes MAD a std estimate for normal data, and the ``min_shift`` floor, our addition, keeps
the tiny fluctuations of slowly drifting attention from ever counting). Pivots closer than ``min_gap``
tokens are merged by non-maximum suppression (largest d first, ties to the earlier position). Optional
lexical gate: keep only pivots within ±``gate_window`` tokens of a token that is part of a reflection cue
(``cues``; matched on the decoded text).
Pivot density: u(x) = mean over the K_p traces of 100 · #pivots / #generated tokens (per 100 tokens).

Triage (``strategy`` chooses the score: ``pivot`` = u, ``entropy`` = mean full-vocabulary token entropy of
the probe traces (the spec's baseline), ``random`` = a uniform draw from (seed, round), the random-selection
baseline at the same budget). Sort the unannotated problems U by (score, pool index) ascending (ties broken
deterministically by index) and cut three consecutive blocks, lowest score first, in the order ``order``
(default confident → pseudo, informative → gold, chaotic → skip; the spec's alternative reading
"annotate the most uncertain, drop the most confident" is ``order: [skip, pseudo, gold]``). Block sizes:
gold = min(remaining budget, |U|), skip = min(round(skip_frac · |U|), |U| − gold), pseudo = the rest.
With the defaults on a fresh pool (label_budget 0.3, skip_frac 0.2) these are the spec's quantiles
q_lo = 0.5, q_hi = 0.8. A pseudo problem whose majority share (top answer count / K_p; ties to the
smallest answer string; no answer counts as a vote for nothing) is below ``min_majority`` goes to gold while
budget remains, else to skip.

Re-triage [design]: every ``refresh_every`` steps (0: only at the first call), on the not-yet-annotated
problems only. Annotated problems stay annotated and trainable; pseudo-labels are recomputed; skipped
problems can come back. The whole budget is spent at the first triage (the informative band takes it), so
later rounds only re-route between pseudo and skip; the budget is never exceeded.

Serving: shuffled epochs over the trainable problems (annotated ∪ pseudo, in pool order), permutation
seed (seed, epoch) in the first triage round and (seed, round, epoch) after, as in the ``random`` selector. So
``label_budget: 1`` with ``strategy: random`` annotates the whole pool without probing and returns exactly
what ``random`` returns on a task whose train split is the pool: training on all labels (tested).

Diagnostics (use the hidden gold answers, never for routing): ``select/pseudo_label_acc`` (share of
pseudo-labels equal to gold), ``select/calib_spearman_{pivot,entropy}`` (Spearman of the score against the
probe error rate, the spec's calibration test) and ``select/calib_auroc_pivot`` (AUROC of u for "majority
answer wrong"). Deviations: the pseudo-label comes from the K_p probe traces at triage time, not from the
step's own G rollouts as in TTRL (a selector returns problems before rollouts exist); no 800-step schedule.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random as _random
import time
from typing import TYPE_CHECKING, Literal

from groupwise.lazy import torch
from groupwise.methods.pivottrace.attention import attention_maps
from groupwise.models.forward import pack
from groupwise.seeding import stable_seed
from groupwise.select import SELECTORS
from groupwise.types import Problem

if TYPE_CHECKING:
    from torch import Tensor

ACTIONS = ("pseudo", "gold", "skip")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PivotTraceConfig:
    strategy: Literal["pivot", "entropy", "random"] = "pivot"
    label_budget: float = 0.3
    """Fraction of the pool that may ever be annotated (gold label revealed), in (0, 1]."""
    pool_size: int = 512
    """The unlabelled pool: the first pool_size items of task.train."""
    probe_samples: int = 4
    layers: int = 0
    """Average attention over the last `layers` layers (0: the last third, at least one)."""
    scorer: Literal["js", "lookback"] = "js"
    lookback_window: int = 8
    kappa: float = 2.0
    min_gap: int = 8
    min_shift: float = 0.02
    lexical_gate: bool = False
    cues: tuple[str, ...] = ("wait", "but", "hmm", "check", "actually", "chk")
    gate_window: int = 2
    skip_frac: float = 0.2
    order: tuple[str, str, str] = ("pseudo", "gold", "skip")
    """Action of the low / middle / high score blocks: a permutation of pseudo, gold, skip."""
    min_majority: float = 0.5
    refresh_every: int = 0
    """Re-triage the unannotated pool every N steps (0: triage once, at the first call)."""
    probe_batch: int = 64
    """Problems per probe generation call (its rows × probe_samples per attention pass)."""

    def __post_init__(self) -> None:
        if not 0 < self.label_budget <= 1:
            raise ValueError(f"label_budget={self.label_budget}: the fraction of the pool that may be labelled, "
                             "in (0, 1]")
        if sorted(self.order) != sorted(ACTIONS):
            raise ValueError(f"order={list(self.order)}: a permutation of {', '.join(ACTIONS)}")
        if self.pool_size < 1 or self.probe_samples < 1 or self.probe_batch < 1 or self.layers < 0:
            raise ValueError("pool_size, probe_samples, probe_batch must be >= 1 and layers >= 0")
        if not 0 <= self.skip_frac < 1 or not 0 <= self.min_majority <= 1:
            raise ValueError(f"skip_frac={self.skip_frac} must be in [0, 1) and min_majority in [0, 1]")
        if self.kappa < 0 or self.min_gap < 1 or self.min_shift < 0 or self.gate_window < 0:
            raise ValueError("kappa, min_shift, gate_window must be >= 0 and min_gap >= 1")
        if self.lookback_window < 0 or self.refresh_every < 0:
            raise ValueError("lookback_window and refresh_every must be >= 0")


# ------------------------------------------------------------------------------- pure functions
def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Row-wise JS(p ‖ q) in nats over the last dim (inputs renormalised; 0·log 0 = 0)."""
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    q = q / q.sum(-1, keepdim=True).clamp_min(1e-30)
    m = 0.5 * (p + q)

    def kl(a: Tensor) -> Tensor:
        return torch.where(a > 0, a * (a.clamp_min(1e-30).log() - m.clamp_min(1e-30).log()), 0.0).sum(-1)

    return 0.5 * kl(p) + 0.5 * kl(q)


def attention_shift(rows: Tensor, first_query: int, prompt_end: int, scorer: str = "js",
                    window: int = 8) -> Tensor:
    """d_t for t = 1..T−1 from attention rows [T, K] of consecutive queries (row t = query at
    ``first_query + t``; keys absolute). Returns [T−1] (float64)."""
    rows = rows.double()
    t, k = rows.shape
    if t < 2:
        return rows.new_zeros(0)
    keys = torch.arange(k)
    q_pos = first_query + torch.arange(1, t)  # query position of rows 1..T−1
    if scorer == "js":
        shared = keys[None, :] < q_pos[:, None]  # keys both rows can see
        return js_divergence(rows[1:] * shared, rows[:-1] * shared)
    q_all = first_query + torch.arange(t)
    far = (keys[None, :] < prompt_end) | (keys[None, :] < (q_all - window)[:, None])
    mass = (rows * far).sum(-1)
    return (mass[1:] - mass[:-1]).abs()


def detect_pivots(d: Tensor, kappa: float = 2.0, min_gap: int = 8, min_shift: float = 0.02) -> list[int]:
    """Indices i of d that are pivots (see the module docstring), sorted ascending."""
    n = int(d.numel())
    if n == 0:
        return []
    d = d.double()
    med = d.median()
    mad = (d - med).abs().median()
    thresh = max(float(med + kappa * 1.4826 * mad), min_shift)
    inf = torch.tensor([-math.inf], dtype=d.dtype)
    left, right = torch.cat([inf, d[:-1]]), torch.cat([d[1:], inf])
    cand = torch.nonzero((d > left) & (d >= right) & (d > thresh)).flatten().tolist()
    kept: list[int] = []
    for i in sorted(cand, key=lambda i: (-float(d[i]), i)):  # non-maximum suppression within min_gap
        if all(abs(i - j) >= min_gap for j in kept):
            kept.append(i)
    return sorted(kept)


def cue_positions(token_texts: list[str], cues: tuple[str, ...]) -> set[int]:
    """Token indices covered by any occurrence of a cue in the concatenated token texts."""
    text, owner = "", []
    for i, s in enumerate(token_texts):
        text += s
        owner += [i] * len(s)
    out: set[int] = set()
    for cue in cues:
        start = text.find(cue)
        while start >= 0:
            out.update(owner[start:start + len(cue)])
            start = text.find(cue, start + 1)
    return out


def gate(pivots: list[int], cues: set[int], window: int) -> list[int]:
    """Keep pivot token positions within ±window tokens of a cue token."""
    return [p for p in pivots if any(abs(p - c) <= window for c in cues)]


def pivot_density(n_pivots: list[int], n_tokens: list[int]) -> float:
    """u = mean_k 100 · pivots_k / tokens_k (a trace without tokens contributes 0)."""
    return sum(100.0 * p / t if t else 0.0 for p, t in zip(n_pivots, n_tokens)) / max(len(n_pivots), 1)


def majority(answers: list[str | None]) -> tuple[str | None, float]:
    """(most common non-None answer, its count / len(answers)); ties go to the smallest string."""
    counts = collections.Counter(a for a in answers if a is not None)
    if not counts:
        return None, 0.0
    label = min(counts, key=lambda a: (-counts[a], a))
    return label, counts[label] / len(answers)


def route(scores: dict[int, float], n_gold: int, skip_frac: float,
          order: tuple[str, str, str]) -> dict[int, str]:
    """Sort items by (score, id) and cut consecutive blocks, lowest first, with the actions in ``order``."""
    ids = sorted(scores, key=lambda i: (scores[i], i))
    n = len(ids)
    n_gold = min(n_gold, n)
    n_skip = min(round(skip_frac * n), n - n_gold)
    sizes = {"gold": n_gold, "skip": n_skip, "pseudo": n - n_gold - n_skip}
    out, at = {}, 0
    for action in order:
        for i in ids[at:at + sizes[action]]:
            out[i] = action
        at += sizes[action]
    return out


def _ranks(x: list[float]) -> list[float]:
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho (average ranks for ties); NaN when either side is constant."""
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else math.nan


def auroc(scores: list[float], labels: list[bool]) -> float:
    """P(score of a positive > score of a negative) + ½ P(tie); NaN without both classes."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return math.nan
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


# ---------------------------------------------------------------------------------- the selector
def _verify(task, problem: Problem, text: str) -> bool:
    try:
        return bool(task.verify(problem, text))
    except Exception:  # noqa: BLE001 - a diagnostic only: a crashing verifier counts as wrong
        return False


@dataclasses.dataclass
class Probe:
    """Per problem: pivot density, mean token entropy, probe answers and probe correctness (diagnostics), and
    per probe trace its pivot token positions and completion token ids (for detector checks:
    experiments/pivottrace_premise.py)."""

    density: float
    entropy: float
    answers: list[str | None]
    correct: list[bool]
    pivots: list[list[int]] = dataclasses.field(default_factory=list)
    completions: list[list[int]] = dataclasses.field(default_factory=list)


class PivotTraceSelector:
    def __init__(self, cfg: PivotTraceConfig, task, seed: int):
        self.cfg, self.task, self.seed = cfg, task, seed
        self.pool: list[Problem] = [task.train[i] for i in range(min(cfg.pool_size, len(task.train)))]
        self.budget = int(cfg.label_budget * len(self.pool) + 1e-9)  # ⌊B · pool⌋
        self.round, self.last_triage, self.epoch, self.cursor = 0, -1, 0, 0
        self.annotated: set[int] = set()
        self.pseudo: dict[int, str] = {}
        self.skip: set[int] = set()
        self.density: dict[int, float] = {}
        self.diag: dict[str, float] = {}
        self.probe_s = 0.0  # wall time of the last triage (a metric, not state)
        self._order: list[int] | None = None

    # ------------------------------------------------------------------------------- probing
    def probe(self, problems: list[Problem], ctx) -> list[Probe]:
        """K_p traces per problem from the policy, scored with attention shifts (see module docstring)."""
        c = self.cfg
        if ctx is None or ctx.model is None:
            raise RuntimeError("pivottrace: probing needs a RolloutContext with the policy (ctx.model)")
        model, tok = ctx.model, ctx.tokenizer
        n_layers = model.config.num_hidden_layers
        take = c.layers or max(1, math.ceil(n_layers / 3))
        layers = list(range(n_layers - min(take, n_layers), n_layers))
        dev = next(model.parameters()).device
        out: list[Probe] = []
        for i in range(0, len(problems), c.probe_batch):
            groups = ctx.sample_groups(problems[i:i + c.probe_batch], n=c.probe_samples, stage="select")
            samples = [s for g in groups for s in g.samples]
            per_sample: list[tuple[int, int, float, list[int]]] = []
            for j in range(0, len(samples), 64):
                chunk = samples[j:j + 64]
                packed = pack([s.prompt_ids for s in chunk], [s.completion_ids for s in chunk],
                              tok.pad_token_id, dev)
                _, entropy, att = attention_maps(model, packed, layers)
                rows = att.mean(dim=(0, 2)).cpu()  # [B, S, S]: mean over the selected layers and heads
                p = packed.prompt_width
                for b, s in enumerate(chunk):
                    n = s.length
                    d = attention_shift(rows[b, p - 1:p - 1 + n], p - 1, p, c.scorer, c.lookback_window)
                    piv = [k + 1 for k in detect_pivots(d, c.kappa, c.min_gap, c.min_shift)]  # token positions
                    if c.lexical_gate:
                        texts = [tok.decode([t]) for t in s.completion_ids.tolist()]
                        piv = gate(piv, cue_positions(texts, c.cues), c.gate_window)
                    per_sample.append((len(piv), n, float(entropy[b, :n].mean()) if n else 0.0, piv))
            for gi, g in enumerate(groups):
                rows_g = per_sample[gi * c.probe_samples:(gi + 1) * c.probe_samples]
                out.append(Probe(
                    density=pivot_density([r[0] for r in rows_g], [r[1] for r in rows_g]),
                    entropy=sum(r[2] for r in rows_g) / len(rows_g),
                    answers=[ctx.task.extract_answer(s.text) for s in g.samples],
                    correct=[_verify(ctx.task, g.problem, s.text) for s in g.samples],  # diagnostics only
                    pivots=[r[3] for r in rows_g], completions=[s.completion_ids.tolist() for s in g.samples]))
        return out

    # -------------------------------------------------------------------------------- triage
    def triage(self, step: int, ctx) -> None:
        c, t0 = self.cfg, time.perf_counter()
        self.round += 1
        self.last_triage = step
        unlabelled = [i for i in range(len(self.pool)) if i not in self.annotated]
        remaining = self.budget - len(self.annotated)
        n_gold = min(remaining, len(unlabelled))
        need_probe = c.strategy != "random" or n_gold < len(unlabelled)
        probes = dict(zip(unlabelled, self.probe([self.pool[i] for i in unlabelled], ctx))) if need_probe else {}
        if c.strategy == "random":
            rng = _random.Random(stable_seed("pivottrace-random", self.seed, self.round))
            scores = {i: rng.random() for i in unlabelled}
        else:
            scores = {i: probes[i].density if c.strategy == "pivot" else probes[i].entropy for i in unlabelled}
        actions = route(scores, n_gold, c.skip_frac, c.order)
        self.pseudo, self.skip = {}, set()
        for i in unlabelled:  # pool order: deterministic
            if actions[i] == "gold":
                self.annotated.add(i)
        for i in unlabelled:
            if actions[i] == "skip":
                self.skip.add(i)
            if actions[i] != "pseudo":
                continue
            label, share = majority(probes[i].answers)
            if label is not None and share >= c.min_majority:
                self.pseudo[i] = label
            elif len(self.annotated) < self.budget:
                self.annotated.add(i)
            else:
                self.skip.add(i)
        self.density.update({i: p.density for i, p in probes.items()})
        self.diag = self._diagnostics(probes)
        self.probe_s = time.perf_counter() - t0
        self._order, self.epoch, self.cursor = None, 0, 0

    def _diagnostics(self, probes: dict[int, Probe]) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.pseudo:
            out["select/pseudo_label_acc"] = (sum(self.pool[i].answer == a for i, a in self.pseudo.items())
                                              / len(self.pseudo))
        if len(probes) > 1:
            err = [1 - sum(p.correct) / len(p.correct) for p in probes.values()]
            out["select/calib_spearman_pivot"] = spearman([p.density for p in probes.values()], err)
            out["select/calib_spearman_entropy"] = spearman([p.entropy for p in probes.values()], err)
            wrong = [majority(p.answers)[0] != self.pool[i].answer for i, p in probes.items()]
            out["select/calib_auroc_pivot"] = auroc([p.density for p in probes.values()], wrong)
        return {k: v for k, v in out.items() if math.isfinite(v)}

    # ------------------------------------------------------------------------------- serving
    def trainable(self) -> list[int]:
        return sorted(self.annotated | set(self.pseudo))

    def problem(self, i: int) -> Problem:
        if i in self.annotated:
            return self.pool[i]
        return dataclasses.replace(self.pool[i], answer=self.pseudo[i], meta={**self.pool[i].meta, "label": "pseudo"})

    def next(self, step: int, n: int, ctx=None) -> list[Problem]:
        due = self.cfg.refresh_every and step - self.last_triage >= self.cfg.refresh_every
        if self.round == 0 or (due and len(self.annotated) < len(self.pool)):
            self.triage(step, ctx)
        items = self.trainable()
        if not items:
            raise RuntimeError("pivottrace: no trainable problem (nothing annotated or pseudo-labelled); "
                               "raise select.label_budget or lower select.skip_frac / select.min_majority")
        out: list[Problem] = []
        while len(out) < n:
            if self._order is None:
                key = (self.epoch,) if self.round <= 1 else (self.round, self.epoch)
                self._order = list(items)
                _random.Random(stable_seed("select", self.seed, *key)).shuffle(self._order)
            take = self._order[self.cursor:self.cursor + n - len(out)]
            out += [self.problem(i) for i in take]
            self.cursor += len(take)
            if self.cursor >= len(self._order):
                self.epoch, self.cursor, self._order = self.epoch + 1, 0, None
        return out

    def metrics(self) -> dict[str, float]:
        if self.round == 0:
            return {}
        n = len(self.pool)
        buckets = {"gold": self.annotated, "pseudo": set(self.pseudo), "skip": self.skip}
        out = {"select/pool_size": float(n), "select/labelled_frac": len(self.annotated) / n,
               "select/triage_rounds": float(self.round), "select/probe_s": self.probe_s, **self.diag}
        for name, ids in buckets.items():
            out[f"select/share_{name}"] = len(ids) / n
            dens = [self.density[i] for i in ids if i in self.density]
            if dens:
                out[f"select/pivot_density_{name}"] = sum(dens) / len(dens)
        return out

    def state_dict(self) -> dict:
        return {"round": self.round, "last_triage": self.last_triage, "epoch": self.epoch, "cursor": self.cursor,
                "annotated": sorted(self.annotated), "pseudo": {str(k): v for k, v in self.pseudo.items()},
                "skip": sorted(self.skip), "density": {str(k): v for k, v in self.density.items()},
                "diag": dict(self.diag)}

    def load_state_dict(self, state: dict) -> None:
        self.round, self.last_triage = state["round"], state["last_triage"]
        self.epoch, self.cursor, self._order = state["epoch"], state["cursor"], None
        self.annotated, self.skip = set(state["annotated"]), set(state["skip"])
        self.pseudo = {int(k): v for k, v in state["pseudo"].items()}
        self.density = {int(k): float(v) for k, v in state["density"].items()}
        self.diag = dict(state["diag"])


@SELECTORS.register("pivottrace", config=PivotTraceConfig, stateful=True, reports=True)
def pivottrace(cfg: PivotTraceConfig, env) -> PivotTraceSelector:
    return PivotTraceSelector(cfg, env.task, env.seed)
