"""The rollout recorder (loop/record.py): a bounded count per kind, resume truncation, the dropped / edited /
replayed / filtered flags, the per-token signals, and the teacher gap without the counted teacher."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from groupwise.config import load
from groupwise.loop.pipeline import CountingTeacher
from groupwise.loop.record import Recorder
from groupwise.loop.setup import build
from groupwise.types import Group, Problem, Replayed, Sample, TeacherOutput, TokenBatch

ROOT = Path(__file__).parents[2]


def sample(tokenizer, text, reward=0.0, correct=False, **meta):
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False))
    n = ids.numel()
    return Sample(prompt_ids=torch.tensor([3, 4]), completion_ids=ids, rollout_logprobs=torch.zeros(n),
                  loss_mask=torch.ones(n, dtype=torch.bool), finish_reason="stop", text=text, reward=reward,
                  correct=correct, reward_terms={"correctness": reward, "na": float("nan")}, scored=True, meta=meta)


def group(tokenizer, pid, rewards, step=0):
    return Group(Problem(pid, f"prompt {pid}", "7"), [sample(tokenizer, f"answer: {7 if r else 3}", r, bool(r))
                                                        for r in rewards], step=step)


def lines(rec):
    return [json.loads(x) for x in rec.path.read_text().splitlines()]


def run_step(rec, step, groups, kept, replayed=()):
    """What rl_step does around the recorder: ``seen`` after the reward stage, the update's TokenBatch of
    ``kept`` (advantage = reward − ½ per row), ``record`` after it."""
    seen = rec.seen(groups)
    adv = torch.tensor([[s.reward - 0.5 for s in g.samples] for g in kept]) if kept else torch.zeros(0, 0)
    tokens = TokenBatch.build(kept, adv, list(replayed))
    return rec.record(step, groups, tokens, list(replayed), seen), tokens


def test_at_most_n_groups_of_each_kind_per_step(tmp_path, tokenizer, lab):
    rec = Recorder(tmp_path, 2, tokenizer, lab)
    groups = [group(tokenizer, f"p{i}", [1, 0]) for i in range(7)]
    metrics, _ = run_step(rec, 0, groups, kept=groups[:4])  # p4..p6: dropped by the filter stage
    (line,) = lines(rec)
    assert line["step"] == 1 and [g["kind"] for g in line["groups"]] == ["trained", "trained", "filtered", "filtered"]
    assert [g["problem"]["id"] for g in line["groups"]] == ["p0", "p1", "p4", "p5"]
    assert all(s["filtered"] for s in line["groups"][2]["samples"])
    assert metrics["perf/record_s"] > 0 and "perf/record_teacher_s" not in metrics
    off = Recorder(tmp_path / "off", 0, tokenizer, lab)
    assert run_step(off, 0, groups, kept=groups)[0] == {} and not off.path.exists()


def test_groups_with_a_learning_signal_are_recorded_first(tmp_path, tokenizer, lab):
    """Issue 47 item 3. Before: the first ``n`` groups in generation order, so a step with reward 0.42 showed
    only zero-advantage groups. Advantages here are GRPO's centring (reward − group mean): 0 on a uniform group."""
    rec = Recorder(tmp_path, 2, tokenizer, lab)
    groups = [group(tokenizer, pid, r) for pid, r in
              [("a", [0, 0]), ("b", [1, 1]), ("c", [1, 0]), ("d", [0, 0]), ("e", [0, 1]), ("f", [1, 0])]]
    seen = rec.seen(groups)
    adv = torch.tensor([[s.reward - sum(t.reward for t in g.samples) / 2 for s in g.samples] for g in groups])
    old = [Replayed(group(tokenizer, pid, r), torch.tensor(a, dtype=torch.float64)) for pid, r, a in
           [("r0", [1, 1], [0, 0]), ("r1", [0, 0], [0, 0]), ("r2", [1, 0], [0.5, -0.5])]]
    rec.record(0, groups, TokenBatch.build(groups, adv, old), old, seen)
    picked = [(g["kind"], g["problem"]["id"]) for g in lines(rec)[0]["groups"]]
    assert picked == [("trained", "c"), ("trained", "e"), ("replayed", "r0"), ("replayed", "r2")]
    one = [groups[0], groups[1], groups[2]]  # one group with a signal: it, then the first without
    rec.record(1, one, TokenBatch.build(one, adv[:3], []), [], rec.seen(one))
    assert [g["problem"]["id"] for g in lines(rec)[1]["groups"]] == ["a", "c"]


def test_resume_drops_the_lines_after_the_checkpoint_step(tmp_path, tokenizer, lab):
    rec = Recorder(tmp_path, 1, tokenizer, lab)
    for step in range(4):
        run_step(rec, step, [group(tokenizer, f"s{step}", [1, 0])], kept=[])
    assert [x["step"] for x in lines(rec)] == [1, 2, 3, 4]
    resumed = Recorder(tmp_path, 1, tokenizer, lab, resume_step=2)  # the checkpoint after step 2
    assert [x["step"] for x in lines(resumed)] == [1, 2]
    run_step(resumed, 2, [group(tokenizer, "again", [1, 0])], kept=[])
    assert [x["step"] for x in lines(resumed)] == [1, 2, 3]
    Recorder(tmp_path, 1, tokenizer, lab)  # building a fresh run's recorder (eval builds one too) touches nothing
    assert len(lines(resumed)) == 3
    fresh = Recorder(tmp_path, 1, tokenizer, lab)
    run_step(fresh, 0, [group(tokenizer, "new", [1, 0])], kept=[])  # its first step starts the file over
    assert [(x["step"], x["groups"][0]["problem"]["id"]) for x in lines(fresh)] == [(1, "new")]


