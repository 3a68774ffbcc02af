import copy
import dataclasses
import itertools
import math

import pytest
import torch
from support import learner, reward_stage, rows
from torch.testing import assert_close

from groupwise.config import load
from groupwise.loop.pipeline import CountingGenerator
from groupwise.losses import LOSSES
from groupwise.methods.dre import DREConfig, dre, find_span
from groupwise.models.forward import completion_logprobs, pack
from groupwise.registry import ConfigError
from groupwise.rollout.base import RolloutContext, SamplingParams
from groupwise.seeding import stable_seed
from groupwise.standard.fake import FakeConfig, FakeGenerator
from groupwise.standard.grpo import GRPOConfig, grpo
from groupwise.types import Completion, ScoredBatch

CHK = "chk 1+1=2;"  # one lab re-check: 10 tokens


def context(tokenizer, task, texts, step=0, group_size=4):
    scorer = reward_stage(task)
    counters: dict = {}

    def rng(stage):
        return torch.Generator().manual_seed(
            stable_seed(0, step, stage, next(counters.setdefault(stage, itertools.count()))))

    return RolloutContext(
        generator=FakeGenerator(FakeConfig(completions=tuple(texts)), tokenizer), tokenizer=tokenizer, task=task,
        score=lambda gs: scorer(gs, step), params=SamplingParams(96), group_size=group_size, step=step, rng=rng,
        encode=lambda p: torch.tensor(tokenizer.encode(p.prompt + "\n", add_special_tokens=False)),
        policy_logprobs=lambda samples: [], eos_id=tokenizer.eos_token_id)


def scored(tokenizer, task, texts, step=0, problem=None):
    ctx = context(tokenizer, task, texts, step, len(texts))
    groups = ctx.sample_groups([problem or task.test[0]])
    ctx.score(groups)
    return groups, ctx


def answers(lab):
    a = lab.test[0].answer
    return a, str((int(a) + 1) % 10)


def test_detector_first_verified_commitment(lab):
    # property 7: a wrong candidate at step 2 and the right one at step 3 → t* after the right one
    a, w = answers(lab)
    text = f"<think>1+1=2;so {w}.wait 2+1=3;so {a}.{CHK}</think><answer>{a}</answer>"
    span = find_span(text, lambda x: x == a, DREConfig())
    assert text[:span.answer_end].endswith(f"wait 2+1=3;so {a}.")
    assert text[:span.first_commit_end].endswith(f"so {w}.") and span.think_end == text.index("</think>")
    # the right answer appears only as the final commitment: no tail; no commitment at all: nothing to find
    span = find_span(f"<think>1+1=2;so {a}.</think><answer>{a}</answer>", lambda x: x == a, DREConfig())
    assert span.answer_end == span.think_end
    assert find_span(f"<answer>{a}</answer>", lambda x: x == a, DREConfig()) is None


def test_edit_pinned_prefix_kept_tail_deleted(tokenizer, lab):
    # properties 3 and 4; replace mode; tail = 2 re-checks = 20 tokens ≥ max(16, 0.1·25)
    a, w = answers(lab)
    texts = [f"<think>so {a}.{CHK}{CHK}</think><answer>{a}</answer>", f"<think>so {w}.</think><answer>{w}</answer>"]
    groups, ctx = scored(tokenizer, lab, texts)
    orig = [copy.deepcopy(s) for s in groups[0].samples]
    t = dre(DREConfig(), None)
    out = t(groups, ctx)
    y, y0 = out[0].samples[0], orig[0]
    assert y.text == f"<think>so {a}.</think><answer>{a}</answer>" and y.correct and y.reward == 1.0
    t_star = 6  # <think> s o ␣ a .
    assert torch.equal(y.completion_ids[:t_star], y0.completion_ids[:t_star]) and y.length == y0.length - 20
    assert torch.equal(y.rollout_logprobs[:t_star], y0.rollout_logprobs[:t_star])
    assert torch.isnan(y.rollout_logprobs[t_star:]).all() and y.rollout_logprobs[t_star:].numel() == 5  # </think>…EOS
    assert y.old_logprobs is None and y.loss_mask.all() and y.meta["dre_removed"] == 20
    assert out[0].samples[1] is groups[0].samples[1]
    m = t.metrics()
    assert m["rollout/dre_edited_frac"] == 0.5 and m["rollout/dre_tokens_removed"] == 10.0
    assert m["rollout/dre_tail_correct"] == 20.0 and m["rollout/dre_tail_incorrect"] == 0.0
    assert m["rollout/dre_ot_correct"] == pytest.approx(20 / 25)


