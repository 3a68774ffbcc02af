"""The shared prefixes of a prefill (``forward.prefill(common=True)``): the tokens several distinct prompts start
with run once as one row (one a group of prompts: ``prefix_groups``). Generation (both decode paths) and the
shared-prefix update see what a plain prefill leaves, up to float summation order; each prefix's tokens reach the
model once."""

import copy

import pytest
import torch
from torch.testing import assert_close
from transformers import LlamaConfig, LlamaForCausalLM

from groupwise.models.forward import (
    cache_keyword,
    common_prefix_len,
    completion_logprobs,
    pack,
    prefill,
    prefix_groups,
    shared_prefix_logprobs,
)
from groupwise.rollout.base import Request, SamplingParams
from groupwise.standard.hf import HFConfig, HFGenerator

# initializer_range 0.3: a random model's attention is sharp enough that a wrongly masked or misplaced key
# moves the log-probs far beyond the tolerance (at 0.02 it would not, and the comparison could not fail)
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, vocab_size=108, pad_token_id=0,
             eos_token_id=1, bos_token_id=1, initializer_range=0.3)


def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SMALL)).eval()


def ids(*xs):
    return torch.tensor(xs, dtype=torch.long)


def test_common_prefix_len_by_hand():
    assert common_prefix_len([ids(5, 6, 7, 8), ids(5, 6, 9), ids(5, 6, 7)]) == 2
    assert common_prefix_len([ids(5, 6, 7), ids(5, 6, 7, 8)]) == 2  # every prompt keeps one token of its own
    assert common_prefix_len([ids(5, 6), ids(4, 6)]) == 0
    assert common_prefix_len([ids(5), ids(5, 6)]) == 0
    assert common_prefix_len([ids(3, 4, 5, 6, 7), ids(3, 4, 5, 6, 7)]) == 4


def prompts(tokenizer, system="You are a careful calculator; box the answer.\n"):
    """Distinct prompts behind one system text, of different lengths (their left padding differs)."""
    return [torch.tensor(tokenizer.encode(system + q + "\n", add_special_tokens=False))
            for q in ("3+5", "1-2+7-4+9", "8-1", "9+9+9")]


def forms(tokenizer):
    """Prompts asked in three forms, as the real-model lab asks them: two behind a long system text, two behind a
    shorter one (prefixes of different lengths: the groups' rows are left-padded), and one bare question that
    shares nothing with them but its first character."""
    long = prompts(tokenizer, "Work left to right, write each running total, then box the final answer.\n")[:2]
    short = prompts(tokenizer, "Box the answer, nothing else.\n")[2:]
    return [long[0], short[0], torch.tensor(tokenizer.encode("B 7+7+7+7\n", add_special_tokens=False)), long[1],
            short[1]]


def test_prefix_groups_by_hand():
    a = [*range(10, 30)]  # a 20-token shared prefix
    b = [*range(40, 58)]  # 18 tokens
    ps = [ids(*a, 1, 2), ids(*b, 3), ids(*a, 5), ids(9, 9), ids(*b, 4, 4, 4)]
    group, lengths = prefix_groups(ps)
    assert sorted(lengths) == [18, 20] and group[3] == -1 and group[0] == group[2] != group[1] == group[4]
    assert lengths[group[0]] == 20 and lengths[group[1]] == 18
    # 15 shared tokens (under MIN_SHARED 16): no group, a plain prefill
    assert prefix_groups([ids(*a[:15], 1, 2), ids(*a[:15], 3, 4)]) is None
    # a prefix under half of a group's: not joined (the third shares 17 tokens with a group that shares 40; with
    # one that shares 20 it joins, at 17)
    c = [*range(60, 100)]
    group, lengths = prefix_groups([ids(*c, 1), ids(*c, 2), ids(*c[:17], 99, 98)])
    assert lengths == [40] and group == [0, 0, -1]
    group, lengths = prefix_groups([ids(*a, 1), ids(*a, 2), ids(*a[:17], 99, 98)])
    assert lengths == [17] and group == [0, 0, 0]
    assert prefix_groups([ids(*a, 1), ids(*b, 2)]) is None  # nothing shared


@pytest.mark.parametrize("model", ["tiny", "llama"])
def test_prefill_with_a_prefix_a_form_equals_the_plain_prefill(model, tiny_model, tokenizer):
    m = tiny_model.eval() if model == "tiny" else llama()
    ps = forms(tokenizer)
    group, lengths = prefix_groups(ps)
    assert len(lengths) == 2 and len(set(lengths)) == 2 and group.count(-1) == 1
    rows = [ps[0], ps[1], ps[1], ps[2], ps[3], ps[4], ps[0]]
    with torch.no_grad():
        c0, l0, a0 = prefill(m, rows, tokenizer.pad_token_id, "cpu", common=False)
        c1, l1, a1 = prefill(m, rows, tokenizer.pad_token_id, "cpu", common=True)
        assert_close(l1, l0, rtol=0, atol=1e-5)
        assert torch.equal(a1.sum(-1), a0.sum(-1))
        nxt = torch.arange(len(rows)).unsqueeze(-1) + 7
        kw = cache_keyword(m)

        def step(cache, attn):
            mask = torch.cat([attn, attn.new_ones(len(rows), 1)], 1)
            return m(input_ids=nxt, attention_mask=mask, position_ids=attn.sum(-1, keepdim=True),
                     use_cache=True, **{kw: cache}).logits[:, -1]

        assert_close(step(c1, a1), step(c0, a0), rtol=0, atol=1e-5)