def test_dropped_edited_replayed_flags_and_signals(tmp_path, tokenizer, lab):
    rec = Recorder(tmp_path, 2, tokenizer, lab)
    pre = group(tokenizer, "q", [1, 0, 0, 1])
    gone = group(tokenizer, "gone", [1, 0])
    seen = rec.seen([pre, gone])
    edit = dataclasses.replace(pre.samples[0], meta={"dre_edited": True})
    post = Group(pre.problem, [edit, pre.samples[1], pre.samples[3]])  # a transform: edit #0, drop #2, drop "gone"
    old = group(tokenizer, "old", [1, 0], step=0)
    replayed = [Replayed(old, torch.tensor([0.25, -0.25], dtype=torch.float64))]
    adv = torch.tensor([[0.5, -0.5, 0.5]])
    tokens = TokenBatch.build([post], adv, replayed)
    tokens = dataclasses.replace(tokens, loss_weights=tokens.loss_weights * 2)  # a credit component's weights
    rec.record(3, [post], tokens, replayed, seen)
    (line,) = lines(rec)
    kinds = {g["kind"]: g for g in line["groups"]}
    assert list(kinds) == ["trained", "dropped", "replayed"]
    got = kinds["trained"]["samples"]
    assert [(s["edited"], s["dropped"], s["filtered"], s["replayed"]) for s in got] == [
        (True, False, False, False), (False, False, False, False), (False, False, False, False),
        (False, True, False, False), (False, True, False, False)]  # the unedited original and #2, after the group
    assert [s["advantage"] for s in got] == [0.5, -0.5, 0.5, None, None]
    assert got[0]["signals"]["advantage"] == [0.5] * got[0]["length"]
    assert got[0]["signals"]["loss_weight"] == [2.0] * got[0]["length"] and got[3]["signals"] == {}
    assert "".join(got[0]["tokens"]) == got[0]["text"] == "answer: 7"
    assert (got[0]["reward_terms"] == {"correctness": 1.0, "na": None}
            and got[0]["format_ok"] == lab.format_ok("answer: 7"))
    assert [s["dropped"] for s in kinds["dropped"]["samples"]] == [True, True]
    rep = kinds["replayed"]
    assert rep["from_step"] == 1 and all(s["replayed"] for s in rep["samples"])
    assert [s["advantage"] for s in rep["samples"]] == [0.25, -0.25]


def test_mode_signal_marks_the_mode_token(tmp_path, tokenizer, lab):
    rec = Recorder(tmp_path, 1, tokenizer, lab)
    g = Group(Problem("m", "p", "7"), [sample(tokenizer, "<SH>answer: 7", 1.0, True, mode="<SH>", mode_forced=False),
                                       sample(tokenizer, "answer: 3")])
    run_step(rec, 0, [g], kept=[g])
    s = lines(rec)[0]["groups"][0]["samples"]
    assert s[0]["signals"]["mode"] == [1.0] + [0.0] * (s[0]["length"] - 1) and s[0]["tokens"][0] == "<SH>"
    assert "mode" not in s[1]["signals"] and lines(rec)[0]["signals"] == ["advantage", "loss_weight", "mode"]


class FakeTeacher:
    def __init__(self):
        self.calls = []

    def score(self, samples, problems, want):
        self.calls.append([p.id for p in problems])
        t = max(s.length for s in samples)
        return TeacherOutput(torch.tensor([[-1.0 - s.reward] * t for s in samples]))  # a row's: −1 − its reward

    def on_step(self, step, policy):
        pass


def test_teacher_gap_on_the_recorded_rows_only(tmp_path, tokenizer, lab):
    teacher = FakeTeacher()
    counted = CountingTeacher(teacher)
    rec = Recorder(tmp_path, 1, tokenizer, lab, teacher=counted.inner,
                   policy_logprobs=lambda samples: [torch.full((s.length,), -3.0) for s in samples])
    groups = [group(tokenizer, f"t{i}", [1, 0]) for i in range(3)]
    metrics, _ = run_step(rec, 0, groups, kept=groups[:2])
    assert teacher.calls == [["t0", "t0"]]  # one pass, over the one recorded trained group's rows
    assert counted.metrics()["teacher/forwards"] == 0  # the run's teacher count is not touched
    line = lines(rec)[0]
    trained = line["groups"][0]["samples"]
    assert trained[0]["signals"]["teacher_gap"] == [1.0] * trained[0]["length"]  # reward 1: −2 − (−3)
    assert trained[1]["signals"]["teacher_gap"] == [2.0] * trained[1]["length"]  # reward 0: −1 − (−3)
    assert "teacher_gap" not in line["groups"][1]["samples"][0]["signals"]  # filtered: not scored
    assert "teacher_gap" in line["signals"] and line["cost"]["teacher_rows"] == 2
    assert metrics["perf/record_teacher_s"] >= 0


