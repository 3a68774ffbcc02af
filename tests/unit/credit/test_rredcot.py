import itertools
import math

import pytest
import torch
from support import reward_stage, rows

from groupwise.config import load
from groupwise.methods.rredcot import (
    RREDCoTConfig,
    RREDValuesConfig,
    boundaries,
    deltas,
    returns,
    rred_values,
    rredcot,
)
from groupwise.models.forward import completion_logprobs, pack
from groupwise.registry import ConfigError
from groupwise.rollout.base import RolloutContext, SamplingParams
from groupwise.seeding import stable_seed
from groupwise.standard.fake import FakeConfig, FakeGenerator
from groupwise.types import Sample


def test_deltas_split_the_mean_centred_return():
    # V̂(s_0) = 0.5 (group mean), V̂ = [0.2, 0.6], R = 1: δ = [−0.3, 0.4, 0.4], Σδ = R − mean = 0.5
    d = deltas([0.2, 0.6], 1.0, 0.5)
    assert d == pytest.approx([-0.3, 0.4, 0.4]) and sum(d) == pytest.approx(0.5)
    assert returns(d, 0.0) == pytest.approx(d)
    assert returns(d, 1.0) == pytest.approx([0.5, 0.8, 0.4])  # λ = 1: R − V̂(s_{k−1})
    assert returns(d, 0.5) == pytest.approx([-0.3 + 0.5 * (0.4 + 0.5 * 0.4), 0.4 + 0.5 * 0.4, 0.4])


def row(bounds, values, reward, length=10):
    return Sample(prompt_ids=torch.tensor([3]), completion_ids=torch.arange(2, 2 + length),
                  rollout_logprobs=torch.zeros(length), loss_mask=torch.ones(length, dtype=torch.bool),
                  finish_reason="stop", reward=reward, meta={"rred_bounds": bounds, "rred_values": values})


def test_credit_gives_each_segment_its_own_gain():
    # one group of two rows; row 0: R = 1, boundaries [3, 7, 9] (the last = end of thinking), values V̂(s_1),
    # V̂(s_2) = [0.2, 0.6]; row 1: R = 0, no boundary. mean 0.5, std (ddof 1) = 0.7071068: row 0's segments
    # [0,3) [3,7) [7,10) get δ = [−0.3, 0.4, 0.4] / (std + 1e-6)
    samples = [row([3, 7, 9], [0.2, 0.6], 1.0), row([], [], 0.0)]
    b = rows(samples, [torch.full((10,), 0.7), torch.full((10,), -0.7)])
    b = type(b)(**{**b.__dict__, "group_index": torch.tensor([0, 0])})
    out = rredcot(b, RREDCoTConfig()).advantages
    s = math.sqrt(0.5) + 1e-6
    expected = torch.tensor([-0.3 / s] * 3 + [0.4 / s] * 4 + [0.4 / s] * 3)
    assert torch.allclose(out[0].double(), expected.double(), atol=1e-6)
    assert torch.equal(out[1], b.advantages[1])  # no boundary: unchanged
    mixed = rredcot(b, RREDCoTConfig(mode="mix", omega=0.5)).advantages[0]
    assert torch.allclose(mixed.double(), 0.5 * 0.7 + 0.5 * expected.double(), atol=1e-6)


def test_a_uniform_group_keeps_its_advantages():
    # both rows R = 1 (std 0): δ of row 0 = [0.2 − 1, 0.6 − 0.2, 1 − 0.6] = [−0.8, 0.4, 0.4] would be divided by
    # std + 1e-6 = 1e-6 (±8e5); the return R − mean_G R is 0, so every row keeps GRPO's 0 (rudder and mix)
    samples = [row([3, 7, 9], [0.2, 0.6], 1.0), row([4, 9], [0.9], 1.0)]
    b = rows(samples, [torch.zeros(10), torch.zeros(10)])
    b = type(b)(**{**b.__dict__, "group_index": torch.tensor([0, 0])})
    for cfg in (RREDCoTConfig(), RREDCoTConfig(mode="mix", omega=0.5)):
        assert torch.equal(rredcot(b, cfg).advantages, torch.zeros(2, 10))
    # grpo_process normalises the δ over the group (their own std), so a uniform group still gets process credit
    assert rredcot(b, RREDCoTConfig(mode="grpo_process")).advantages.abs().max() > 0.5


