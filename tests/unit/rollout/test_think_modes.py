import itertools

import pytest
import torch
from support import reward_stage
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.think_modes.builder import ThinkModesConfig, think_modes
from groupwise.methods.think_modes.mode_balance import ModeBalanceConfig, mode_balance
from groupwise.models.forward import completion_logprobs, pack
from groupwise.registry import ConfigError, NoConfig
from groupwise.rollout.base import Request, RolloutContext, SamplingParams
from groupwise.seeding import stable_seed
from groupwise.standard.fake import FakeConfig, FakeGenerator
from groupwise.standard.grpo import dr_grpo
from groupwise.standard.hf import HFConfig, HFGenerator
from groupwise.standard.lab import Lab, LabConfig
from groupwise.types import Completion, ScoredBatch

TERMS = ["rollout.builder.name=think_modes", "task.modes=true", "reward.terms=[{name: think_mode}]"]
CORRECTNESS = ()


@pytest.fixture(scope="module")
def mode_lab():
    return Lab(LabConfig(modes=True, test_size=8), seed=0)


def context(tokenizer, task, generator, step=0, group_size=6, max_tokens=48, terms=TERMS):
    scorer = reward_stage(task, terms)
    counters: dict = {}

    def rng(stage):
        return torch.Generator().manual_seed(
            stable_seed(0, step, stage, next(counters.setdefault(stage, itertools.count()))))

    return RolloutContext(
        generator=generator, tokenizer=tokenizer, task=task, score=lambda gs: scorer(gs, step),
        params=SamplingParams(max_tokens), group_size=group_size, step=step, rng=rng,
        encode=lambda p: torch.tensor(tokenizer.encode(p.prompt + "\n", add_special_tokens=False)),
        policy_logprobs=lambda samples: [], eos_id=tokenizer.eos_token_id)


def built(builder, problems, ctx):
    """What rl_step does with a builder: build, then score with the reward stage."""
    groups = builder(problems, ctx)
    ctx.score(groups)
    return groups


class Scripted:
    """Phase 1 (no prefix): row i samples the tokens of ``first[i % len]`` (up to its cap); phase 2
    (prefix given): the prefix, then ``rest``, then EOS, log-prob −1 per token, cut at the row's cap."""

    def __init__(self, tokenizer, first, rest):
        self.tok, self.first, self.rest = tokenizer, first, rest

    def sync_weights(self, model):
        pass

    def generate(self, requests: list[Request], params: SamplingParams, rng) -> list[Completion]:
        out = []
        for i, r in enumerate(requests):
            cap = r.max_tokens or params.max_tokens
            if not r.prefix:  # phase 1: the row's tokens up to the cap, token t at log-prob −0.1·(i+1)·(t+1)
                ids = torch.tensor(self.tok.encode(self.first[i % len(self.first)], add_special_tokens=False)[:cap])
                lp = torch.tensor([-0.1 * (i + 1) * (t + 1) for t in range(len(ids))])
                out.append(Completion(ids, lp, "length", torch.zeros(len(ids), dtype=torch.bool)))
                continue
            ids = list(r.prefix) + self.tok.encode(self.rest, add_special_tokens=False) + [self.tok.eos_token_id]
            reason = "stop" if len(ids) <= cap else "length"
            ids = torch.tensor(ids[:cap])
            forced = torch.zeros_like(ids, dtype=torch.bool)
            forced[:len(r.prefix)] = True
            out.append(Completion(ids, torch.full(ids.shape, -1.0), reason, forced))
        return out


def test_forced_warmup_equal_thirds_prefilled_untrained(tokenizer, mode_lab):
    # property 6: G = 8 over 3 modes → counts {3, 3, 2}; mode token prefilled with loss_mask False
    problems = list(mode_lab.test[:4])
    text = "<think>1+1=2;so 2.</think><answer>2</answer>"  # 16 tokens + EOS after the mode token
    ctx = context(tokenizer, mode_lab, FakeGenerator(FakeConfig(completions=(text,)), tokenizer), step=3, group_size=8)
    build = think_modes(ThinkModesConfig(cap_nt=8, cap_sh=40, warmup_steps=4), None)
    groups = built(build, problems, ctx)
    ids = {m: tokenizer.convert_tokens_to_ids(m) for m in ("<NT>", "<SH>", "<LG>")}
    for g in groups:
        modes = [s.meta["mode"] for s in g.samples]
        assert sorted(modes.count(m) for m in ids) == [2, 3, 3]
        for s in g.samples:
            assert s.completion_ids[0] == ids[s.meta["mode"]] and s.meta["mode_forced"]
            assert not s.loss_mask[0] and s.loss_mask[1:].all()
            if s.meta["mode"] == "<NT>":  # cut at cap 8 after the mode token: over cap, graded 0
                assert s.length == 9 and s.meta["over_cap"] and not s.correct and s.reward == 0.0
            else:
                assert s.length == 18 and not s.meta["over_cap"]
    m = build.metrics()
    assert m["rollout/mode_forced"] == 1.0 and m["rollout/mode_invalid_frac"] == 0.0
    assert sum(m[f"rollout/mode_share_{k}"] for k in ("NT", "SH", "LG")) == pytest.approx(1.0)
    assert m["rollout/mode_over_cap_frac"] == pytest.approx(m["rollout/mode_share_NT"])


