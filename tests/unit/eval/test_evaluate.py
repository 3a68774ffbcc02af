"""``eval.forced_prefix``: prefilled after every eval prompt (greedy included), counted as completion tokens."""

import json
from pathlib import Path

import pytest
import torch

from groupwise.cli import main
from groupwise.config import load
from groupwise.eval.evaluate import evaluate
from groupwise.loop.setup import build
from groupwise.registry import ConfigError
from groupwise.standard.fake import FakeConfig, FakeGenerator
from groupwise.standard.lab import Lab, LabConfig

ROOT = Path(__file__).parents[3]
COMPLETION = "<think>1+1=2</think><answer>2</answer>"


@pytest.fixture(scope="module")
def mode_lab():
    return Lab(LabConfig(modes=True, test_size=4), seed=0)


class Recording(FakeGenerator):
    """The fake generator, keeping every request it was asked."""

    def __init__(self, tokenizer):
        super().__init__(FakeConfig(completions=(COMPLETION,)), tokenizer)
        self.requests = []

    def generate(self, requests, params, rng):
        self.requests += requests
        return super().generate(requests, params, rng)


def run(tokenizer, task, **kw):
    gen = Recording(tokenizer)
    encode = lambda p: torch.tensor(tokenizer.encode(p.prompt + "\n", add_special_tokens=False))  # noqa: E731
    metrics, records = evaluate(gen, tokenizer, task, list(task.test), encode, k=2, temperature=1.0, max_tokens=48,
                                **kw)
    return gen, metrics, records


def test_forced_prefix_starts_every_record_greedy_included(tokenizer, mode_lab):
    gen, metrics, records = run(tokenizer, mode_lab, forced_prefix="<LG>")
    lg = tokenizer.convert_tokens_to_ids("<LG>")
    assert len(records) == 4 * (2 + 1) and {r["greedy"] for r in records} == {True, False}
    assert all(r.prefix == (lg,) and r.max_tokens is None for r in gen.requests)
    assert all(r["text"] == "<LG>" + COMPLETION for r in records)
    # the prefix is a completion token, as in training: <LG> + the scripted tokens + EOS
    n = 1 + len(tokenizer.encode(COMPLETION, add_special_tokens=False)) + 1
    assert all(r["length"] == n for r in records) and metrics["eval/len_mean"] == n


def test_default_asks_the_generator_what_it_asked_before(tokenizer, mode_lab):
    gen, _, records = run(tokenizer, mode_lab)
    assert all(r.prefix == () and r.max_tokens is None for r in gen.requests)
    assert all(r["text"] == COMPLETION for r in records)
    _, _, explicit = run(tokenizer, mode_lab, forced_prefix="")
    assert json.dumps(explicit) == json.dumps(records)


@pytest.mark.parametrize("prefix, match", [
    ("é", r"eval.forced_prefix='é': its tokens decode to ''; use text the tokenizer keeps"),  # unknown: <pad>
    ("<eos>", r"eval.forced_prefix='<eos>': its tokens decode to ''"),
    ("<LG>" * 48, r"eval.forced_prefix='(<LG>)+': 48 tokens leave none of the eval's 48 completion tokens"),
])
def test_bad_forced_prefix_is_refused(tokenizer, mode_lab, prefix, match):
    with pytest.raises(ConfigError, match=match):
        run(tokenizer, mode_lab, forced_prefix=prefix)


def test_bad_forced_prefix_fails_at_build():
    with pytest.raises(ConfigError, match=r"eval.forced_prefix='<LG>ab': 3 tokens leave none of the eval's 3"):
        build(load(None, ["eval.forced_prefix=<LG>ab", "eval.max_completion_tokens=3", "model.warm_start=false"]))


def test_trainer_eval_records_start_with_the_forced_prefix(tmp_path):
    args = ["train", str(ROOT / "recipes" / "grpo_lab.yaml"), "trainer.steps=0", "trainer.threads=1",
            "trainer.progress=false", "trainer.sinks=[jsonl]", "model.warm_start=false", "eval.after=false",
            "eval.n_problems=3", "eval.k=2",
            "rollout.max_completion_tokens=8", "eval.forced_prefix=<LG>", f"out_dir={tmp_path}"]
    assert main(args) == 0
    records = [json.loads(x) for x in (tmp_path / "grpo_lab" / "eval" / "step_0.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 3 and all(r["text"].startswith("<LG>") for r in records)
