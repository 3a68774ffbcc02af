import dataclasses
import itertools
import math

import pytest
import torch
from support import reward_stage, rows

from groupwise.config import load
from groupwise.methods.rlcsd import RLCSDConfig, RLCSDHintsConfig, contrast, modulate, rlcsd, rlcsd_hints
from groupwise.models.forward import completion_logprobs, pack
from groupwise.registry import ConfigError
from groupwise.rollout.base import RolloutContext, SamplingParams
from groupwise.seeding import stable_seed
from groupwise.standard.fake import FakeConfig, FakeGenerator
from groupwise.types import Sample

CFG = RLCSDConfig()


def test_contrast_pinned():
    # π_T(y|h_c) = 0.8; wrong hints 0.2 and 0.4 (mean 0.3): e = ln(0.8 / 0.3) = 0.9808293
    e = contrast(torch.log(torch.tensor([0.8])), torch.log(torch.tensor([[0.2], [0.4]])))
    assert e.item() == pytest.approx(math.log(0.8 / 0.3), abs=1e-6)


def test_modulation_and_the_sign_preserving_clamp():
    e = torch.tensor([0.98, 0.0, -0.01])
    mod, sel = modulate(torch.full((3,), 1.0), e, CFG)
    # r = 0.5·tanh(e/0.02): 0.5·tanh(49) ≈ 0.5, 0 (not selected), 0.5·tanh(−0.5) = −0.2310586
    assert sel.tolist() == [True, False, True]
    assert mod.tolist() == pytest.approx([1.5, 1.0, 1.0 - 0.5 * math.tanh(0.5)], abs=1e-6)
    mod, _ = modulate(torch.full((3,), -0.3), e, CFG)
    assert mod.tolist() == pytest.approx([0.0, -0.3, -0.3 - 0.5 * math.tanh(0.5)], abs=1e-6)  # −0.3 + 0.5 → 0
    mod, _ = modulate(torch.zeros(3), e, CFG)
    assert mod.tolist() == [0.0, 0.0, 0.0]


def sample(n, e=None):
    meta = {} if e is None else {"rlcsd_e": torch.tensor(e)}
    return Sample(prompt_ids=torch.tensor([3]), completion_ids=torch.arange(2, 2 + n), rollout_logprobs=torch.zeros(n),
                  loss_mask=torch.ones(n, dtype=torch.bool), finish_reason="stop", meta=meta)


def test_two_path_weights_give_two_independent_token_means():
    # 10 loss tokens, 4 selected: weights N/N_sel = 2.5 and N/N_off = 10/6, so that Σ w·l / N is
    # mean_sel(l) + mean_off(l) (η = 1)
    samples = [sample(5, [1.0, 1.0, 0.0, 0.0, 0.0]), sample(5, [0.0, 0.0, -1.0, -1.0, 0.0])]
    b = rows(samples, [torch.full((5,), 0.5), torch.full((5,), -0.5)])
    out = rlcsd(b, CFG)
    sel = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 1, 1, 0]], dtype=torch.bool)
    assert torch.allclose(out.loss_weights[sel], torch.full((4,), 2.5))
    assert torch.allclose(out.loss_weights[~sel], torch.full((6,), 10 / 6))
    loss = torch.arange(10, dtype=torch.float32).view(2, 5)
    assert float((out.loss_weights * loss).sum() / 10) == pytest.approx(float(loss[sel].mean() + loss[~sel].mean()))
    assert out.advantages[0, 0].item() == pytest.approx(0.5 + 0.5 * math.tanh(50), abs=1e-6)


def test_beta_zero_is_plain_grpo_and_rows_without_contrast_keep_their_advantage():
    b = rows([sample(4, [1.0, -1.0, 0.5, 0.0]), sample(3)], [torch.full((4,), 0.7), torch.full((3,), -0.7)])
    keep = RLCSDConfig(drop_uncontrasted=False)
    assert rlcsd(b, dataclasses.replace(keep, beta=0.0)) is b
    out = rlcsd(b, keep)
    assert torch.equal(out.advantages[1], b.advantages[1])