def test_over_cap_rollout_with_a_correct_answer_is_graded_incorrect(tokenizer, mode_lab):
    # the answer is complete within the cap but the rollout keeps going past it: exceeding the cap ⇒ incorrect
    p = mode_lab.test[0]
    text = f"<answer>{p.answer}</answer>chkchk"
    ctx = context(tokenizer, mode_lab, FakeGenerator(FakeConfig(completions=(text,)), tokenizer), group_size=3)
    groups = built(think_modes(ThinkModesConfig(cap_nt=5, cap_sh=40, warmup_steps=1), None), [p], ctx)
    nt = next(s for s in groups[0].samples if s.meta["mode"] == "<NT>")
    sh = next(s for s in groups[0].samples if s.meta["mode"] == "<SH>")
    assert mode_lab.verify(p, nt.text) and nt.meta["over_cap"] and not nt.correct and nt.reward == 0.0
    assert sh.correct and sh.reward > 1.0  # within cap: correct, and Short's shaped reward exceeds Long's 1.0


def test_two_phase_trains_the_sampled_mode_token_and_flags_invalid(tokenizer, mode_lab):
    # properties 7 and the cap rule after warm-up
    p = mode_lab.test[0]
    rest = f"<think>so {p.answer}.</think><answer>{p.answer}</answer>"  # 10 tokens + EOS
    gen = Scripted(tokenizer, ["<NT>", "<SH>", "<LG>", "7", "<LG>", "<think>"], rest)
    ctx = context(tokenizer, mode_lab, gen, step=5, group_size=6)
    build = think_modes(ThinkModesConfig(cap_nt=8, cap_sh=22, warmup_steps=5), None)
    (g,) = built(build, [p], ctx)
    assert [s.meta["mode"] for s in g.samples] == ["<NT>", "<SH>", "<LG>", "invalid", "<LG>", "invalid"]
    for i, s in enumerate(g.samples):
        assert s.loss_mask.all() and not s.meta["mode_forced"]  # the policy chose its first token: trained
        assert s.rollout_logprobs[0].item() == pytest.approx(-0.1 * (i + 1))  # phase 1's sampling log-prob
    nt, sh, lg, bad = g.samples[:4]
    assert nt.length == 9 and nt.meta["over_cap"] and nt.reward == 0.0  # cut at 8 tokens after <NT>
    # Short, L = 11 tokens after the mode token: 1.25^(1 − 11/22) = 1.25^0.5 = 1.1180340
    assert sh.length == 12 and sh.correct and sh.reward == pytest.approx(1.1180340, abs=1e-7)
    assert lg.correct and lg.reward == 1.0 and lg.meta["mode_cap"] == 47
    assert bad.length == 1 and bad.text == "7" and bad.reward == 0.0 and not bad.correct
    m = build.metrics()
    assert m["rollout/mode_invalid_frac"] == pytest.approx(2 / 6) and m["rollout/mode_share_LG"] == pytest.approx(2 / 6)
    assert m["rollout/mode_forced"] == 0.0 and m["rollout/mode_acc_LG"] == 1.0


class CharTags:
    """The tiny tokenizer with each mode tag spelled in its characters, 4 tokens sharing the first ``<``, as SmolLM2's
    tokenizer splits them (into ``<``, ``NT``, ``>``)."""

    def __init__(self, tokenizer):
        self._tok = tokenizer

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __len__(self):
        return len(self._tok)

    def encode(self, text, add_special_tokens=True):
        if text in ("<NT>", "<SH>", "<LG>"):
            return [self._tok.convert_tokens_to_ids(c) for c in text]
        return self._tok.encode(text, add_special_tokens=add_special_tokens)


