"""Shared-prefix training (``optim.shared_prefix``): each distinct prompt of a micro-batch runs once, its cache
expanded to the rows that share it. The per-token log-probs, entropies and full-vocabulary log-probs, the
update's gradient (with the KL reference's pass shared too) and its metrics equal the unshared computation up
to float summation order, and the model sees each group's prompt once instead of once per row."""

import copy

import pytest
import torch
from test_update import grads_after_step
from torch.testing import assert_close

from groupwise.models.forward import completion_logprobs, pack, shared_prefix_logprobs
from groupwise.types import Sample


def grouped(tok, lengths=((20, (3, 1, 6, 4)), (9, (5, 2, 7, 3)), (31, (1, 8, 2, 5))), seed=0):
    """Groups of completions behind one prompt each, prompts of different lengths (left padding differs)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p_len, c_lens in lengths:
        p = torch.randint(5, 60, (p_len,), generator=g)
        for c_len in c_lens:
            c = torch.randint(5, 60, (c_len,), generator=g)
            out.append(Sample(prompt_ids=p, completion_ids=c, rollout_logprobs=torch.zeros(c_len),
                              loss_mask=torch.ones(c_len, dtype=torch.bool), finish_reason="stop"))
    return out


def test_shared_forward_equals_the_unshared_one(tiny_model, tokenizer):
    rows = grouped(tokenizer)
    packed = pack([s.prompt_ids for s in rows], [s.completion_ids for s in rows], tokenizer.pad_token_id)
    a = completion_logprobs(tiny_model, packed, 0.7, with_entropy=True, with_vocab=True)
    b = shared_prefix_logprobs(tiny_model, packed, [s.prompt_ids for s in rows], tokenizer.pad_token_id, 0.7,
                               with_entropy=True, with_vocab=True)
    assert_close(b.logprobs, a.logprobs, rtol=0, atol=1e-5)
    assert_close(b.entropy, a.entropy, rtol=0, atol=1e-5)
    assert_close(b.vocab_logprobs, a.vocab_logprobs, rtol=0, atol=1e-5)
    assert float(a.logprobs.abs().sum()) > 1.0 and (b.logprobs[~packed.completion_mask] == 0).all()


def test_each_prompt_runs_once(tiny_model, tokenizer):
    rows = grouped(tokenizer)
    packed = pack([s.prompt_ids for s in rows], [s.completion_ids for s in rows], tokenizer.pad_token_id)
    seen = []
    hook = tiny_model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].numel()))
    completion_logprobs(tiny_model, packed)
    shared_prefix_logprobs(tiny_model, packed, [s.prompt_ids for s in rows], tokenizer.pad_token_id)
    hook.remove()
    b, width = packed.input_ids.shape
    t = width - packed.prompt_width
    assert seen == [b * width, 3 * 31, b * t]  # 12 rows × (P + T), then 3 prompts × P, then 12 × T


@pytest.mark.parametrize("kl", [False, True], ids=["ppo_clip", "with-kl-reference"])
def test_the_update_is_the_unshared_one(tiny_model, tokenizer, kl):
    rows = grouped(tokenizer)
    adv = [torch.full((s.length,), float(i % 4) - 1.5) for i, s in enumerate(rows)]
    base = ["optim.grad_clip=0", "optim.micro_batch_tokens=200"]  # several micro-batches, prompts split across them
    ref = None
    if kl:
        base.append("loss.terms=[{name: ppo_clip}, {name: kl, weight: 0.1}]")
        ref = copy.deepcopy(tiny_model)
        with torch.no_grad():  # a reference that differs from the policy, so the KL term has a gradient
            for p in ref.parameters():
                p.add_(0.01 * torch.randn_like(p))
    plain, m1 = grads_after_step(tiny_model, tokenizer, rows, adv, [*base, "optim.shared_prefix=false"], ref=ref)
    shared, m2 = grads_after_step(tiny_model, tokenizer, rows, adv, [*base, "optim.shared_prefix=true"], ref=ref)
    assert m1["update/micro_batches"] >= 2
    for k in plain:
        assert_close(shared[k], plain[k], rtol=1e-4, atol=1e-7)
    for k in ("loss/total", "policy/entropy") + (("loss/kl",) if kl else ()):
        assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k
    assert max(float(g.abs().max()) for g in plain.values()) > 1e-3, "a vanishing gradient would make this vacuous"


def test_a_lora_policy_and_its_base_view_share_prefixes(tokenizer):
    pytest.importorskip("peft")
    from groupwise.models import lora

    policy = lora_policy(tokenizer)
    rows = grouped(tokenizer, ((12, (3, 5)), (7, (4, 2))))
    packed = pack([s.prompt_ids for s in rows], [s.completion_ids for s in rows], tokenizer.pad_token_id)
    for model in (policy, lora.BaseView(policy)):
        a = completion_logprobs(model, packed)
        b = shared_prefix_logprobs(model, packed, [s.prompt_ids for s in rows], tokenizer.pad_token_id)
        assert_close(b.logprobs, a.logprobs, rtol=0, atol=1e-5)
    base = lora.BaseView(policy)
    assert float((completion_logprobs(base, packed).logprobs - completion_logprobs(policy, packed).logprobs)
                 .abs().max()) > 1e-3, "the adapter changes the policy: the two models above differ"


def lora_policy(tokenizer, dropout=0.0):
    """lab-tiny under a LoRA adapter whose B is not 0, so the policy differs from its base (the KL reference)."""
    from groupwise.config import LoraConfig
    from groupwise.models import lora
    from groupwise.models.tiny import build_model

    policy = lora.wrap(build_model("lab-tiny", tokenizer, seed=0), LoraConfig(r=4, dropout=dropout))
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)
    return policy


def test_a_lora_update_with_its_kl_reference_is_the_unshared_one(tokenizer):
    """LoRA (``models/lora.py``): the adapter's gradient and the step's metrics, with the KL reference (the policy
    with its adapter off, ``lora.BaseView``) shared too, equal the unshared update's."""
    pytest.importorskip("peft")
    import support

    from groupwise.models import lora

    rows = grouped(tokenizer)
    adv = [torch.full((s.length,), float(i % 4) - 1.5) for i, s in enumerate(rows)]
    base = ["optim.grad_clip=0", "optim.micro_batch_tokens=200",
            "loss.terms=[{name: ppo_clip}, {name: kl, weight: 0.1}]"]
    out = {}
    for shared in (False, True):
        policy = lora_policy(tokenizer)
        learner = support.learner(policy, tokenizer, [*base, f"optim.shared_prefix={shared}"],
                                  ref=lora.BaseView(policy))
        grads, real = {}, learner.optimizer.step

        def capture(*a, grads=grads, real=real, policy=policy, **k):
            grads.update({n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad})
            return real(*a, **k)

        learner.optimizer.step = capture
        out[shared] = grads, learner.step(support.rows(rows, adv))
    (plain, m1), (shared, m2) = out[False], out[True]
    assert m1["update/micro_batches"] >= 2 and len(plain) > 0 and all("lora_" in k for k in plain)
    for k in plain:
        assert_close(shared[k], plain[k], rtol=1e-4, atol=1e-7)
    for k in ("loss/total", "loss/kl", "policy/entropy"):
        assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k
    assert m1["loss/kl"] > 1e-6, "a KL of 0 would make the reference's pass vacuous"
    assert max(float(g.abs().max()) for g in plain.values()) > 1e-3, "a vanishing gradient would make this vacuous"


