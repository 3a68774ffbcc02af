"""The vLLM generator's parts that need no engine: the log-prob convention it picks, completions with forced
prefixes, the weights it pushes (a LoRA policy merged, tied weights named), and its load-time errors. The engine
itself is tested in the vLLM lane (tests/vllm_lane)."""

import math
import sys

import pytest
import torch

from groupwise.config import load
from groupwise.loop.setup import build
from groupwise.models import lora
from groupwise.registry import ConfigError
from groupwise.standard import vllm as gw_vllm


def test_logprob_mode_keeps_the_trainers_convention():
    assert gw_vllm.logprobs_mode(1.0, 0.7) == "processed_logprobs"  # log-softmax(logits / T), full vocabulary
    assert gw_vllm.logprobs_mode(0.9, 1.0) == "raw_logprobs"  # not renormalised over the nucleus
    with pytest.raises(ConfigError, match=r"rollout.top_p=0.9 with rollout.temperature=0.7.*allowed: top_p 1"):
        gw_vllm.logprobs_mode(0.9, 0.7)


def test_completion_puts_the_forced_prefix_first_with_no_behaviour_logprob():
    c = gw_vllm.to_completion((5, 6), [7, 1], [-0.25, -0.5], "stop")
    assert c.completion_ids.tolist() == [5, 6, 7, 1]
    assert c.forced.tolist() == [True, True, False, False]
    assert math.isnan(c.rollout_logprobs[0]) and math.isnan(c.rollout_logprobs[1])
    assert c.rollout_logprobs[2:].tolist() == [-0.25, -0.5] and c.finish_reason == "stop"
    assert gw_vllm.to_completion((), [3], [-1.0], "abort").finish_reason == "length"


def test_pushed_weights_name_the_tied_head_and_merge_a_lora_adapter(tmp_path):
    p = build(load("recipes/lora_lab.yaml", [f"out_dir={tmp_path}"]))
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for n, w in p.policy.named_parameters():
            if "lora_B" in n:
                w.add_(0.1 * torch.randn(w.shape, generator=g))
    before = {n: w.clone() for n, w in p.policy.named_parameters()}
    weights = gw_vllm.policy_weights(p.policy)
    assert "lm_head.weight" in weights and not any("lora_" in k or "base_layer" in k for k in weights)
    merged = p.policy.get_base_model().__class__(p.policy.get_base_model().config)
    merged.load_state_dict(weights)
    ids = torch.tensor([p.encode(p.task.test[0]).tolist()])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, p.policy(input_ids=ids).logits, atol=1e-5)
    assert all(torch.equal(w, before[n]) for n, w in p.policy.named_parameters())  # the policy is untouched
    merged.load_state_dict(gw_vllm.policy_weights(p.policy, merge=False))  # adapter-only sync: the base, once
    with torch.no_grad():
        assert torch.equal(merged(ids).logits, lora.BaseView(p.policy)(input_ids=ids).logits)


def test_weights_of_a_plain_policy_are_its_state_dict(tmp_path):
    p = build(load("recipes/grpo_lab.yaml", [f"out_dir={tmp_path}"]))
    weights = gw_vllm.policy_weights(p.policy)
    assert weights.keys() == p.policy.state_dict().keys()
    assert lora.is_lora(p.policy) is False


def test_bad_vllm_settings_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="rollout.generator.mode.*allowed: colocate, server"):
        load(None, ["rollout.generator=vllm", "rollout.generator.mode=remote"])
    with pytest.raises(ConfigError, match="lora_sync='delta'; allowed: adapter, merged"):
        load(None, ["rollout.generator=vllm", "rollout.generator.lora_sync=delta"])
    with pytest.raises(ConfigError, match="sleep: true is for mode colocate"):
        load(None, ["rollout.generator=vllm", "rollout.generator.mode=server", "rollout.generator.sleep=true"])
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="sleep: true needs a CUDA device"):
            load(None, ["rollout.generator=vllm", "rollout.generator.sleep=true"])  # at load: before any model
    with pytest.raises(ConfigError, match="top-p-renormalised"):
        load(None, ["rollout.generator=vllm", "rollout.top_p=0.9", "rollout.temperature=0.8"])
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'groupwise\[vllm\]'"):
        # (no warm start: the schema's default setting has none packaged, and building one took ~150 s of the suite)
        build(load(None, ["rollout.generator=vllm", "model.warm_start=false", f"out_dir={tmp_path}"]))