def test_multi_token_tags_forced_then_sampled(tokenizer, mode_lab):
    tok = CharTags(tokenizer)
    p = mode_lab.test[0]
    rest = f"<think>so {p.answer}.</think><answer>{p.answer}</answer>"  # 10 tokens + EOS
    cfg = ThinkModesConfig(cap_nt=8, cap_sh=22, warmup_steps=5, tag_tokens=4)
    chars = {m: [tokenizer.convert_tokens_to_ids(c) for c in m] for m in ("<NT>", "<SH>", "<LG>")}
    # forced: the prefix is the whole tag, none of it trained; caps count the tokens after it
    forced = built(think_modes(cfg, None), [p], context(tok, mode_lab, Scripted(tok, [], rest), step=2, group_size=6))
    for s in forced[0].samples:
        m = s.meta["mode"]
        assert s.completion_ids[:4].tolist() == chars[m] and s.meta["mode_len"] == 4 and s.meta["mode_forced"]
        assert not s.loss_mask[:4].any() and s.loss_mask[4:].all()
        assert s.length == (12 if m == "<NT>" else 15) and s.meta["over_cap"] == (m == "<NT>")
    # sampled: phase 1 draws 4 tokens; a row that starts with a tag continues from it; any other start is invalid
    gen = Scripted(tok, ["<NT>", "<SH>", "<LG>", "<XY>", "7", "<N"], rest)
    build = think_modes(cfg, None)
    (g,) = built(build, [p], context(tok, mode_lab, gen, step=5, group_size=6))
    assert [s.meta["mode"] for s in g.samples] == ["<NT>", "<SH>", "<LG>", "invalid", "invalid", "invalid"]
    assert [s.meta["mode_len"] for s in g.samples] == [4, 4, 4, 0, 0, 0]
    for i, s in enumerate(g.samples[:3]):
        assert s.completion_ids[:4].tolist() == chars[s.meta["mode"]] and s.loss_mask.all()
        assert_close(s.rollout_logprobs[:4], torch.tensor([-0.1 * (i + 1) * (t + 1) for t in range(4)]))
        assert (s.rollout_logprobs[4:] == -1.0).all()  # phase 2's own
    nt, sh, lg, xy, seven, partial = g.samples
    assert nt.length == 12 and nt.meta["over_cap"] and nt.reward == 0.0  # cut at 8 tokens after the 4-token tag
    # Short, L = 11 tokens after the tag: 1.25^(1 − 11/22) = 1.1180340
    assert sh.length == 15 and sh.correct and sh.reward == pytest.approx(1.1180340, abs=1e-7)
    assert lg.correct and lg.reward == 1.0 and lg.meta["mode_cap"] == 44  # the global cap: 48 − tag_tokens
    assert (xy.text, seven.text, partial.text) == ("<XY>", "7", "<N")  # phase 1's tokens kept, trained, reward 0
    assert all(s.loss_mask.all() and s.reward == 0.0 for s in (xy, seven, partial))
    assert build.metrics()["rollout/mode_invalid_frac"] == pytest.approx(3 / 6)


def test_tags_are_checked_against_the_tokenizer(tokenizer):
    from groupwise.methods.think_modes.builder import mode_ids

    assert mode_ids(tokenizer, ("<NT>", "<LG>"), 1) == {"<NT>": (tokenizer.convert_tokens_to_ids("<NT>"),),
                                                         "<LG>": (tokenizer.convert_tokens_to_ids("<LG>"),)}
    with pytest.raises(ValueError, match=r"tag <NT> is 4 tokens in this tokenizer; set rollout.builder.tag_tokens=4"):
        mode_ids(CharTags(tokenizer), ("<NT>", "<SH>"), 1)

    class Unknown(CharTags):  # a tokenizer without the tag: <NT> becomes its unknown (here: padding) token
        def encode(self, text, add_special_tokens=True):
            return [0] if text == "<NT>" else super().encode(text, add_special_tokens)

    with pytest.raises(ValueError, match=r"tag <NT> does not round-trip through the tokenizer \(ids \[0\]\)"):
        mode_ids(Unknown(tokenizer), ("<NT>", "<SH>"), 4)


def test_two_phase_logprobs_match_teacher_forcing(tiny_model, tokenizer, mode_lab):
    # a random tiny model with a logit bias towards the mode tags, so that phase 1 samples real modes
    ids = [tokenizer.convert_tokens_to_ids(m) for m in ("<NT>", "<SH>", "<LG>")]
    bias = torch.zeros(len(tokenizer))
    bias[ids] = 6.0
    tiny_model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    gen = HFGenerator(HFConfig(), tiny_model, tokenizer)
    ctx = context(tokenizer, mode_lab, gen, step=9, group_size=8, max_tokens=16)
    groups = built(think_modes(ThinkModesConfig(cap_nt=4, cap_sh=8, warmup_steps=0), None), list(mode_lab.test[:2]),
                   ctx)
    samples = [s for g in groups for s in g.samples]
    assert {s.meta["mode"] for s in samples} >= {"<NT>", "<SH>"}
    packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], tokenizer.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(tiny_model, packed).logprobs
    for k, s in enumerate(samples):
        assert s.loss_mask.all()
        assert s.length <= s.meta["mode_cap"] + 1 or s.meta["mode"] == "invalid"
        assert_close(lp[k, :s.length], s.rollout_logprobs, rtol=0, atol=1e-5)