def context(tokenizer, task, texts, model, step=0):
    counters: dict = {}

    def rng(stage):
        return torch.Generator().manual_seed(
            stable_seed(0, step, stage, next(counters.setdefault(stage, itertools.count()))))

    def policy_logprobs(samples):
        packed = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], tokenizer.pad_token_id)
        with torch.no_grad():
            lp = completion_logprobs(model, packed).logprobs
        return [lp[k, :s.length] for k, s in enumerate(samples)]

    stage = reward_stage(task)
    return RolloutContext(generator=FakeGenerator(FakeConfig(completions=tuple(texts)), tokenizer), tokenizer=tokenizer,
                          task=task, score=lambda gs: stage(gs, step), params=SamplingParams(64),
                          group_size=len(texts), step=step, rng=rng,
                          encode=lambda p: torch.tensor(tokenizer.encode(p.prompt + "\n", add_special_tokens=False)),
                          policy_logprobs=policy_logprobs, eos_id=tokenizer.eos_token_id)


def test_the_transform_estimates_values_with_the_policy_itself(tokenizer, lab, tiny_model):
    p = lab.test[0]
    a, w = p.answer, str((int(p.answer) + 1) % 10)
    texts = [f"<think>1+1=2;2+1=3;so {a}.</think><answer>{a}</answer>",
             f"<think>1+2=3;so {w}.</think><answer>{w}</answer>"]
    ctx = context(tokenizer, lab, texts, tiny_model)
    groups = ctx.sample_groups([p])
    ctx.score(groups)
    t = rred_values(RREDValuesConfig(), None)
    (g,) = t(groups, ctx)
    right, wrong = g.samples
    assert len(right.meta["rred_bounds"]) == 3 and len(wrong.meta["rred_bounds"]) == 2  # 2 and 1 steps + </think>
    assert tokenizer.decode(right.completion_ids[:right.meta["rred_bounds"][0]].tolist()) == "<think>1+1=2;"
    # only the gold answer is correct: one pass per boundary but the last; V̂ = π(gold | prefix ⊕ τ_ans) ∈ (0, 1)
    assert t.metrics()["rollout/rred_value_passes"] == 3.0
    assert all(0 < v < 1 for s in g.samples for v in s.meta["rred_values"])
    # the value is the product of the answer tokens' probabilities, computed by hand for the first boundary
    k = right.meta["rred_bounds"][0]
    forced = tokenizer.encode(f"</think><answer>{a}</answer>", add_special_tokens=False)
    ids = torch.cat([right.completion_ids[:k], torch.tensor(forced)])
    lp = ctx.policy_logprobs([Sample(prompt_ids=right.prompt_ids, completion_ids=ids,
                                     rollout_logprobs=torch.zeros(len(ids)),
                                     loss_mask=torch.ones(len(ids), dtype=torch.bool), finish_reason="stop")])[0]
    n_prefix = len(tokenizer.encode("</think><answer>", add_special_tokens=False))
    assert right.meta["rred_values"][0] == pytest.approx(float(lp[k + n_prefix:].sum().exp()), rel=1e-6)


def test_boundaries_merge_short_segments_and_end_at_thinking(tokenizer):
    text = "<think>1+1=2;2+1=3;3+1=4;so 4.</think><answer>4</answer>"
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False))
    s = Sample(prompt_ids=torch.tensor([3]), completion_ids=ids, rollout_logprobs=torch.zeros(len(ids)),
               loss_mask=torch.ones(len(ids), dtype=torch.bool), finish_reason="stop", text=text)
    b1 = boundaries(s, tokenizer, RREDValuesConfig())
    assert len(b1) == 4 and tokenizer.decode(ids[:b1[-1]].tolist()) == "<think>1+1=2;2+1=3;3+1=4;so 4."
    assert len(boundaries(s, tokenizer, RREDValuesConfig(min_len=10))) < len(b1)
    assert boundaries(s, tokenizer, RREDValuesConfig(max_segments=2)) == b1[-2:]


def test_config():
    with pytest.raises(ConfigError,
                       match=r"credit 'rredcot' requires 'rred_values'.*allowed: add group transform 'rredcot'"):
        load(None, ["credit=[rredcot]"])
    load(None, ["rollout.transforms=[rredcot]", "credit=[rredcot]"])
    with pytest.raises(ValueError, match="lam=2"):
        RREDCoTConfig(lam=2)
