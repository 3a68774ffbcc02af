"""``optim.autocast``: the update's model passes in bf16 (``torch.autocast``), weights, gradients and optimizer
state in fp32. ``none`` adds nothing to the passes (a ``nullcontext``; the fp32 update the other tests pin);
``bf16`` runs the matmuls in bf16 (checked, so that the closeness test cannot pass with autocast off) and its
gradient stays within 2e-2 (relative) of the fp32 one; the first epoch's PPO ratio is exactly 1 under it, and the
behaviour log-probs pass gives the update's own log-probs bit for bit."""

import contextlib

import pytest
import support
import torch
from test_update import grads_after_step, make_samples

from groupwise.config import load
from groupwise.registry import ConfigError
from groupwise.update import autocast


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([grads[k].reshape(-1) for k in sorted(grads)])


def test_none_adds_nothing(tiny_model):
    assert isinstance(autocast(tiny_model, "none"), contextlib.nullcontext)
    assert load(None, []).optim.autocast == "none"


def test_bf16_gradient_is_close_to_fp32_and_autocast_ran(tiny_model, tokenizer):
    samples = make_samples(tokenizer)
    adv = [torch.full((s.length,), float(i % 3) - 1.0) for i, s in enumerate(samples)]
    seen: list[torch.dtype] = []
    hook = tiny_model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    fp32, m1 = grads_after_step(tiny_model, tokenizer, samples, adv, ["optim.grad_clip=0"])
    assert set(seen) == {torch.float32}
    seen.clear()
    bf16, m2 = grads_after_step(tiny_model, tokenizer, samples, adv, ["optim.grad_clip=0", "optim.autocast=bf16"])
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}  # the policy's matmuls ran in bf16
    assert all(g.dtype == torch.float32 for g in bf16.values())  # fp32 gradients of the fp32 weights
    a, b = flat(fp32), flat(bf16)
    rel = float((b - a).norm() / a.norm())
    assert float(a.norm()) > 1e-3, "a vanishing gradient would make this vacuous"
    assert 1e-5 < rel < 2e-2, rel  # > 1e-5: bf16 rounding changed it (fp32 reorderings give ~1e-7)
    assert m2["loss/total"] == pytest.approx(m1["loss/total"], abs=1e-2)


def test_first_epoch_ratio_is_exactly_one_under_bf16(tiny_model, tokenizer):
    samples = make_samples(tokenizer)
    adv = [torch.ones(s.length) for s in samples]
    learner = support.learner(tiny_model, tokenizer, ["optim.autocast=bf16"])
    batch = support.rows(samples, adv)
    mb = learner.plan(batch)[2][0]
    inp = learner.inputs(batch, mb, {}, {}, 0)
    ratio = torch.exp(inp.logprobs.detach() - inp.old_logprobs)[inp.completion_mask]
    assert bool((ratio == 1.0).all())  # π_old is this pass's own detached log-probs: the same bf16 numerics
    fp32 = support.learner(tiny_model, tokenizer, []).inputs(batch, mb, {}, {}, 0)
    gap = (inp.logprobs - fp32.logprobs).detach().abs()[inp.completion_mask]
    assert 1e-5 < float(gap.mean()) < 5e-2  # bf16 moved the log-probs (autocast ran), by little
    learner.behaviour_logprobs(tiny_model, batch)  # π_old of an asynchronous run: the same pass, bit for bit
    for j, i in enumerate(mb):
        s = batch.samples[i]
        assert torch.equal(s.old_logprobs, inp.logprobs[j, :s.length].detach())


@pytest.mark.parametrize("overrides,match", [
    (["optim.autocast=fp16"], r"^override 'optim.autocast=fp16': optim.autocast: 'fp16' is not allowed; "
                              r"allowed: none, bf16$"),
    (["optim.autocast=bf16", "model.dtype=bfloat16"],
     r"^optim.autocast=bf16 with model.dtype=bfloat16: the weights are already 16-bit; allowed: model.dtype=float32$"),
    (["optim.autocast=bf16", "trainer.data_parallel=fsdp"],
     r"^optim.autocast=bf16 with trainer.data_parallel=fsdp: autocast under FSDP is not built; "),
])
def test_bad_autocast_config_is_one_line_at_load(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        load(None, overrides)
    assert "\n" not in str(e.value)