def test_failed_and_ineligible_rollouts_untouched_bit_identical(tokenizer, lab):
    # properties 1 and 2: a wrong final answer with a correct commitment and a long tail is never edited;
    # a short tail (1 re-check = 10 < τ_abs 16) is not eligible; a group with nothing eligible is unchanged
    a, w = answers(lab)
    texts = [f"<think>so {a}.{CHK}{CHK}{CHK}</think><answer>{w}</answer>",
             f"<think>so {a}.{CHK}</think><answer>{a}</answer>", f"<think>so {a}.</think><answer>{a}</answer>"]
    groups, ctx = scored(tokenizer, lab, texts)
    before = [(s, s.completion_ids.clone(), s.rollout_logprobs.clone(), s.reward) for s in groups[0].samples]
    adv_before = grpo(ScoredBatch.from_groups(groups), GRPOConfig())
    t = dre(DREConfig(), None)
    out = t(groups, ctx)
    for s, (s0, ids, lp, r) in zip(out[0].samples, before):
        assert s is s0 and torch.equal(s.completion_ids, ids) and torch.equal(s.rollout_logprobs, lp) and s.reward == r
    assert torch.equal(grpo(ScoredBatch.from_groups(out), GRPOConfig()), adv_before)
    m = t.metrics()
    assert m["rollout/dre_edited_frac"] == 0.0 and m["rollout/dre_tail_incorrect"] == 30.0
    assert m["rollout/dre_tail_correct"] == 5.0  # (10 + 0) / 2


def test_replace_keeps_rewards_and_advantages(tokenizer, lab):
    # property 5
    a, w = answers(lab)
    texts = [f"<think>so {a}.{CHK}{CHK}</think><answer>{a}</answer>", f"<think>so {w}.</think><answer>{w}</answer>",
             f"<think>so {a}.{CHK}{CHK}{CHK}</think><answer>{a}</answer>",
             f"<think>so {w}.</think><answer>{w}</answer>"]
    groups, ctx = scored(tokenizer, lab, texts)
    r0, a0 = [s.reward for s in groups[0].samples], grpo(ScoredBatch.from_groups(groups), GRPOConfig())
    out = dre(DREConfig(), None)(groups, ctx)
    assert [s.reward for s in out[0].samples] == r0 == [1.0, 0.0, 1.0, 0.0]
    assert torch.equal(grpo(ScoredBatch.from_groups(out), GRPOConfig()), a0)
    assert [s.meta.get("dre_edited", False) for s in out[0].samples] == [True, False, True, False]


def test_append_margin_orders_rewards_and_advantages(tokenizer, lab):
    # property 6: edit 1 > original 1 − δ = 0.75 > failures 0; group grows to G + 1
    a, w = answers(lab)
    texts = [f"<think>so {a}.{CHK}{CHK}</think><answer>{a}</answer>", f"<think>so {w}.</think><answer>{w}</answer>",
             f"<think>so {a}.</think><answer>{a}</answer>", f"<think>so {w}.</think><answer>{w}</answer>"]
    groups, ctx = scored(tokenizer, lab, texts)
    out = dre(DREConfig(mode="append_margin", delta=0.25), None)(groups, ctx)
    assert [s.reward for s in out[0].samples] == [0.75, 0.0, 1.0, 0.0, 1.0]
    assert out[0].samples[0].meta["dre_margin"] == -0.25
    adv = grpo(ScoredBatch.from_groups(out), GRPOConfig())[0]
    # mean 0.55; ddof=1 var = (0.2² + 0.55² + 0.45² + 0.55² + 0.45²)/4 = 1.05/4 = 0.2625 → std 0.5123475
    std = math.sqrt(0.2625)
    expected = torch.tensor([0.2, -0.55, 0.45, -0.55, 0.45], dtype=torch.float64) / (std + 1e-4)
    assert_close(adv, expected, rtol=0, atol=1e-12)
    assert adv[4] > adv[0] > adv[1]