def test_one_forced_mode_with_zero_balance_is_plain_grpo(tiny_model, tokenizer, mode_lab):
    # neutral setting: only <LG> (forced), β_bal = 0, think_mode reward, dr_grpo  ==  plain GRPO that samples
    # after a prefilled <LG> with the correctness reward and dr_grpo: same tokens, masks, rewards, advantages
    problems = list(mode_lab.test[:3])
    lg = tokenizer.convert_tokens_to_ids("<LG>")
    gen = HFGenerator(HFConfig(), tiny_model, tokenizer)
    tm = built(think_modes(ThinkModesConfig(modes=("<LG>",), warmup_steps=0), None), problems,
               context(tokenizer, mode_lab, gen, 7))
    ctx = context(tokenizer, mode_lab, gen, 7, terms=CORRECTNESS)
    plain = ctx.sample_groups(problems, prefixes=[[[lg]] * 6 for _ in problems])
    ctx.score(plain)
    for a, b in zip(tm, plain):
        for x, y in zip(a.samples, b.samples):
            assert torch.equal(x.completion_ids, y.completion_ids) and torch.equal(x.loss_mask, y.loss_mask)
            assert torch.equal(x.rollout_logprobs, y.rollout_logprobs) and x.reward == y.reward
    # rewards and advantages, on scripted completions with a mix of right and wrong answers
    p = problems[0]
    wrong = str((int(p.answer) + 1) % 10)
    texts = tuple(f"<think>so {a}.</think><answer>{a}</answer>" for a in (p.answer, wrong, wrong, p.answer))
    fake = lambda: FakeGenerator(FakeConfig(completions=texts), tokenizer)  # noqa: E731
    tm = built(think_modes(ThinkModesConfig(modes=("<LG>",), warmup_steps=0), None), [p],
               context(tokenizer, mode_lab, fake(), 7, 4))
    ctx = context(tokenizer, mode_lab, fake(), 7, 4, terms=CORRECTNESS)
    plain = ctx.sample_groups([p], prefixes=[[[lg]] * 4])
    ctx.score(plain)
    assert [s.reward for s in tm[0].samples] == [s.reward for s in plain[0].samples] == [1.0, 0.0, 0.0, 1.0]
    b1, b2 = ScoredBatch.from_groups(tm), ScoredBatch.from_groups(plain)
    a1 = mode_balance(b1, dr_grpo(b1, NoConfig()), ModeBalanceConfig(coef=0.0))
    assert torch.equal(a1, dr_grpo(b2, NoConfig()))


def test_config_validation():
    base = ["rollout.builder.name=think_modes", "task.modes=true"]
    assert load(None, base).rollout.builder.cfg.caps(64) == {"<NT>": 8, "<SH>": 40, "<LG>": 63}
    with pytest.raises(ConfigError, match="increase strictly"):
        load(None, [*base, "rollout.builder.cap_sh=8"])
    with pytest.raises(ConfigError, match="increase strictly"):
        load(None, [*base, "rollout.builder.cap_lg=30"])
    with pytest.raises(ConfigError, match="max_completion_tokens"):
        load(None, [*base, "rollout.max_completion_tokens=40"])  # cap_sh 40 > 39
    with pytest.raises(ConfigError, match="max_completion_tokens"):
        load(None, [*base, "rollout.builder.cap_lg=80"])
    # caps of modes that are not allowed are not used: a Long-only builder fits a short global cap
    one = load(None, [*base, "rollout.builder.modes=[<LG>]", "rollout.max_completion_tokens=40"]).rollout.builder.cfg
    assert one.caps(40)["<LG>"] == 39
    three = load(None, [*base, "rollout.builder.tag_tokens=3"]).rollout.builder.cfg  # SmolLM2's tags
    assert three.caps(64)["<LG>"] == 61
    with pytest.raises(ConfigError, match="max_completion_tokens − tag_tokens = 37"):
        load(None, [*base, "rollout.builder.tag_tokens=3", "rollout.max_completion_tokens=40"])  # cap_sh 40 > 37
    with pytest.raises(ConfigError, match="tag_tokens >= 1"):
        load(None, [*base, "rollout.builder.tag_tokens=0"])
    with pytest.raises(ConfigError, match="modes: true"):
        load(None, ["rollout.builder.name=think_modes"])
    with pytest.raises(ConfigError, match="subset"):
        load(None, [*base, "rollout.builder.modes=[<NT>, <XX>]"])
