"""Any local Hugging Face causal LM goes through the same code path, and checkpoints load in plain transformers."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from groupwise.cli import main
from groupwise.config import load
from groupwise.loop.trainer import train
from groupwise.models.tiny import build_tokenizer


def qwen2(tok):
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))


def gpt2(tok):
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                      bos_token_id=tok.eos_token_id))


@pytest.mark.parametrize("make", [qwen2, gpt2], ids=["qwen2", "gpt2"])
def test_train_eval_and_reload_a_local_model_dir(make, tmp_path, capsys):
    tok = build_tokenizer()
    torch.manual_seed(0)
    model_dir = tmp_path / "model"
    make(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg = load("recipes/grpo_lab.yaml", [f"model.path={model_dir}", f"out_dir={tmp_path}", "trainer.steps=2",
                                         "trainer.progress=false", "trainer.sinks=[jsonl]",
                                         "rollout.prompts_per_step=2", "rollout.group_size=4",
                                         "rollout.max_completion_tokens=12", "eval.n_problems=4", "eval.k=2",
                                         "reward.terms=[{name: length_penalty, max_length: 12}]",
                                         # random models rarely emit EOS: stop strings make lengths (and rewards) vary
                                         "rollout.stop=[\"0\",\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]"])
    result = train(cfg)
    assert "eval/mean_at_k" in result["after"]
    ckpt = tmp_path / "grpo_lab" / "checkpoints" / "step_0000002" / "model"
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt)
    assert type(reloaded).__name__ == type(make(tok)).__name__
    initial = AutoModelForCausalLM.from_pretrained(model_dir)
    changed = any(not torch.equal(a, b) for a, b in zip(initial.state_dict().values(), reloaded.state_dict().values()))
    assert changed, "two GRPO steps with a length-varying reward must move the weights"
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "grpo_lab"), "eval.n_problems=3", "eval.k=2", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.0 <= metrics["eval/mean_at_k"] <= 1.0 and metrics["eval/len_mean"] > 0


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_eval_of_a_warm_started_run_evaluates_its_checkpoint_as_saved(lora, tmp_path, monkeypatch, capsys):
    # model.warm_start: true in the run's config must not be applied again to its checkpoint: a LoRA checkpoint was
    # refused ("a LoRA adapter"), a full one would have been fine-tuned on the traces before its eval
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    tok = build_tokenizer()
    torch.manual_seed(0)
    model_dir = tmp_path / "model"
    qwen2(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg = load("recipes/grpo_lab.yaml", [f"model.path={model_dir}", f"out_dir={tmp_path}", "trainer.steps=1",
                                         "model.warm_start=true", "model.warm_start_steps=2",
                                         *(["model.lora={r: 4, alpha: 8}"] if lora else []),
                                         "trainer.progress=false", "trainer.sinks=[jsonl]",
                                         "rollout.prompts_per_step=2", "rollout.group_size=2",
                                         "rollout.max_completion_tokens=8", "eval.n_problems=2", "eval.k=1"])
    train(cfg)
    from groupwise.models import warm_start

    def no_warm_start(*a, **k):
        raise AssertionError("eval built a warm start on the checkpoint")

    monkeypatch.setattr(warm_start, "ensure_warm_start", no_warm_start)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "grpo_lab"), "eval.n_problems=2", "eval.k=1", "--json"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["eval/mean_at_k"] <= 1.0
