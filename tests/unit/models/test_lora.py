"""LoRA through peft: a fresh adapter is the base model, only the adapter trains, the reference is the base with
no second copy, the adapter saves / reloads / resumes exactly, and the merged export equals the adapted model."""

import json
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from groupwise.cli import main
from groupwise.config import LoraConfig, load
from groupwise.loop.setup import build
from groupwise.loop.trainer import train
from groupwise.models import lora
from groupwise.models.export import export
from groupwise.models.forward import completion_logprobs, pack
from groupwise.models.load import load_pretrained, save_model
from groupwise.models.tiny import build_tokenizer
from groupwise.registry import ConfigError

pytest.importorskip("peft")


@pytest.fixture
def base_dir(tiny_qwen):
    return tiny_qwen()


def logprobs(model, tok):
    packed = pack([torch.tensor(tok.encode("1+2="))] * 2,
                  [torch.tensor(tok.encode("3;")), torch.tensor(tok.encode("4"))], tok.pad_token_id)
    return completion_logprobs(model, packed).logprobs


def perturb(model):  # an adapter that has trained: B != 0
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(n)))


def test_fresh_adapter_is_the_base_and_only_the_adapter_trains(base_dir):
    base, tok = load_pretrained(base_dir)
    ref = logprobs(base, tok)
    model = lora.wrap(base, LoraConfig(r=4))
    assert torch.equal(logprobs(model, tok), ref)  # B = 0
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # every linear layer but the head: 7 per Qwen2 layer (q k v o gate up down), A and B each
    assert len(trainable) == 2 * 7 * 2


def test_adapter_init_is_seeded_not_global():
    tok = build_tokenizer()
    def a_weights(seed):
        torch.manual_seed(seed + 100)  # the global RNG differs; the adapter must not care
        m = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2))
        torch.manual_seed(seed + 7)
        w = lora.wrap(m, LoraConfig(r=2), seed=seed)
        return [p.detach().clone() for n, p in w.named_parameters() if "lora_A" in n]
    assert all(torch.equal(x, y) for x, y in zip(a_weights(0), a_weights(0)))
    assert not torch.equal(a_weights(0)[0], a_weights(1)[0])


def test_base_view_is_the_initial_policy_and_leaves_the_adapter_alone(base_dir):
    base, tok = load_pretrained(base_dir)
    ref = logprobs(base, tok)
    model = lora.wrap(base, LoraConfig(r=4))
    perturb(model)
    model.train()
    view = lora.BaseView(model).eval().requires_grad_(False)
    assert not torch.allclose(logprobs(model, tok), ref)
    torch.testing.assert_close(logprobs(view, tok), ref, rtol=0, atol=1e-6)
    assert model.training, "the view ran in eval mode and restored the policy's mode"
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    assert not logprobs(view, tok).requires_grad
    assert next(view.parameters()).device == torch.device("cpu")
    assert sum(p.numel() for p in view.parameters()) == sum(p.numel() for p in model.parameters())  # shared, not copied


def test_adapter_saves_reloads_and_exports_merged(base_dir, tmp_path):
    base, tok = load_pretrained(base_dir)
    model = lora.wrap(base, LoraConfig(r=4, alpha=8.0))
    perturb(model)
    want = logprobs(model, tok)
    save_model(model, tok, tmp_path / "adapter")
    assert lora.is_adapter_dir(tmp_path / "adapter") and not (tmp_path / "adapter" / "config.json").exists()
    assert lora.base_path(tmp_path / "adapter") == base_dir

    reloaded, _ = load_pretrained(tmp_path / "adapter")  # alone: the base is named in adapter_config.json
    torch.testing.assert_close(logprobs(reloaded, tok), want, rtol=0, atol=1e-6)
    assert any(p.requires_grad for p in reloaded.parameters()), "a reloaded adapter keeps training"

    fresh = lora.wrap(load_pretrained(base_dir)[0], LoraConfig(r=4, alpha=8.0), seed=5)  # the resume path
    lora.load_weights(fresh, tmp_path / "adapter")
    torch.testing.assert_close(logprobs(fresh, tok), want, rtol=0, atol=1e-6)

    dirs = export(tmp_path / "adapter", tmp_path / "out")
    assert [d.name for d in dirs] == ["adapter", "merged"]
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "merged")  # no peft involved
    assert not lora.is_lora(plain)
    torch.testing.assert_close(logprobs(plain, tok), want, rtol=1e-5, atol=1e-5)


