import torch
from torch.testing import assert_close

from groupwise.models.forward import completion_logprobs, pack
from groupwise.rollout.base import Request, SamplingParams
from groupwise.rollout.hf import HFConfig, HFGenerator, top_p_filter


def prompt(tokenizer, text):
    return torch.tensor(tokenizer.encode(text + "\n", add_special_tokens=False))


def rng(seed=0):
    return torch.Generator().manual_seed(seed)


def test_rollout_logprobs_match_teacher_forcing(tiny_model, tokenizer):
    gen = HFGenerator(HFConfig(), tiny_model, tokenizer)
    reqs = [Request(prompt(tokenizer, "3+5")) for _ in range(4)] + [Request(prompt(tokenizer, "1-2+7-4"))] * 4
    outs = gen.generate(reqs, SamplingParams(max_tokens=12), rng())
    packed = pack([r.prompt_ids for r in reqs], [o.completion_ids for o in outs], tokenizer.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(tiny_model, packed).logprobs
    for i, o in enumerate(outs):
        assert_close(lp[i, :len(o.completion_ids)], o.rollout_logprobs, rtol=0, atol=1e-5)


def test_temperature_logprobs_are_of_the_tempered_distribution(tiny_model, tokenizer):
    gen = HFGenerator(HFConfig(), tiny_model, tokenizer)
    reqs = [Request(prompt(tokenizer, "3+5"))] * 3
    outs = gen.generate(reqs, SamplingParams(max_tokens=8, temperature=0.7), rng())
    packed = pack([r.prompt_ids for r in reqs], [o.completion_ids for o in outs], tokenizer.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(tiny_model, packed, temperature=0.7).logprobs
    for i, o in enumerate(outs):
        assert_close(lp[i, :len(o.completion_ids)], o.rollout_logprobs, rtol=0, atol=1e-5)


def test_top_p_logprobs_are_on_the_trainers_support(tiny_model, tokenizer):
    """Under top-p the sampler's log-probs are of logits / T over the full vocabulary (what the update
    computes), not renormalised over the nucleus: the sampler-trainer ratio carries no kept-mass factor."""
    gen = HFGenerator(HFConfig(), tiny_model, tokenizer)
    reqs = [Request(prompt(tokenizer, "3+5"))] * 4
    outs = gen.generate(reqs, SamplingParams(max_tokens=8, temperature=0.8, top_p=0.5), rng())
    packed = pack([r.prompt_ids for r in reqs], [o.completion_ids for o in outs], tokenizer.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(tiny_model, packed, temperature=0.8).logprobs
    for i, o in enumerate(outs):
        assert_close(lp[i, :len(o.completion_ids)], o.rollout_logprobs, rtol=0, atol=1e-5)


def test_left_padding_and_batching_do_not_change_greedy_output(tiny_model, tokenizer):
    gen = HFGenerator(HFConfig(), tiny_model, tokenizer)
    short = Request(prompt(tokenizer, "3+5"))
    alone = gen.generate([short], SamplingParams(max_tokens=10, temperature=0.0), rng())[0]
    mixed = gen.generate([Request(prompt(tokenizer, "9-9+9-9+9-9+1")), short],
                         SamplingParams(max_tokens=10, temperature=0.0), rng())[1]
    assert torch.equal(alone.completion_ids, mixed.completion_ids)
    assert_close(alone.rollout_logprobs, mixed.rollout_logprobs, rtol=0, atol=1e-5)


def test_same_seed_same_samples_and_shared_prefill_equals_separate(tiny_model, tokenizer):
    gen = HFGenerator(HFConfig(compact_below=0.0), tiny_model, tokenizer)
    reqs = [Request(prompt(tokenizer, "4+4"))] * 5
    a = gen.generate(reqs, SamplingParams(max_tokens=10), rng(3))
    b = gen.generate(reqs, SamplingParams(max_tokens=10), rng(3))
    assert all(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, b))
    assert len({tuple(x.completion_ids.tolist()) for x in a}) > 1  # samples differ within the group


def test_unshared_prefill_and_no_compaction_give_the_same_samples(tiny_model, tokenizer):
    """The benchmark's levers off (share_prefill=false: every row prefilled; compact_below=0: finished rows stay in
    the cache): the same tokens from the same seed, log-probs equal up to float summation order."""
    reqs = [Request(prompt(tokenizer, "4+4"))] * 4 + [Request(prompt(tokenizer, "1-2+7"))] * 4
    params = SamplingParams(max_tokens=12)
    on = HFGenerator(HFConfig(), tiny_model, tokenizer).generate(reqs, params, rng(5))
    for cfg in (HFConfig(share_prefill=False), HFConfig(compact_below=0.0)):
        off = HFGenerator(cfg, tiny_model, tokenizer).generate(reqs, params, rng(5))
        assert [x.completion_ids.tolist() for x in on] == [y.completion_ids.tolist() for y in off]
        for x, y in zip(on, off):
            assert_close(x.rollout_logprobs, y.rollout_logprobs, rtol=0, atol=1e-5)
    assert len({len(x.completion_ids) for x in on}) > 1  # rows finish at different steps: compaction ran


def test_forced_prefix_per_row_caps_and_eos(tiny_model, tokenizer):
    gen = HFGenerator(HFConfig(), tiny_model, tokenizer)
    nt = tokenizer.convert_tokens_to_ids("<NT>")
    reqs = [Request(prompt(tokenizer, "1+1"), prefix=(nt,), max_tokens=3),
            Request(prompt(tokenizer, "1+1"), max_tokens=7)]
    a, b = gen.generate(reqs, SamplingParams(max_tokens=20), rng())
    assert a.completion_ids[0].item() == nt and a.forced.tolist()[:1] == [True] and not a.forced[1:].any()
    assert len(a.completion_ids) <= 3 and len(b.completion_ids) <= 7
    for c in (a, b):
        ends_eos = c.completion_ids[-1].item() == tokenizer.eos_token_id
        assert c.finish_reason == ("stop" if ends_eos else "length")
        assert (c.completion_ids[:-1] != tokenizer.eos_token_id).all()  # generation stops at the first EOS


def test_stop_strings(tiny_model, tokenizer):
    gen = HFGenerator(HFConfig(), tiny_model, tokenizer)
    reqs = [Request(prompt(tokenizer, "2+2"))] * 16
    outs = gen.generate(reqs, SamplingParams(max_tokens=30, stop=("1",)), rng())
    for o in outs:
        text = tokenizer.decode(o.completion_ids.tolist(), skip_special_tokens=True)
        assert text.count("1") <= 1
        if "1" in text:
            assert text.endswith("1") and o.finish_reason == "stop"


def test_top_p_filter_pinned():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert_close(top_p_filter(probs, 0.7), torch.tensor([[0.5, 0.3, 0.0, 0.0]]))
    assert_close(top_p_filter(probs, 0.5), torch.tensor([[0.5, 0.0, 0.0, 0.0]]))
    assert_close(top_p_filter(probs, 1.0), probs)


def test_registered_hf_generator_samples_from_the_policy_itself(tiny_model, tokenizer):
    from groupwise.registry import BuildEnv
    from groupwise.rollout import GENERATORS

    gen = GENERATORS.get("hf").build(HFConfig(), BuildEnv(run=None, policy=tiny_model, tokenizer=tokenizer))
    assert isinstance(gen, HFGenerator) and gen.model is tiny_model  # weights are shared: sync is free
    gen.sync_weights(tiny_model)
    a = gen.generate([Request(prompt(tokenizer, "3+5"))] * 2, SamplingParams(max_tokens=6), rng(1))
    b = HFGenerator(HFConfig(), tiny_model, tokenizer).generate([Request(prompt(tokenizer, "3+5"))] * 2,
                                                                SamplingParams(max_tokens=6), rng(1))
    assert all(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, b))
