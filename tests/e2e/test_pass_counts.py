"""The no-grad policy passes that components make over stored or hinted samples (``ctx.policy_logprobs``, run in
the update's micro-batches by ``Learner.logprobs``) are counted per step and stage: ``rollout/policy_forwards``
(group transforms) and ``replay/policy_forwards`` (the buffer). A spy counts the micro-batches of every call
independently (``plan_micro_batches``) and attributes each to the step and stage it ran in from the call stack;
the recorder's passes (``groupwise inspect``'s teacher gap) are in neither metric."""

import json
import sys
from pathlib import Path

import pytest

from groupwise.config import load
from groupwise.loop.trainer import train
from groupwise.update import Learner, plan_micro_batches

ROOT = Path(__file__).parents[2]
SMALL = ["trainer.steps=3", "trainer.save_every=0", "trainer.threads=1", "trainer.progress=false",
         "trainer.sinks=[jsonl]", "rollout.prompts_per_step=3", "rollout.group_size=4",
         "rollout.max_completion_tokens=24", "model.warm_start_steps=40", "eval.before=false", "eval.after=false",
         "optim.micro_batch_tokens=100", "name=g"]  # about two rows per micro-batch: passes != calls
STAGES = {"rollout_stage": "rollout", "prepare": "replay", "record": "record"}


def spied(monkeypatch) -> dict[tuple[str, int], int]:
    """Micro-batches of every ``Learner.logprobs`` call, by (stage, metrics row step), found on the call stack."""
    seen: dict[tuple[str, int], int] = {}
    inner = Learner.logprobs

    def logprobs(self, model, samples, vocab=False):
        frame = sys._getframe(1)
        while frame.f_code.co_name not in STAGES:
            frame = frame.f_back
        stage, local = STAGES[frame.f_code.co_name], frame.f_locals
        step = local["r"].step if stage == "replay" else local["step"]
        o = self.settings.optim
        key = (stage, step + 1)
        seen[key] = seen.get(key, 0) + len(plan_micro_batches(samples, o.micro_batch_tokens, o.shared_prefix))
        return inner(self, model, samples, vocab)

    monkeypatch.setattr(Learner, "logprobs", logprobs)
    return seen


def run(tmp_path, monkeypatch, recipe: str, *extra) -> tuple[list[dict], dict]:
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))
    seen = spied(monkeypatch)
    train(load(ROOT / "recipes" / recipe, [*SMALL, f"out_dir={tmp_path}", *extra]), overwrite=True)
    rows = [json.loads(x) for x in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "rollout/policy_forwards" in r], seen


@pytest.mark.parametrize("k", [0, 1])
def test_replay_passes_are_counted_per_step(tmp_path, monkeypatch, k):
    rows, seen = run(tmp_path, monkeypatch, "grpo_lab.yaml", "reward.terms=[{name: length_penalty, max_length: 24}]",
                     "replay={name: hdr, capacity: 64, replay_groups: 2, tau: .inf, ingress: all}",
                     f"rollout.max_async_level={k}")
    assert [r["replay/policy_forwards"] for r in rows] == [seen.get(("replay", r["step"]), 0) for r in rows]
    assert [r["rollout/policy_forwards"] for r in rows] == [0.0] * 3
    assert rows[0]["replay/policy_forwards"] == 0 and rows[-1]["replay/policy_forwards"] >= 2  # a scan from step 2


def test_transform_passes_are_counted_and_the_recorders_are_not(tmp_path, monkeypatch):
    rows, seen = run(tmp_path, monkeypatch, "distil_lab.yaml", "rollout.transforms=[{name: distil, chunk: 5}]")
    assert [r["rollout/policy_forwards"] for r in rows] == [seen[("rollout", r["step"])] for r in rows]
    assert all(r["rollout/policy_forwards"] > 3 for r in rows)  # 12 rows in 3 calls (chunks of 5), more passes
    assert all(seen.get(("record", r["step"]), 0) > 0 for r in rows)  # the recorder's teacher-gap passes ran
    assert [r["replay/policy_forwards"] for r in rows] == [0.0] * 3