def test_rows_without_contrast_are_dropped_from_the_update_by_default():
    # N = 9 loss tokens: row 0 contrasted (A = 0.5, e selects token 0 only: r = 0.5·tanh(50)); row 1 a lone
    # correct rollout (A = 1.2, no positive hint: no e); row 2 a uniform group's (A = 0, no e)
    b = rows([sample(4, [1.0, 0.0, 0.0, 0.0]), sample(3), sample(2)],
             [torch.full((4,), 0.5), torch.full((3,), 1.2), torch.zeros(2)])
    dropped = rlcsd(b, CFG)
    # the official code: rows 1 and 2 leave the update; row 0's means: w_sel = η·N/N_sel = 9/1,
    # w_off = N/N_off = 9/3
    assert dropped.loss_weights.tolist() == [[9.0, 3.0, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    want = [0.5 + 0.5 * math.tanh(50), 0.5, 0.5, 0.5]
    assert dropped.advantages[0].tolist() == pytest.approx(want, abs=1e-6)
    # drop_uncontrasted: false (this library before): they stay as plain GRPO rows, w_off = N/N_off = 9/8
    kept = rlcsd(b, RLCSDConfig(drop_uncontrasted=False))
    off = 9 / 8
    assert kept.loss_weights.tolist() == [[9.0, off, off, off], [off, off, off, 0.0], [off, off, 0.0, 0.0]]
    assert torch.equal(kept.advantages[1], b.advantages[1])
    assert torch.equal(dropped.advantages, kept.advantages)
    # token_mean over the N tokens: mean over the selected + mean over the other tokens of the rows kept
    loss = torch.arange(12, dtype=torch.float32).view(3, 4)
    assert float((dropped.loss_weights * loss).sum() / 9) == pytest.approx(0.0 + (1 + 2 + 3) / 3)
    # nothing selected (β = 0), the uncontrasted rows still leave: row 0 alone, weight N/4
    assert rlcsd(b, RLCSDConfig(beta=0.0)).loss_weights[:, 0].tolist() == [9 / 4, 0.0, 0.0]


def context(tokenizer, task, texts, model):
    counters: dict = {}

    def rng(stage):
        return torch.Generator().manual_seed(
            stable_seed(0, 0, stage, next(counters.setdefault(stage, itertools.count()))))

    def policy_logprobs(samples):
        packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], tokenizer.pad_token_id)
        with torch.no_grad():
            lp = completion_logprobs(model, packed).logprobs
        return [lp[k, :s.length] for k, s in enumerate(samples)]

    stage = reward_stage(task)
    encode = lambda p: torch.tensor(tokenizer.encode(p.prompt + "\n", add_special_tokens=False))  # noqa: E731
    return RolloutContext(generator=FakeGenerator(FakeConfig(completions=tuple(texts)), tokenizer), tokenizer=tokenizer,
                          task=task, score=lambda gs: stage(gs, 0), params=SamplingParams(64), group_size=len(texts),
                          step=0, rng=rng, encode=encode, policy_logprobs=policy_logprobs,
                          eos_id=tokenizer.eos_token_id)


def test_the_transform_contrasts_a_correct_hint_with_wrong_ones(tokenizer, lab, tiny_model):
    p = lab.test[0]
    a, w1, w2 = p.answer, str((int(p.answer) + 1) % 10), str((int(p.answer) + 2) % 10)
    texts = [f"<answer>{a}</answer>", f"<answer>{a}</answer>", f"<answer>{w1}</answer>", f"<answer>{w2}</answer>",
             "no answer"]
    ctx = context(tokenizer, lab, texts, tiny_model)
    groups = ctx.sample_groups([p])
    ctx.score(groups)
    t = rlcsd_hints(RLCSDHintsConfig(k_max=4), None)
    (g,) = t(groups, ctx)
    # every rollout has a correct sibling and a wrong sibling with an answer ("no answer" is never a negative):
    # targets 0, 1 (one positive each, 2 negatives), 2 and 3 (2 positives to draw from, 1 negative), 4 (2 negatives)
    assert all("rlcsd_e" in s.meta for s in g.samples)
    assert t.metrics()["rollout/rlcsd_teacher_rows"] == 3 + 3 + 2 + 2 + 3
    assert g.samples[0].meta["rlcsd_e"].shape == (g.samples[0].length,)
    # a group that is not mixed gets no contrast
    same = context(tokenizer, lab, [f"<answer>{a}</answer>"] * 3, tiny_model)
    flat = same.sample_groups([p])
    same.score(flat)
    assert not any("rlcsd_e" in s.meta for s in t(flat, same)[0].samples)


def test_one_sided_contrasts_the_hint_with_the_plain_prompt(tokenizer, lab, tiny_model):
    p = lab.test[0]
    a, w1 = p.answer, str((int(p.answer) + 1) % 10)
    texts = [f"<answer>{a}</answer>", f"<answer>{a}</answer>", f"<answer>{w1}</answer>", f"<answer>{a}</answer>"]
    ctx = context(tokenizer, lab, texts, tiny_model)
    groups = ctx.sample_groups([p])
    ctx.score(groups)
    t = rlcsd_hints(RLCSDHintsConfig(negatives="none"), None)
    (g,) = t(groups, ctx)
    assert t.metrics()["rollout/rlcsd_teacher_rows"] == 4 * 2  # each target: its hint and its plain prompt
    s = g.samples[2]  # the wrong one: its positive is one of the three correct siblings (all the same text)
    hinted = t._query(g, s, texts[0], ctx)
    want = ctx.policy_logprobs([hinted])[0] - ctx.policy_logprobs([s])[0]
    torch.testing.assert_close(s.meta["rlcsd_e"], want.float(), rtol=0, atol=1e-6)
    # an all-correct group still gets a signal (no wrong sibling is needed), which the clamp zeroes (A = 0)
    same = context(tokenizer, lab, [f"<answer>{a}</answer>"] * 3, tiny_model)
    flat = same.sample_groups([p])
    same.score(flat)
    assert all("rlcsd_e" in s.meta for s in t(flat, same)[0].samples)


def test_config():
    with pytest.raises(ConfigError,
                       match=r"credit 'rlcsd' requires 'rlcsd_contrast'.*allowed: add group transform 'rlcsd'"):
        load(None, ["credit=[rlcsd]"])
    with pytest.raises(ConfigError, match="token_mean"):
        load(None, ["rollout.transforms=[rlcsd]", "credit=[rlcsd]", "loss.reduction=seq_mean_token_mean"])
    load(None, ["rollout.transforms=[rlcsd]", "credit=[rlcsd]"])
    with pytest.raises(ValueError, match="needs \\{hint\\}"):
        RLCSDHintsConfig(context="{prompt}")
    with pytest.raises(ConfigError, match="negatives"):
        load(None, ["rollout.transforms=[{name: rlcsd, negatives: both}]", "credit=[rlcsd]"])