def test_a_policy_with_dropout_runs_the_unshared_update_by_default_and_refuses_an_explicit_shared_prefix(tokenizer):
    """Under dropout the rows of a prompt would share one dropout mask over it, which the unshared update does
    not: the default (null) resolves to the unshared update there and to the shared one elsewhere; an explicit true
    is a one-line error at build, which names the dropout and the way out."""
    pytest.importorskip("peft")
    import support

    from groupwise.registry import ConfigError

    policy = lora_policy(tokenizer, dropout=0.1)
    with pytest.raises(ConfigError, match=r"^optim.shared_prefix=true with a policy that drops out in "
                                          r"training \(.*lora_dropout.* \(p=0.1\)\).*optim.shared_prefix=null"):
        support.learner(policy, tokenizer, ["optim.shared_prefix=true"])
    assert support.learner(policy, tokenizer).settings.optim.shared_prefix is False  # the default: unshared here
    assert support.learner(policy, tokenizer, ["optim.shared_prefix=false"]).settings.optim.shared_prefix is False
    assert support.learner(lora_policy(tokenizer), tokenizer).settings.optim.shared_prefix is True  # no dropout


def test_planning_counts_a_prompt_once_and_keeps_its_rows_together(tokenizer):
    from groupwise.update import plan_micro_batches

    rows = grouped(tokenizer)  # prompts of 20, 9 and 31 tokens, 4 completions each, completions ≤ 8 tokens
    plain = plan_micro_batches(rows, 200)
    shared = plan_micro_batches(rows, 200, shared_prefix=True)
    assert len(plain) > len(shared)
    prompt = [tuple(s.prompt_ids.tolist()) for s in rows]
    for mb in shared:  # cost = prompts × widest prompt + rows × widest completion
        p = {prompt[i] for i in mb}
        cost = len(p) * max(len(x) for x in p) + len(mb) * max(rows[i].completion_ids.numel() for i in mb)
        assert cost <= 200 or len(mb) == 1
    split = [q for q in set(prompt) if sum(any(prompt[i] == q for i in mb) for mb in shared) > 1]
    assert len(split) <= len(shared) - 1  # only a prompt at a micro-batch boundary may be split
    assert sorted(i for mb in shared for i in mb) == list(range(len(rows)))
    assert [sorted(mb) for mb in plan_micro_batches(rows, 10**6, shared_prefix=True)] == [list(range(12))]