def test_build_gives_the_recorder_the_bare_teacher_and_the_resume_step(tmp_path):
    cfg = load(ROOT / "recipes" / "distill_frozen_lab.yaml", ["model.warm_start=false", "trainer.threads=1",
                                                    "trainer.record_groups=3", f"out_dir={tmp_path}"])
    p = build(cfg)
    assert p.recorder.n == 3 and p.recorder.teacher is p.teacher.inner
    passes = p.recorder.policy_logprobs  # the pipeline's own policy pass (Pipeline.policy_logprobs), made with it
    assert (passes.func, passes.args) == (p.learner.logprobs, (p.policy,))
    assert p.recorder.trainer_logprobs == p.learner.old_logprobs and p.recorder.path == cfg.run_dir / "rollouts.jsonl"
    with pytest.raises(ValueError, match="record_groups=-1: must be >= 0"):
        load(None, ["trainer.record_groups=-1"])


def test_sampler_dlogp_is_the_sampler_minus_the_updates_old_logprobs(tmp_path, tokenizer, lab):
    old: dict[int, torch.Tensor | None] = {}
    rec = Recorder(tmp_path, 2, tokenizer, lab, trainer_logprobs=old.get)
    groups = [group(tokenizer, "a", [1, 0]), group(tokenizer, "b", [1, 0])]
    for s in groups[0].samples + groups[1].samples:
        q = torch.full((s.length,), -1.0)
        q[0], q[1] = -0.5, float("nan")  # token 1: a forced token, no sampler log-prob
        s.rollout_logprobs = q
    n = groups[0].samples[0].length
    old[0] = torch.cat([torch.tensor([-0.75, -2.0]), torch.full((n - 2,), -0.9), torch.zeros(3)])  # padded past n
    old[1] = None  # a row the update skipped (inert)
    run_step(rec, 0, groups, kept=groups[:1])
    line = lines(rec)[0]
    assert "sampler_dlogp" in line["signals"]
    a, b = line["groups"][0]["samples"]
    # q − π_old: −0.5 − (−0.75) = 0.25; NaN − (−2) = NaN → null; −1 − (−0.9) = −0.1
    assert a["signals"]["sampler_dlogp"] == [0.25, None] + [-0.1] * (n - 2)
    assert a["sampler_logprobs"] == [-0.5, None] + [-1.0] * (n - 2)
    assert "sampler_dlogp" not in b["signals"] and b["sampler_logprobs"][0] == -0.5  # skipped row: q only
    filtered = line["groups"][1]["samples"][0]
    assert filtered["filtered"] and "sampler_dlogp" not in filtered["signals"]
    plain = Recorder(tmp_path / "plain", 1, tokenizer, lab)  # no trainer log-probs given: neither field
    run_step(plain, 0, groups, kept=groups[:1])
    s = lines(plain)[0]["groups"][0]["samples"][0]
    assert "sampler_dlogp" not in lines(plain)[0]["signals"] and "sampler_logprobs" not in s


def test_a_run_records_the_gap_its_mismatch_metrics_measure(tmp_path):
    from groupwise.inspect_report import render, run_data
    from groupwise.loop.trainer import rl_step

    over = ["model.warm_start=false", "trainer.threads=1", "trainer.record_groups=2", "rollout.prompts_per_step=4",
            "rollout.group_size=4", "rollout.max_completion_tokens=12", "rollout.top_p=0.9",
            "reward.terms=[{name: length_penalty, max_length: 12}]", f"out_dir={tmp_path}"]
    p = build(load(None, over))
    for step in range(4):  # the first step that trains a row (one whose groups all tie trains none)
        metrics = rl_step(p, step)
        if metrics["update/micro_batches"]:
            break
    line = json.loads((p.cfg.run_dir / "rollouts.jsonl").read_text().splitlines()[step])
    gaps = [abs(v) for g in line["groups"] for s in g["samples"] for v in s["signals"].get("sampler_dlogp", [])
            if v is not None]
    assert "sampler_dlogp" in line["signals"] and gaps, "the trained rows carry the gap"
    assert max(gaps) <= metrics["mismatch/max_abs_dlogp"] * 1.001  # the same δ, over a subset of the rows
    (p.cfg.run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, **metrics}) + "\n")
    page = render([run_data(p.cfg.run_dir)])
    assert "sampler_dlogp" in page and "Δ log p sampler − trainer" in page and 'id: "dlogp"' in page
    fake = build(load(None, [*over, "rollout.generator={name: fake, completions: ['1']}", f"out_dir={tmp_path}/f"]))
    rl_step(fake, 0)
    line = json.loads((fake.cfg.run_dir / "rollouts.jsonl").read_text().splitlines()[0])
    assert "sampler_dlogp" not in line["signals"], "scripted log-probs: no gap to show"
