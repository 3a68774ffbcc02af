"""FSDP on GPUs (NCCL): the CPU tests' claims (tests/unit/update/test_fsdp.py, tests/e2e/test_distributed.py) on
two CUDA devices. Marked ``gpu`` and skipped without two devices: no machine that has run this suite has them,
so these tests are ready but have never run (docs/scaling.md)."""

import json
import os

import pytest
import torch
from e2e.test_distributed import ROOT, torchrun

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]


def env(tmp_path):
    return {**os.environ, "GROUPWISE_CACHE": str(tmp_path / "cache"), "PYTHONHASHSEED": "0",
            "NVIDIA_TF32_OVERRIDE": "0",
            "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_fsdp_on_two_gpus_equals_replicated_and_resumes(tmp_path):
    from safetensors.torch import load_file

    runs = {}
    for mode in ("replicate", "fsdp"):
        done = torchrun(tmp_path / mode, "trainer.steps=2", f"trainer.data_parallel={mode}", "model.device=cuda",
                        env=env(tmp_path))
        assert done.returncode == 0, done.stderr[-3000:]
        runs[mode] = tmp_path / mode / "grpo_lab"
    resumed = torchrun(tmp_path / "fsdp", "trainer.steps=3", "trainer.data_parallel=fsdp", "model.device=cuda",
                       "--resume", env=env(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = {m: [json.loads(x) for x in (r / "metrics.jsonl").read_text().splitlines() if "perf/step_s" in x]
            for m, r in runs.items()}
    assert rows["replicate"][0]["reward/mean"] == rows["fsdp"][0]["reward/mean"]  # step 1: the same weights sampled
    w = [load_file(r / "checkpoints" / "step_0000002" / "model" / "model.safetensors") for r in runs.values()]
    for k in w[0]:
        assert float((w[0][k] - w[1][k]).abs().max()) <= 1e-4 + 1e-3 * float(w[0][k].abs().max()), k


def test_fsdp_bfloat16_on_two_gpus_trains(tmp_path):
    done = torchrun(tmp_path, "trainer.steps=2", "trainer.data_parallel=fsdp", "model.device=cuda",
                    "model.dtype=bfloat16", env=env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "grpo_lab" / "metrics.jsonl").read_text().splitlines()
            if "perf/step_s" in x]
    assert len(rows) == 2 and all(r["update/grad_norm"] == r["update/grad_norm"] for r in rows)  # finite, not NaN