def test_export_of_a_full_model_is_a_copy(base_dir, tmp_path):
    assert export(base_dir, tmp_path / "out") == [tmp_path / "out" / "model"]
    plain, tok = load_pretrained(tmp_path / "out" / "model")
    torch.testing.assert_close(logprobs(plain, tok), logprobs(load_pretrained(base_dir)[0], tok), rtol=0, atol=0)


def test_bad_settings_are_one_line_errors(base_dir, tmp_path, monkeypatch):
    base, _ = load_pretrained(base_dir)
    with pytest.raises(ConfigError, match=r"model.lora.target_modules=\['attn_c'\].*allowed: .*q_proj.*all-linear"):
        lora.wrap(base, LoraConfig(target_modules=("attn_c",)))
    with pytest.raises(ConfigError, match="model.lora: r=0: allowed >= 1"):
        load(None, ["model.lora.r=0"])
    with pytest.raises(ConfigError, match="model.lora with embedded:lab-tiny and no warm start"):
        build(load(None, ["model.lora={}", "model.warm_start=false"]))
    (tmp_path / "orphan").mkdir()
    (tmp_path / "orphan" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen3"}))
    with pytest.raises(ConfigError, match=r"orphan/adapter_config.json: base_model_name_or_path='Qwen/Qwen3'"):
        load_pretrained(tmp_path / "orphan")
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ConfigError, match=r"pip install 'groupwise\[lora\]'"):
        lora.wrap(base, LoraConfig())


RUN = ["model.lora={r: 4}", "optim.lr=2e-3", "trainer.threads=1", "trainer.progress=false", "trainer.sinks=[jsonl]",
       "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_completion_tokens=24",
       "model.warm_start_steps=40", "eval.before=false", "eval.after=false", "task.p_wrap_slip=0.5",
       "reward.terms=[{name: length_penalty, max_length: 24}]", "loss.terms=[ppo_clip, {name: kl, weight: 0.05}]"]


def rows(run):
    out = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "time"} for r in out]


def test_lora_run_resumes_exactly_and_exports(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    train(load("recipes/grpo_lab.yaml", [*RUN, "trainer.steps=4", "trainer.save_every=2", f"out_dir={tmp_path}/a"]))
    train(load("recipes/grpo_lab.yaml", [*RUN, "trainer.steps=2", "trainer.save_every=2", f"out_dir={tmp_path}/b"]))
    train(load("recipes/grpo_lab.yaml", [*RUN, "trainer.steps=4", "trainer.save_every=2", f"out_dir={tmp_path}/b"]),
          resume=True)
    a, b = rows(tmp_path / "a" / "grpo_lab"), rows(tmp_path / "b" / "grpo_lab")
    assert [r["step"] for r in b] == [1, 2, 3, 4] and a == b
    assert a[0]["loss/kl"] == pytest.approx(0.0, abs=1e-7), "step 1: the policy is its base, so KL to it is 0"
    assert any(r["update/grad_norm"] > 0 for r in a)
    ckpt = tmp_path / "a" / "grpo_lab" / "checkpoints" / "step_0000004" / "model"
    assert lora.is_adapter_dir(ckpt) and not (ckpt / "model.safetensors").exists()

    capsys.readouterr()
    assert main(["export", str(tmp_path / "a" / "grpo_lab"), "--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr()
    assert out.out.split() == [str(tmp_path / "x" / "adapter"), str(tmp_path / "x" / "merged")]
    base = json.loads((tmp_path / "x" / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert out.err.strip() == (f"note: adapter/ loads its base from {base} (this machine's path); elsewhere, point "
                               "base_model_name_or_path in adapter/adapter_config.json at a copy of that model, "
                               "or use merged/, which needs no base")  # issue 31: it pointed into the cache silently
    adapted, tok = load_pretrained(ckpt)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "x" / "merged")
    torch.testing.assert_close(logprobs(merged, tok), logprobs(adapted, tok), rtol=1e-5, atol=1e-5)