def test_each_groups_prefix_reaches_the_model_once(tiny_model, tokenizer):
    ps = forms(tokenizer)
    group, lengths = prefix_groups(ps)
    seen = []
    hook = tiny_model.get_input_embeddings().register_forward_hook(lambda mod, i, o: seen.append(tuple(i[0].shape)))
    with torch.no_grad():
        prefill(tiny_model, ps * 2, tokenizer.pad_token_id, "cpu")
    hook.remove()
    rest = max(len(p) - (lengths[k] if k >= 0 else 0) for p, k in zip(ps, group))
    assert seen == [(2, max(lengths)), (5, rest)] and rest < max(len(p) for p in ps) / 2


@pytest.mark.parametrize("model", ["tiny", "llama"])
def test_prefill_with_the_common_prefix_once_equals_the_plain_prefill(model, tiny_model, tokenizer):
    m = tiny_model.eval() if model == "tiny" else llama()
    ps = prompts(tokenizer)
    rows = [ps[0], ps[1], ps[1], ps[2], ps[3], ps[0]]
    assert common_prefix_len(ps) > 20
    with torch.no_grad():
        c0, l0, a0 = prefill(m, rows, tokenizer.pad_token_id, "cpu", common=False)
        c1, l1, a1 = prefill(m, rows, tokenizer.pad_token_id, "cpu", common=True)
        assert_close(l1, l0, rtol=0, atol=1e-5)
        assert torch.equal(a1.sum(-1), a0.sum(-1))  # the same keys are live, at the same positions
        # one more token on top of each cache: the keys (and their positions) the prompts left agree
        nxt = torch.arange(len(rows)).unsqueeze(-1) + 7
        kw = cache_keyword(m)

        def step(cache, attn, shift=0):
            mask = torch.cat([attn, attn.new_ones(len(rows), 1)], 1)
            return m(input_ids=nxt, attention_mask=mask, position_ids=attn.sum(-1, keepdim=True) + shift,
                     use_cache=True, **{kw: cache}).logits[:, -1]

        plain, shifted = step(c0, a0), step(copy.deepcopy(c0), a0, shift=1)
        assert_close(step(c1, a1), plain, rtol=0, atol=1e-5)
        assert float((shifted - plain).abs().max()) > 1e-3  # a position off by one would show


def test_the_prefix_reaches_the_model_once(tiny_model, tokenizer):
    ps = prompts(tokenizer)
    n = common_prefix_len(ps)
    seen = []
    hook = tiny_model.get_input_embeddings().register_forward_hook(
        lambda mod, i, o: seen.append(tuple(i[0].shape)))
    with torch.no_grad():
        prefill(tiny_model, ps * 2, tokenizer.pad_token_id, "cpu")
    hook.remove()
    assert seen == [(1, n), (4, max(len(p) for p in ps) - n)]


@pytest.mark.parametrize("decode", ["model", "fused"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_is_unchanged(decode, temperature, tokenizer):
    m = llama()
    reqs = [Request(p) for p in prompts(tokenizer) for _ in range(3)]
    params = SamplingParams(max_tokens=12, temperature=temperature)
    outs = [HFGenerator(HFConfig(decode=decode, share_common_prefix=c), m, tokenizer)
            .generate(reqs, params, torch.Generator().manual_seed(3)) for c in (False, True)]
    reqs = [Request(p) for p in forms(tokenizer) for _ in range(3)]
    outs += [HFGenerator(HFConfig(decode=decode, share_common_prefix=c), m, tokenizer)
             .generate(reqs, params, torch.Generator().manual_seed(4)) for c in (False, True)]
    assert max(len(o.completion_ids) for o in outs[0]) > 4
    for a, b in [*zip(outs[0], outs[1]), *zip(outs[2], outs[3])]:
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert_close(b.rollout_logprobs, a.rollout_logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["one prefix", "a prefix a form"])
def test_shared_prefix_update_with_a_common_prefix_equals_the_unshared_pass(kind, tokenizer):
    m = llama().train()
    ps = prompts(tokenizer) if kind == "one prefix" else forms(tokenizer)
    g = torch.Generator().manual_seed(0)
    rows = [(p, torch.randint(5, 100, (n,), generator=g)) for p in ps for n in (3, 6)]
    packed = pack([p for p, _ in rows], [c for _, c in rows], tokenizer.pad_token_id)
    grads = []
    for shared in (False, True):
        m.zero_grad()
        f = (shared_prefix_logprobs(m, packed, [p for p, _ in rows], tokenizer.pad_token_id) if shared
             else completion_logprobs(m, packed))
        (f.logprobs * packed.completion_mask).sum().backward()
        grads.append(([p.grad.clone() for p in m.parameters()], f.logprobs.detach()))
    assert_close(grads[1][1], grads[0][1], rtol=0, atol=1e-5)
    scale = max(float(a.abs().max()) for a in grads[0][0])
    assert scale > 1.0  # the loss sums ~40 log-probs of a sharp model: large gradients
    for a, b in zip(grads[0][0], grads[1][0]):
        # float summation order, relative to the largest gradient
        assert_close(b, a, rtol=0, atol=1e-5 * scale)
