"""``rredcot``: RREDCoT, segment-level reward redistribution from the model's own value estimates.

Ielanskyi, Schweighofer, Aichberger, Hochreiter, "RREDCoT: Segment-Level Reward Redistribution for Reasoning
Models", arXiv:2606.06475 (abstract and secondary notes only; spec §11 reconstructs the estimator). RUDDER on
the chain of thought: the final reward is moved onto the segments that raised the chance of success, with
state values from teacher-forced likelihoods of the policy itself (no extra generation). Two registered
parts, one method:

Transform (after scoring, at π_old: no update has happened yet this step):
  boundaries  token ends of ``boundary_pattern`` matches (the lab's ``;`` after each step) inside the thinking
              span, plus the end of thinking; segments shorter than ``min_len`` tokens are merged into the next;
              at most ``max_segments`` (the last ones kept)
  values      for k < K: V̂(s_k) = Σ_{c ∈ C} π_old(c | x ⊕ y[:b_k] ⊕ τ_ans) · U(c), C = the gold answer and every
              distinct final answer in the group, U = the verifier's verdict on ``answer_template.format(c)``; one
              batched teacher-forced pass (``ctx.policy_logprobs``) over all (boundary, correct candidate)
              pairs; τ_ans = ``answer_prefix`` (``</think><answer>``). Candidates the verifier rejects have
              U = 0 and need no pass. (This is the IS estimator with the group's empirical answer distribution
              as proposal; it under-covers, so V̂ is biased low, as the paper states.)
Credit (``TokenBatch.advantages``), with V̂(s_0) = mean_G R so the redistribution splits the mean-centred return:
  δ_k = V̂(s_k) − V̂(s_{k−1}) (k < K),  δ_K = R − V̂(s_{K−1}),   Σ_k δ_k = R − mean_G R
  rudder        A_t = Σ_{k' ≥ k(t)} λ^{k'−k(t)} δ_{k'} / (std_G R + 1e-6)   (λ = 0: each segment its own gain)
  grpo_process  δ normalised over the group (zero mean, unit std), A_t = Σ_{k' ≥ k(t)} δ̂_{k'}
  mix           (1 − ω)·A_row + ω·A_rudder
Tokens after the last boundary (the answer) belong to the last segment. Rows without a boundary keep their
advantage, and so do the rows of a group whose rewards are all equal (or a singleton) in ``rudder`` and ``mix``:
their return R − mean_G R is 0, as is GRPO's advantage, while the δ_k of a trace whose V̂ moves are not, and
dividing them by std_G R + 1e-6 = 1e-6 gave segment advantages of ±10⁶ (the real-model lab's first smoke).
Metric ``rollout/rred_segments`` (mean per rollout) and ``rollout/rred_value_passes``.
Deviations: no entropy-based boundaries (the recorded rollouts carry no entropy; keyword boundaries only);
std over the group's rewards with ddof 1.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from groupwise.credit import CREDIT
from groupwise.lazy import torch
from groupwise.rollout import TRANSFORMS
from groupwise.rollout.base import RolloutContext, char_ends, token_index, verified
from groupwise.types import Group, Sample, TokenBatch


@dataclasses.dataclass(frozen=True, kw_only=True)
class RREDValuesConfig:
    boundary_pattern: str = r";|\n\n|Wait|wait"
    think_close: str = "</think>"
    answer_prefix: str = "</think><answer>"
    """τ_ans: forced after each boundary before scoring a candidate answer."""
    answer_suffix: str = "</answer>"
    answer_template: str = "<answer>{}</answer>"
    min_len: int = 1
    max_segments: int = 32

    def __post_init__(self) -> None:
        if self.min_len < 1 or self.max_segments < 1 or "{}" not in self.answer_template:
            raise ValueError("min_len and max_segments must be >= 1 and answer_template needs '{}'")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RREDCoTConfig:
    mode: Literal["rudder", "grpo_process", "mix"] = "rudder"
    lam: float = 0.0
    """λ of the segment-level return (0: each segment's own value gain; 1: R − V̂(s_{k−1}))."""
    omega: float = 0.5
    """ω of ``mix``."""

    def __post_init__(self) -> None:
        if not 0 <= self.lam <= 1 or not 0 <= self.omega <= 1:
            raise ValueError(f"lam={self.lam}, omega={self.omega}: both must be in [0, 1]")



def boundaries(s: Sample, tokenizer, cfg: RREDValuesConfig) -> list[int]:
    """Token ends of the segments inside the thinking span, the end of thinking last."""
    close = s.text.find(cfg.think_close)
    if close < 0:
        return []
    ends = char_ends(s.completion_ids.tolist(), tokenizer)
    cuts = [token_index(ends, m.end()) for m in re.finditer(cfg.boundary_pattern, s.text[:close])]
    cuts = [c for c in cuts if c is not None] + [token_index(ends, close)]
    out: list[int] = []
    for c in cuts:
        if c is None or (out and c <= out[-1]):
            continue
        if out and c - out[-1] < cfg.min_len:
            out[-1] = c  # merge a short segment into the next
        else:
            out.append(c)
    return out[-cfg.max_segments:]


class RREDValues:
    def __init__(self, cfg: RREDValuesConfig):
        self.cfg, self._m = cfg, {}

    def __call__(self, groups: list[Group], ctx: RolloutContext) -> list[Group]:
        tok, cfg = ctx.tokenizer, self.cfg
        prefix = tok.encode(cfg.answer_prefix, add_special_tokens=False)
        queries, slots = [], []  # one teacher-forced row per (sample, boundary, correct candidate)
        for g in groups:
            cands = {g.problem.answer} | {a for s in g.samples if (a := ctx.task.extract_answer(s.text))}
            good = [c for c in sorted(cands) if verified(ctx, g.problem, cfg.answer_template.format(c))]
            for s in g.samples:
                s.meta["rred_bounds"] = boundaries(s, tok, cfg)
                s.meta["rred_values"] = [0.0] * max(len(s.meta["rred_bounds"]) - 1, 0)
                for k, b in enumerate(s.meta["rred_bounds"][:-1]):  # the last segment takes R − V̂(s_{K−1})
                    for c in good:
                        tail = tok.encode(c + cfg.answer_suffix, add_special_tokens=False)
                        ids = torch.cat([s.completion_ids[:b], torch.tensor(prefix + tail, dtype=torch.long)])
                        queries.append(Sample(prompt_ids=s.prompt_ids, completion_ids=ids,
                                              rollout_logprobs=torch.zeros(len(ids)),
                                              loss_mask=torch.ones(len(ids), dtype=torch.bool), finish_reason="stop"))
                        slots.append((s, k, b + len(prefix), len(ids)))
        lps = ctx.policy_logprobs(queries) if queries else []
        for (s, k, start, end), lp in zip(slots, lps):
            s.meta["rred_values"][k] += float(lp[start:end].sum().exp())  # π(c | s_k ⊕ τ_ans)
        n = sum(len(g.samples) for g in groups)
        self._m = {"rollout/rred_segments":
                   sum(len(s.meta["rred_bounds"]) for g in groups for s in g.samples) / max(n, 1),
                   "rollout/rred_value_passes": float(len(queries))}
        return groups

    def metrics(self) -> dict[str, float]:
        return dict(self._m)


@TRANSFORMS.register("rredcot", config=RREDValuesConfig, provides=("rred_values",), reports=True)
def rred_values(cfg: RREDValuesConfig, env) -> RREDValues:
    return RREDValues(cfg)


def deltas(values: list[float], reward: float, baseline: float) -> list[float]:
    """δ_1..δ_K from V̂(s_1..s_{K−1}) (``values``), V̂(s_0) = the group baseline, δ_K = R − V̂(s_{K−1})."""
    v = [baseline, *values]
    return [v[k + 1] - v[k] for k in range(len(values))] + [reward - v[-1]]


def returns(d: list[float], lam: float) -> list[float]:
    out, acc = [0.0] * len(d), 0.0
    for k in reversed(range(len(d))):
        acc = d[k] + lam * acc
        out[k] = acc
    return out


@CREDIT.register("rredcot", config=RREDCoTConfig, requires=("rred_values",))
def rredcot(batch: TokenBatch, cfg: RREDCoTConfig) -> TokenBatch:
    adv = batch.advantages.clone()  # [B, T]
    rewards = torch.tensor([s.reward for s in batch.samples], dtype=torch.float64)
    per_row = {}
    for b, s in enumerate(batch.samples):
        if s.meta.get("rred_bounds"):
            same = batch.group_index == batch.group_index[b]
            r = rewards[same]
            per_row[b] = (deltas(s.meta["rred_values"], s.reward, float(r.mean())),
                          float(r.std()) if len(r) > 1 else 0.0)
    if cfg.mode == "grpo_process":
        per_row = _normalised(per_row, batch)
    for b, (d, std) in per_row.items():
        if cfg.mode != "grpo_process" and std == 0:
            continue  # a uniform group or a singleton: R − mean_G R = 0, nothing to redistribute (δ_k / 1e-6 otherwise)
        seg = returns(d, cfg.lam if cfg.mode != "grpo_process" else 1.0)
        scale = 1.0 if cfg.mode == "grpo_process" else 1.0 / (std + 1e-6)
        bounds = batch.samples[b].meta["rred_bounds"]
        starts = [0, *bounds[:-1]]
        for k, (a, stop) in enumerate(zip(seg, [*bounds[:-1], None])):
            value = a * scale
            adv[b, starts[k]:stop] = value if cfg.mode != "mix" else (1 - cfg.omega) * adv[b, starts[k]:stop] + \
                cfg.omega * value
    return dataclasses.replace(batch, advantages=adv * batch.completion_mask)


def _normalised(per_row: dict, batch: TokenBatch) -> dict:
    """``grpo_process``: every δ of a group normalised to zero mean and unit std over that group."""
    out = {}
    for gi in {int(batch.group_index[b]) for b in per_row}:
        members = [b for b in per_row if int(batch.group_index[b]) == gi]
        flat = torch.tensor([x for b in members for x in per_row[b][0]], dtype=torch.float64)
        mean, std = flat.mean(), (flat.std() if len(flat) > 1 else torch.tensor(0.0))
        for b in members:
            out[b] = ([float((x - mean) / (std + 1e-6)) for x in per_row[b][0]], 0.0)
    return out
