import itertools

import pytest
import torch
from support import reward_stage, rows

from groupwise.config import load
from groupwise.methods.dash_drift import (
    DASHDriftConfig,
    DriftMarksConfig,
    dash_drift,
    drift_marks,
    segment_values,
)
from groupwise.registry import ConfigError
from groupwise.rollout.base import RolloutContext, SamplingParams
from groupwise.seeding import stable_seed
from groupwise.standard.fake import FakeConfig, FakeGenerator

CFG = DASHDriftConfig()


def close(got, expected):
    return [(a, b) for a, b, _ in got] == [(a, b) for a, b, _ in expected] and all(
        abs(x[2] - y[2]) < 1e-12 for x, y in zip(got, expected))


def test_segment_values_pinned():
    # commitments at tokens 5 (right), 9 (wrong), 14 (right again); A = 0.8, L_ref = 20:
    # [0, 5) +0.8; [5, 9) wrong, 4 tokens past the first right one: w = 1 + 4/20 = 1.2 → −0.96;
    # [9, end) the second right commitment: 0.8 · 0.5 = 0.4 (the tail joins the last segment)
    assert close(segment_values([(5, True), (9, False), (14, True)], 0.8, False, 20.0, CFG),
                 [(0, 5, 0.8), (5, 9, -0.96), (9, None, 0.4)])
    # a drift trace (right, then wrong at the end, 7 tokens past): prefix α_weak = 0.25, w = 1 + 7/10 = 1.7
    assert close(segment_values([(5, True), (12, False)], -0.8, True, 10.0, CFG), [(0, 5, 0.2), (5, None, -1.36)])


def test_escalation_is_monotone_and_capped_and_repeats_decay():
    ws = [-segment_values([(2, True), (2 + d, False)], 1.0, True, 10.0, CFG)[1][2] for d in range(0, 40, 3)]
    assert ws == sorted(ws) and max(ws) == 2.0 and ws[0] == 1.0
    flat = [-segment_values([(2, True), (2 + d, False)], 1.0, True, 10.0, DASHDriftConfig(eta=0.0))[1][2]
            for d in (0, 10, 30)]
    assert flat == [1.0, 1.0, 1.0]  # the no-escalation ablation
    pos = [v for *_, v in segment_values([(2, True), (4, True), (6, True), (8, True)], 1.0, False, 10.0, CFG)]
    assert all(a > b for a, b in itertools.pairwise(pos))


def batch_with(marks, advantage, length=12, drift=False):
    from groupwise.types import Sample

    s = Sample(prompt_ids=torch.tensor([3]), completion_ids=torch.arange(2, 2 + length),
               rollout_logprobs=torch.zeros(length), loss_mask=torch.ones(length, dtype=torch.bool),
               finish_reason="stop", meta={"commits": marks, "drift": drift})
    return rows([s], [torch.full((length,), advantage)])


def test_no_commitment_keeps_grpo_and_one_commitment_keeps_the_sign():
    b = batch_with([], 0.7)
    assert torch.equal(dash_drift(b, CFG).advantages, b.advantages)
    right = dash_drift(batch_with([(12, True)], 0.7), CFG).advantages
    wrong = dash_drift(batch_with([(12, False)], -0.7), CFG).advantages
    assert torch.allclose(right, torch.full((1, 12), 0.7)) and torch.allclose(wrong, torch.full((1, 12), -0.7))


def test_segments_partition_every_token():
    out = dash_drift(batch_with([(3, True), (7, False), (10, True)], 1.0), CFG).advantages[0]
    # 3 + 4 + 5 tokens, each assigned once: +1, −(1 + 4/12), +0.5
    expected = torch.tensor([1.0] * 3 + [-(1 + 4 / 12)] * 4 + [0.5] * 5)
    assert torch.allclose(out, expected)


def context(tokenizer, task, texts, step=0):
    counters: dict = {}

    def rng(stage):
        return torch.Generator().manual_seed(
            stable_seed(0, step, stage, next(counters.setdefault(stage, itertools.count()))))

    stage = reward_stage(task)
    return RolloutContext(generator=FakeGenerator(FakeConfig(completions=tuple(texts)), tokenizer), tokenizer=tokenizer,
                          task=task, score=lambda gs: stage(gs, step), params=SamplingParams(64),
                          group_size=len(texts), step=step, rng=rng,
                          encode=lambda p: torch.tensor(tokenizer.encode(p.prompt + "\n", add_special_tokens=False)),
                          policy_logprobs=lambda s: [], eos_id=tokenizer.eos_token_id)


def test_the_transform_marks_commitments_and_lifts_drift_traces(tokenizer, lab):
    p = lab.test[0]
    a, w = p.answer, str((int(p.answer) + 1) % 10)
    texts = [f"<think>so {a}.</think><answer>{a}</answer>",                     # right
             f"<think>so {a}.wait 1+1=2;so {w}.</think><answer>{w}</answer>",  # drift: right, then wrong
             f"<think>so {w}.</think><answer>{w}</answer>",                     # wrong
             f"<think>so {w}.wait 1+1=2;so {a}.</think><answer>{a}</answer>"]  # a productive fix
    ctx = context(tokenizer, lab, texts)
    groups = ctx.sample_groups([p])
    ctx.score(groups)
    t = drift_marks(DriftMarksConfig(), None)
    (g,) = t(groups, ctx)
    assert [[ok for _, ok in s.meta["commits"]] for s in g.samples] == [[True], [True, False], [False], [False, True]]
    assert [s.meta["drift"] for s in g.samples] == [False, True, False, False]
    # the drift trace: 1 of 2 segments right → 0 + 0.5 · ½ = 0.25, between wrong (0) and right (1)
    assert [s.reward for s in g.samples] == [1.0, 0.25, 0.0, 1.0]
    k = g.samples[1].meta["commits"][0][0]
    assert tokenizer.decode(g.samples[1].completion_ids[:k].tolist()) == f"<think>so {a}."
    m = t.metrics()
    assert m["rollout/drift_frac"] == 0.25 and m["rollout/fix_frac"] == 0.25


def test_config():
    with pytest.raises(ConfigError,
                       match=r"credit 'dash_drift' requires 'drift_marks'.*allowed: add group transform 'dash_drift'"):
        load(None, ["credit=[dash_drift]"])
    load(None, ["rollout.transforms=[dash_drift]", "credit=[dash_drift]"])
    with pytest.raises(ValueError, match="w_max=0.5"):
        DASHDriftConfig(w_max=0.5)