def test_rejected_edit_keeps_the_original(tokenizer, lab):
    # property 4: a verifier that refuses the edited text (here: it insists on a re-check) keeps y unedited
    class Picky:
        def __init__(self, lab):
            self.lab, self.test = lab, lab.test

        def verify(self, problem, text):
            return self.lab.verify(problem, text) and ("chk" in text or "<think>" not in text)

        def format_ok(self, text):
            return True

    task = Picky(lab)
    a, _ = answers(lab)
    groups, ctx = scored(tokenizer, task, [f"<think>so {a}.{CHK}{CHK}</think><answer>{a}</answer>"])
    s0 = groups[0].samples[0]
    t = dre(DREConfig(), None)
    assert t(groups, ctx)[0].samples[0] is s0 and t.metrics()["rollout/dre_rejected"] == 1.0


def test_cap_and_p_edit_deterministic(tokenizer, lab):
    a, _ = answers(lab)
    texts = [f"<think>so {a}.{CHK * (2 + i)}</think><answer>{a}</answer>" for i in range(4)]
    edited = lambda out: [s.meta.get("dre_edited", False) for s in out[0].samples]  # noqa: E731
    groups, ctx = scored(tokenizer, lab, texts)
    first = edited(dre(DREConfig(max_edits_per_group=None), None)(groups, ctx))
    assert sum(first) == 2  # G // 2
    groups, ctx = scored(tokenizer, lab, texts)
    assert edited(dre(DREConfig(max_edits_per_group=None), None)(groups, ctx)) == first  # same (seed, step, stage)
    groups, ctx = scored(tokenizer, lab, texts)
    assert not any(edited(dre(DREConfig(p_edit=0.0), None)(groups, ctx)))
    groups, ctx = scored(tokenizer, lab, texts)
    assert all(edited(dre(DREConfig(max_edits_per_group=4, tau_abs=4), None)(groups, ctx)))


def test_edited_old_logprobs_equal_a_fresh_forward(tiny_model, tokenizer, lab, monkeypatch):
    # property 8: the update's PPO denominator for an edited row (old_logprobs None) is the current policy's
    # own detached teacher-forced pass; it equals a fresh forward of the same weights
    a, w = answers(lab)
    texts = [f"<think>so {a}.{CHK}{CHK}</think><answer>{a}</answer>", f"<think>so {w}.</think><answer>{w}</answer>"]
    groups, ctx = scored(tokenizer, lab, texts)
    samples = dre(DREConfig(), None)(groups, ctx)[0].samples
    assert samples[0].meta.get("dre_edited")
    with torch.no_grad():
        packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], tokenizer.pad_token_id)
        fresh = completion_logprobs(tiny_model, packed).logprobs
    seen = {}
    entry = LOSSES.get("ppo_clip")

    def spy(inp, cfg):
        for k, s in enumerate(inp.samples):
            seen[id(s)] = inp.old_logprobs[k, :s.length].clone()
        return entry.obj(inp, cfg)

    monkeypatch.setitem(LOSSES._entries, "ppo_clip", dataclasses.replace(entry, obj=spy))
    update = learner(tiny_model, tokenizer, ["optim.grad_clip=0", "rollout.max_completion_tokens=96"])
    m = update.step(rows(samples, [torch.full((s.length,), 1.0 - 2 * k) for k, s in enumerate(samples)]))
    for k, s in enumerate(samples):
        assert_close(seen[id(s)], fresh[k, :s.length], rtol=0, atol=1e-6)
    assert m["loss/ratio_mean"] == 1.0