def test_shared_prefix_updates_are_micro_batch_invariant(tiny_model, tokenizer):
    rows = grouped(tokenizer)
    adv = [torch.full((s.length,), float(i % 4) - 1.5) for i, s in enumerate(rows)]
    base = ["optim.grad_clip=0", "optim.shared_prefix=true"]
    one, m1 = grads_after_step(tiny_model, tokenizer, rows, adv, [*base, "optim.micro_batch_tokens=100000"])
    many, m2 = grads_after_step(tiny_model, tokenizer, rows, adv, [*base, "optim.micro_batch_tokens=60"])
    assert m1["update/micro_batches"] == 1 and m2["update/micro_batches"] >= 3
    for k in one:
        assert_close(many[k], one[k], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("vocab", [False, True], ids=["sampled", "vocab"])
def test_stored_sample_logprobs_use_the_update_s_pass(tiny_model, tokenizer, vocab):
    """``Learner.logprobs`` (what replay, RLCSD, RREDCoT and DistIL read through ``Pipeline.policy_logprobs``)
    returns each row's plain teacher-forced log-probs in the order given, whatever the micro-batching, and with
    ``optim.shared_prefix`` runs each prompt once."""
    import support

    rows = grouped(tokenizer)
    packed = pack([s.prompt_ids for s in rows], [s.completion_ids for s in rows], tokenizer.pad_token_id)
    tiny_model.train()
    for shared, budget in ((False, 100000), (False, 60), (True, 60), (True, 100000)):
        learner = support.learner(tiny_model, tokenizer, [f"optim.shared_prefix={shared}",
                                                          f"optim.micro_batch_tokens={budget}"])
        ref = completion_logprobs(tiny_model.eval(), packed, learner.settings.temperature, with_vocab=vocab)
        ref = ref.vocab_logprobs if vocab else ref.logprobs
        tiny_model.train()
        seen: list[int] = []
        hook = tiny_model.get_input_embeddings().register_forward_hook(
            lambda m, i, o, seen=seen: seen.append(i[0].numel()))
        got = learner.logprobs(tiny_model, rows, vocab)
        hook.remove()
        assert tiny_model.training, "the model's mode is restored"
        assert len(got) == len(rows) and not got[0].requires_grad
        for k, s in enumerate(rows):
            assert got[k].shape == ref[k, :s.length].shape
            assert_close(got[k], ref[k, :s.length], rtol=0, atol=1e-5)
        if shared and budget == 100000:  # one micro-batch: the 3 prompts once (widest 31), then 12 completions
            assert seen == [3 * 31, len(rows) * max(s.length for s in rows)]
        if budget == 60:
            assert len(seen) >= (6 if shared else 3), "several micro-batches, so the order is really remapped"


def test_the_stored_logprobs_benchmark_runs(monkeypatch, capsys):
    """benchmarks/stored_logprobs.py on the lab recipe, one round of 2 x 2 rows, so it cannot rot silently; with
    ``optim.shared_prefix`` off the learner's pass is the plain one, bit for bit."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "stored_logprobs.py"
    spec = importlib.util.spec_from_file_location("stored_logprobs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(sys, "argv", ["stored_logprobs.py", "--recipe", "recipes/grpo_lab.yaml", "--rounds", "1",
                                      "--prompts", "2", "--group", "2", "optim.shared_prefix=false"])
    monkeypatch.chdir(path.parents[1])
    threads = torch.get_num_threads()
    try:
        mod.main()
    finally:
        torch.set_num_threads(threads)  # the benchmark's build sets 1 thread for the whole process
    out = capsys.readouterr().out
    assert "4 rows (2 prompts x 2)" in out and "max |diff| 0.0e+00" in out
