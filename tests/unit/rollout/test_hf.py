import torch
from torch.testing import assert_close

from groupwise.models.forward import completion_logprobs, pack
from groupwise.rollout.base import Request, SamplingParams
from groupwise.standard.hf import HFConfig, HFGenerator, race, sample_rows, top_p_filter


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


def test_race_pinned():
    """p = [0.1, 0.2, 0, 0.7] against u = [0.5, 0.9, 0.99, 0.01]: E = -log u = [0.693, 0.105, 0.010, 4.605], p / E =
    [0.144, 1.898, 0, 0.152]: token 1 wins though token 3 is likelier; the zero-mass token scores 0 even with the
    smallest E; u = 0 is floored (E = 87.3, finite), so a kept token beats zero-mass ones even then."""
    probs = torch.tensor([[0.1, 0.2, 0.0, 0.7]])
    assert race(probs, torch.tensor([[0.5, 0.9, 0.99, 0.01]])).item() == 1
    assert race(probs, torch.tensor([[0.5, 0.5, 0.999999, 0.5]])).item() == 3
    assert race(torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.5, 0.0, 0.5]])).item() == 1  # 0, 1/87.3, 0
    assert race(torch.tensor([[0.3, 0.7]]), torch.tensor([[0.0, 0.5]])).item() == 1


def test_sample_rows_draws_multinomials_law():
    """200,000 draws from rows with zeros and a 49,152-token row: frequencies within 4 standard errors of the
    probabilities (torch.multinomial's law), zero-mass tokens never drawn, top-p's zeros respected."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.0, 0.25, 0.05, 0.0, 0.6])
    n = 200_000
    draws = sample_rows(p.expand(n, -1), g)
    freq = torch.bincount(draws, minlength=6).double() / n
    se = (p.double() * (1 - p.double()) / n).sqrt()
    assert ((freq - p.double()).abs() <= 4 * se + 1e-12).all(), freq
    big = torch.softmax(torch.randn(49_152, generator=g) * 3, -1)
    kept = top_p_filter(big.unsqueeze(0), 0.5)[0]
    # 20 calls of 1,000 rows: the same law as one call of 20,000, at a 20th of its memory (one 20,000-row call held
    # ~12 GB of full-vocabulary tensors: the suite's peak, and the OOM killer's pick beside the lab's runs)
    draws = torch.cat([sample_rows(kept.expand(1_000, -1).contiguous(), g) for _ in range(20)])
    assert (kept[draws] > 0).all()
    top = kept.argmax()
    share = (draws == top).double().mean().item()
    expect = (kept[top] / kept.sum()).item()
    assert abs(share - expect) <= 4 * (expect * (1 - expect) / 20_000) ** 0.5


def test_the_sampler_setting_picks_the_race_or_torch_multinomial(tiny_model, tokenizer):
    """``sampler: race`` (the default) draws with ``sample_rows``; ``multinomial`` with ``torch.multinomial``, token
    for token as every run before 2026-12-06 did."""
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 3
    lp = torch.log_softmax(logits, -1)
    for sampler, draw in (("race", sample_rows),
                          ("multinomial", lambda p, g: torch.multinomial(p, 1, generator=g).squeeze(-1))):
        gen = HFGenerator(HFConfig(sampler=sampler), tiny_model, tokenizer)
        tok, got_lp = gen._pick(logits, SamplingParams(max_tokens=1), torch.Generator().manual_seed(7))
        assert torch.equal(tok, draw(lp.exp(), torch.Generator().manual_seed(7)))
        assert_close(got_lp, lp)


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