class Oracle:
    """A scripted policy for DRE's own generator calls: ``answer(text)`` maps a request's decoded prompt (problem
    prompt and completion prefix) to the completion text; token k gets log-prob −0.25 − 0.01·k. Records calls."""

    def __init__(self, tokenizer, answer):
        self.tokenizer, self.answer, self.calls = tokenizer, answer, []

    def sync_weights(self, model) -> None:
        pass

    def generate(self, requests, params, rng):
        self.calls.append((requests, params))
        out = []
        for r in requests:
            text = self.tokenizer.decode(r.prompt_ids.tolist(), skip_special_tokens=True)
            ids = self.tokenizer.encode(self.answer(text), add_special_tokens=False) + [self.tokenizer.eos_token_id]
            ids = torch.tensor(ids[:r.max_tokens or params.max_tokens], dtype=torch.long)
            out.append(Completion(ids, -0.25 - 0.01 * torch.arange(len(ids), dtype=torch.float32), "stop",
                                  torch.zeros(len(ids), dtype=torch.bool)))
        return out


def with_oracle(ctx, answer):
    oracle = Oracle(ctx.tokenizer, answer)
    return dataclasses.replace(ctx, generator=CountingGenerator(oracle)), oracle


def probe_answer(gold, wrong, knows):
    """Probes (prompt ends with ``</think><answer>``) get the gold answer once ``knows(thinking so far)``."""
    def answer(text):
        assert text.endswith("</think><answer>"), text
        thinking = text.split("<think>", 1)[1][:-len("</think><answer>")]
        return f"{gold if knows(thinking) else wrong}</answer>"
    return answer


def test_probe_detector_first_boundary_with_a_correct_forced_answer(tokenizer, lab):
    # the policy "knows" the answer after the step 2+1=3; (before committing to it): t* is that boundary, not
    # the text detector's "so a."; boundaries (tokens incl. <think>): 7 12 23 28 38, </think> at 48; tails
    # 41 36 25 20 10 vs τ_abs 16, so the first 4 are probed, in one greedy call
    a, w = answers(lab)
    texts = [f"<think>1+1=2;so {w}.wait 2+1=3;so {a}.{CHK}{CHK}</think><answer>{a}</answer>",
             f"<think>so {w}.{CHK}{CHK}</think><answer>{w}</answer>"]  # incorrect: never probed
    groups, ctx = scored(tokenizer, lab, texts)
    y0 = copy.deepcopy(groups[0].samples[0])
    ctx, oracle = with_oracle(ctx, probe_answer(a, w, lambda th: "2+1=3;" in th))
    t = dre(DREConfig(detector="probe"), None)
    y = t(groups, ctx)[0].samples[0]
    assert y.text == f"<think>1+1=2;so {w}.wait 2+1=3;</think><answer>{a}</answer>" and y.correct
    assert torch.equal(y.completion_ids[:23], y0.completion_ids[:23]) and y.meta["dre_removed"] == 25
    (reqs, params), = oracle.calls
    assert len(reqs) == 4 and params.temperature == 0.0 and all(r.max_tokens == 16 for r in reqs)
    assert params.stop == ("</answer>",)  # greedy decoding stops at the answer's closing tag
    suffix = tokenizer.encode("</think><answer>", add_special_tokens=False)
    for r, b in zip(reqs, (7, 12, 23, 28)):
        assert r.prompt_ids.tolist() == [*y0.prompt_ids.tolist(), *y0.completion_ids[:b].tolist(), *suffix]
    m = t.metrics()
    assert m["rollout/dre_probes"] == 4 and m["rollout/dre_probe_tokens"] == 4 * 3  # "4", "</answer>", EOS
    assert m["rollout/dre_probe_tokens"] == ctx.generator.tokens  # and in the trainer's perf/gen_tokens
    assert m["rollout/dre_edited_frac"] == 0.5
    # no boundary verifies: nothing to edit
    groups, ctx = scored(tokenizer, lab, texts)
    ctx, _ = with_oracle(ctx, probe_answer(a, w, lambda th: False))
    assert not dre(DREConfig(detector="probe"), None)(groups, ctx)[0].samples[0].meta.get("dre_edited")


