"""``torchrun --nproc_per_node 2`` (gloo, CPU): one run split over two processes. Rank 0 alone writes the run,
every step covers the whole batch, the ranks' weights stay bit-identical (checked at every checkpoint save:
a fork stops the run), and a multi-process run resumes from its checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
ARGS = ["trainer.save_every=1", "trainer.threads=1", "trainer.progress=false", "trainer.sinks=[jsonl]",
        "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_completion_tokens=24",
        "model.warm_start_steps=40", "eval.before=false", "eval.n_problems=4", "eval.k=2", "task.p_wrap_slip=0.5",
        "reward.terms=[{name: length_penalty, max_length: 24}]"]  # lengths vary, so every step trains


def torchrun(out, *args, env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "groupwise.cli", "train", str(ROOT / "recipes" / "grpo_lab.yaml"), *ARGS, f"out_dir={out}", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_two_processes_train_one_run_and_resume(tmp_path):
    env = {**os.environ, "GROUPWISE_CACHE": str(tmp_path / "cache"), "PYTHONHASHSEED": "0",
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    first = torchrun(tmp_path, "trainer.steps=2", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = torchrun(tmp_path, "trainer.steps=4", "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run = tmp_path / "grpo_lab"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_s" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4], "one line per step: only rank 0 logs"
    assert all(r["rollout/samples"] == 16 and r["rollout/groups"] == 4 for r in steps), "each step is the whole batch"
    assert sum(r["update/loss_tokens"] > 0 and r["update/grad_norm"] > 0 for r in steps) >= 2
    assert (run / "checkpoints" / "step_0000004" / "model" / "model.safetensors").exists()
    assert "resuming from step_0000002" in resumed.stdout + resumed.stderr
    kinds = [g["kind"] for x in (run / "rollouts.jsonl").read_text().splitlines() for g in json.loads(x)["groups"]]
    assert kinds and "dropped" not in kinds, "no transform ran, so no sample was dropped (gathered groups match)"
    assert json.loads((run / "summary.json").read_text())["after"]["eval/mean_at_k"] >= 0.0


def test_fsdp_trains_the_same_run_and_resumes(tmp_path):
    """``trainer.data_parallel=fsdp``: the same 2 steps as a replicated 2-process run (the same samples and
    rewards; weights equal to the update's summation-order tolerance), with the KL reference model, and a
    sharded run resumes from its gathered checkpoint."""
    env = {**os.environ, "GROUPWISE_CACHE": str(tmp_path / "cache"), "PYTHONHASHSEED": "0",
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    kl = ["loss.terms=[{name: ppo_clip}, {name: kl, weight: 0.05}]"]
    runs = {}
    for mode in ("replicate", "fsdp"):
        out = tmp_path / mode
        done = torchrun(out, "trainer.steps=2", f"trainer.data_parallel={mode}", *kl, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[mode] = out / "grpo_lab"
    resumed = torchrun(tmp_path / "fsdp", "trainer.steps=3", "trainer.data_parallel=fsdp", *kl, "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step_0000002" in resumed.stdout + resumed.stderr

    from safetensors.torch import load_file

    def metrics(run):
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "perf/step_s" in x]

    rep, sh = metrics(runs["replicate"]), metrics(runs["fsdp"])
    assert [r["step"] for r in sh] == [1, 2, 3]
    for a, b in zip(rep, sh[:2]):
        assert a["reward/mean"] == b["reward/mean"] and a["update/loss_tokens"] == b["update/loss_tokens"]
        assert abs(a["loss/kl"] - b["loss/kl"]) <= 1e-6 + 1e-4 * abs(a["loss/kl"])
    w = [load_file(runs[m] / "checkpoints" / "step_0000002" / "model" / "model.safetensors") for m in runs]
    assert w[0].keys() == w[1].keys()
    for k in w[0]:
        assert float((w[0][k] - w[1][k]).abs().max()) <= 1e-5 + 1e-4 * float(w[0][k].abs().max()), k