@pytest.mark.parametrize(("m_stable", "kept"), [(1, "1+1=2;"), (2, "1+1=2;so W.wait 2+1=3;"),
                                                 (3, "1+1=2;so W.wait 2+1=3;"), (4, None)])
def test_probe_m_stable_consecutive_boundaries(tokenizer, lab, m_stable, kept):
    # forced answers at the boundaries 7 12 23 28 38: right, wrong, right, right, right (right after every ';'
    # and once "so a." is written); m_stable 2 and 3 need a run from 23; 4 finds none (the fifth probe is the
    # last boundary inside the span; only t* with an eligible tail, 7..28, may start a run)
    a, w = answers(lab)
    texts = [f"<think>1+1=2;so {w}.wait 2+1=3;so {a}.{CHK}{CHK}</think><answer>{a}</answer>"]
    groups, ctx = scored(tokenizer, lab, texts)
    ctx, oracle = with_oracle(ctx, probe_answer(a, w, lambda th: th.endswith(";") or f"so {a}." in th))
    y = dre(DREConfig(detector="probe", m_stable=m_stable), None)(groups, ctx)[0].samples[0]
    assert len(oracle.calls) == 1 and len(oracle.calls[0][0]) == min(5, 4 + m_stable - 1)
    if kept is None:
        assert not y.meta.get("dre_edited")
    else:
        assert y.text == f"<think>{kept.replace('W', w)}</think><answer>{a}</answer>"


def test_probe_agreeing_with_the_text_detector_gives_identical_edits(tokenizer, lab):
    # lab reference traces with re-checks, wrong finals, wrong-then-right commitments, over three problems:
    # a probe that answers right exactly once "so <gold>." is written edits exactly as the text detector does
    problems = lab.test[:3]
    texts = []
    for p in problems:
        a, w = p.answer, str((int(p.answer) + 1) % 10)
        long = p.reference.replace("</think>", CHK * 2 + "</think>")
        texts += [long, p.reference, long.replace(f"<answer>{a}<", f"<answer>{w}<"),
                  long.replace(f"so {a}.", f"so {w}.{CHK}so {a}."), long.replace("</think>", CHK + "</think>")]
    gold = {p.prompt: p.answer for p in problems}

    def answer(text):
        a = gold[text.split("\n", 1)[0]]
        return probe_answer(a, str((int(a) + 1) % 10), lambda th: f"so {a}." in th)(text)

    out = {}
    for detector in ("text", "probe"):
        ctx = context(tokenizer, lab, texts, group_size=5)
        groups = ctx.sample_groups(problems)
        ctx.score(groups)
        ctx, oracle = with_oracle(ctx, answer)
        out[detector] = dre(DREConfig(detector=detector), None)(groups, ctx)
        assert len(oracle.calls) == (detector == "probe")
    edits = 0
    for g_text, g_probe in zip(out["text"], out["probe"]):
        for x, y in zip(g_text.samples, g_probe.samples, strict=True):
            assert x.text == y.text and torch.equal(x.completion_ids, y.completion_ids) and x.reward == y.reward
            assert torch.equal(x.rollout_logprobs.nan_to_num(9.0), y.rollout_logprobs.nan_to_num(9.0))
            assert x.meta == y.meta
            edits += bool(x.meta.get("dre_edited"))
    assert edits == 6  # G/2 = 2 of the 4 eligible per group (three re-check variants and the late commitment)


def test_regen_answer_carries_the_sampler_logprobs(tokenizer, lab):
    a, w = answers(lab)
    # the regenerated section (spaces inside the tags, which the lab's verifier strips) differs from the copy
    groups, ctx = scored(tokenizer, lab, [f"<think>so {a}.{CHK}{CHK}</think><answer>{a}</answer>"])
    y0 = copy.deepcopy(groups[0].samples[0])

    def answer(text):
        assert text.endswith(f"<think>so {a}.</think>"), text
        return f"<answer> {a} </answer>"

    ctx, oracle = with_oracle(ctx, answer)
    t = dre(DREConfig(answer_mode="regen"), None)
    y = t(groups, ctx)[0].samples[0]
    assert y.text == f"<think>so {a}.</think><answer> {a} </answer>" and y.correct and y.meta["dre_regen"]
    t_star, z = 6, tokenizer.encode(f"<answer> {a} </answer>", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert torch.equal(y.completion_ids[:t_star], y0.completion_ids[:t_star]) and y.length == t_star + 1 + len(z)
    assert y.completion_ids[t_star + 1:].tolist() == z and y.finish_reason == "stop"
    assert torch.equal(y.rollout_logprobs[:t_star], y0.rollout_logprobs[:t_star])
    assert torch.isnan(y.rollout_logprobs[t_star])  # the forced </think>
    assert_close(y.rollout_logprobs[t_star + 1:], -0.25 - 0.01 * torch.arange(len(z), dtype=torch.float32))
    assert y.old_logprobs is None and y.loss_mask.all()
    (reqs, params), = oracle.calls
    close = tokenizer.encode("</think>", add_special_tokens=False)
    assert reqs[0].prompt_ids.tolist() == [*y0.prompt_ids.tolist(), *y0.completion_ids[:t_star].tolist(), *close]
    assert reqs[0].max_tokens == 32 and params.temperature == ctx.params.temperature
    assert t.metrics()["rollout/dre_regen_tokens"] == len(z) == ctx.generator.tokens


def test_regen_answer_that_fails_verification_keeps_the_original(tokenizer, lab):
    a, w = answers(lab)
    groups, ctx = scored(tokenizer, lab, [f"<think>so {a}.{CHK}{CHK}</think><answer>{a}</answer>"])
    s0 = groups[0].samples[0]
    ids, lps = s0.completion_ids.clone(), s0.rollout_logprobs.clone()
    ctx, _ = with_oracle(ctx, lambda text: f"<answer>{w}</answer>")
    t = dre(DREConfig(answer_mode="regen"), None)
    y = t(groups, ctx)[0].samples[0]
    assert y is s0 and torch.equal(y.completion_ids, ids) and torch.equal(y.rollout_logprobs, lps)
    assert "dre_edited" not in y.meta and y.reward == 1.0
    m = t.metrics()
    assert m["rollout/dre_rejected"] == 1.0 and m["rollout/dre_edited_frac"] == 0.0


def test_config_validation():
    with pytest.raises(ValueError, match="delta"):
        DREConfig(delta=1.0)
    with pytest.raises(ValueError, match="capture group"):
        DREConfig(commit_pattern="so .")
    with pytest.raises(ConfigError, match="mode"):
        load(None, ["rollout.transforms=[{name: dre, mode: regen}]"])
    with pytest.raises(ConfigError, match="detector: 'oracle' is not allowed; allowed: text, probe"):
        load(None, ["rollout.transforms=[{name: dre, detector: oracle}]"])
    with pytest.raises(ConfigError, match="answer_mode: 'rethink' is not allowed; allowed: copy, regen"):
        load(None, ["rollout.transforms=[{name: dre, answer_mode: rethink}]"])
    with pytest.raises(ValueError, match=r"^m_stable=0: allowed >= 1$"):
        DREConfig(m_stable=0)
    with pytest.raises(ValueError, match=r"^detector='oracle': allowed text, probe$"):
        DREConfig(detector="oracle")
    with pytest.raises(ValueError, match="boundary_pattern"):
        DREConfig(boundary_pattern="(")
    assert DREConfig().suffix == "</think><answer>" and DREConfig(probe_suffix="X").suffix == "X"
