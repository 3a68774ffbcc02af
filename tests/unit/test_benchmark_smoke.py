"""benchmarks/vs_trl.py on tiny settings (2 steps per side), so the TRL comparison cannot rot silently."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vs_trl():
    spec = importlib.util.spec_from_file_location("vs_trl", ROOT / "benchmarks" / "vs_trl.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vs_trl"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("vs_trl", None)
    from groupwise.rewards import REWARDS

    REWARDS._entries.pop("bench_dense", None)  # registered in-process by the dense run; keep the registry clean


def test_quick_run_compares_identical_work(vs_trl, tmp_path, capsys):
    out = tmp_path / "result.json"
    result = vs_trl.main(["--quick", "--in-process", "--matmul-n", "128", "--workdir", str(tmp_path / "w"),
                          "--json", str(out)])
    o = result["options"]
    assert (o["steps"], o["prompts"], o["group"], o["max_tokens"]) == (2, 2, 4, 8)
    assert json.loads(out.read_text())["summary"]["sides"].keys() == {"trl", "groupwise"}
    runs = {r["side"]: r for r in result["runs"]}
    assert runs.keys() == {"trl", "groupwise"}
    assert result["warnings"] == []  # same problems and prompt tokens on both sides, step by step
    for r in runs.values():
        assert len(r["steps"]) == 2
        for s in r["steps"]:
            assert s["step_s"] > 0 and 0 < s["gen_s"] <= s["step_s"] and s["cpu_s"] > 0
            # random-init regime: EOS is unreachable, so every completion runs to the cap on both sides
            assert s["gen_tokens"] == o["prompts"] * o["group"] * o["max_tokens"]
            assert s["threads"] == 1
            assert 0 <= s["rows_trained"] <= s["rows"] == o["prompts"] * o["group"]
    assert runs["trl"]["steps"][0]["prompt_tokens"] == runs["groupwise"]["steps"][0]["prompt_tokens"] > 0
    s = result["summary"]
    assert s["ratio_step_s"] > 0 and s["ratio_cpu_s"] > 0
    assert result["peak_flops"]["wall"] > 0 and result["peak_flops"]["cpu"] > 0
    gw = s["sides"]["groupwise"]
    tokens = gw["prompt_tokens"] + gw["gen_tokens"]
    assert gw["flops_per_step"] == pytest.approx(8 * result["params"] * tokens)  # 2·N·Σ(P+T) + 6·N·Σ(P+T)
    text = capsys.readouterr().out
    assert "TRL/groupwise" in text and "groupwise split" in text


def test_a_side_runs_in_its_own_process(vs_trl, tmp_path):
    opts = vs_trl.Options(**{**vs_trl.QUICK, "steps": 1})
    info = vs_trl.make_model_dir(opts, tmp_path / "model")
    spec = {"model_dir": info["model_dir"], "steps": 1, "prompts": opts.prompts, "group": opts.group,
            "max_tokens": opts.max_tokens, "threads": 1, "lr": opts.lr, "seed": 0, "reward": "correctness",
            "workdir": str(tmp_path)}
    out = vs_trl.run_side("groupwise", spec, tmp_path, "gw")
    assert out["side"] == "groupwise" and len(out["steps"]) == 1 and out["maxrss_mb"] > 0
    assert out["steps"][0]["gen_tokens"] == opts.prompts * opts.group * opts.max_tokens


def test_regime_c_puts_the_same_system_prompt_on_both_sides(vs_trl, tmp_path):
    result = vs_trl.main(["--quick", "--in-process", "--matmul-n", "128", "--workdir", str(tmp_path / "w"),
                          "--prefix-tokens", "40", "--shared-prefix", "--sides", "groupwise,trl"])
    assert result["warnings"] == []  # the same problems and prompt token counts, step by step
    runs = {r["side"]: r for r in result["runs"]}
    plain = vs_trl.plan({"seed": 0, "prompts": 2, "steps": 1})[1][0]
    tok_chars = sum(len(p.prompt) + 1 for p in plain)  # the lab-tiny tokenizer is one token per character
    for side in ("trl", "groupwise"):
        # G = 4; system + "\n"
        assert runs[side]["steps"][0]["prompt_tokens"] == 4 * (tok_chars + len(plain) * (40 + 1))
    assert "40-token system prompt" in result["regime"] and "shared_prefix" in result["regime"]


def test_executed_flops_counts_torch_formulas_by_phase_and_head(vs_trl):
    import torch
    import torch.nn.functional as F

    counter = vs_trl.executed_flops(5000, {4, 6})
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    kv = torch.randn(1, 1, 4, 8, requires_grad=True)  # grouped-query: one KV head for two query heads
    with counter:
        torch.randn(3, 4) @ torch.randn(4, 5000)  # an LM head's GEMM: 2·3·4·5000
        counter.phase = "generation"
        F.linear(torch.randn(3, 4), torch.randn(6, 4), torch.randn(6))  # addmm, 2·3·4·6
        out = F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)  # CPU flash: QK and PV, 2·(2·2·4·4·8)
        counter.phase = "update"
        out.sum().backward()  # five GEMMs of 2·2·4·4·8 (scores again, dV, dP, dQ, dK)
    assert dict(counter.counts) == {"update": 120000 + 2560, "update_head": 120000, "generation": 144 + 1024}
    tiled = vs_trl.executed_flops(5000, {4, 6}, hidden=4)  # TRL's chunked log-probs: vocabulary tiles of 2500 rows
    head, h, g = torch.randn(5000, 4), torch.randn(3, 4), torch.randn(3, 2500)
    grad_head, grad_h = torch.zeros(5000, 4), torch.zeros(3, 4)
    with tiled:
        torch.mm(h, head[:2500].t(), out=torch.empty(3, 2500))  # forward tile: reads the head's storage, 2·3·4·2500
        grad_head[2500:].addmm_(g.t(), h)  # in place into the head's gradient: 2·2500·3·4
        grad_h.addmm_(g, head[2500:])  # the hidden states' gradient, reading the head: 2·3·2500·4
        torch.randn(3, 4) @ torch.randn(4, 2500)  # a 2500-wide GEMM of nothing with the head's storage: not the head
    assert dict(tiled.counts) == {"update": 4 * 60000, "update_head": 3 * 60000}
    small = vs_trl.executed_flops(108, set())  # a toy vocabulary cannot be told from row counts: no head split
    with small:
        torch.randn(3, 4) @ torch.randn(4, 108)
    assert dict(small.counts) == {"update": 2 * 3 * 4 * 108}


def test_count_flops_replays_each_side_and_splits_the_ratio(vs_trl, tmp_path, capsys):
    result = vs_trl.main(["--quick", "--in-process", "--matmul-n", "128", "--workdir", str(tmp_path / "w"),
                          "--count-flops", "--trl-micro-batch", "4"])
    assert result["warnings"] == []  # each counted run generated the timed run's tokens, step by step
    assert "micro-batches of 4 rows (gradient_accumulation_steps 2)" in result["regime"]
    for run in result["counted_runs"]:
        for step in run["steps"]:
            assert step["flops"]["generation"] > 0 and step["flops"]["update"] > 0
    s = result["summary"]
    ex = s["executed"]
    assert ex["work_ratio"] * ex["speed_ratio"] == pytest.approx(s["ratio_cpu_s"])
    assert ex["work_ratio"] == pytest.approx(ex["trl"]["total"] / ex["groupwise"]["total"])
    assert "executed work" in capsys.readouterr().out


def test_levers_quick_run_switches_each_lever_alone(vs_trl, tmp_path):
    spec = importlib.util.spec_from_file_location("levers", ROOT / "benchmarks" / "levers.py")
    levers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(levers)
    result = levers.main(["--quick", "--in-process", "--matmul-n", "128", "--levers", "skip_inert_rows,share_prefill",
                          "--workdir", str(tmp_path / "w")])
    assert list(result["summary"]) == ["trl", "all off", "+ skip_inert_rows", "+ share_prefill", "defaults", "all on"]
    runs = {r["side"]: r for r in result["runs"]}
    assert runs["all off"]["resolved"] == {"optim.skip_inert_rows": False, "rollout.generator.share_prefill": False,
                                           "rollout.generator.share_common_prefix": False,
                                           "rollout.generator.compact_below": 0.0, "optim.micro_batch_tokens": 8192,
                                           "rollout.generator.decode": "model", "optim.shared_prefix": False}
    on = runs["+ share_prefill"]["resolved"]
    assert on["rollout.generator.share_prefill"] is True and on["optim.skip_inert_rows"] is False
    assert runs["all on"]["decode_path"] == "fused" and runs["defaults"]["resolved"] == {}
    gen = {name: [s["gen_tokens"] for s in r["steps"]] for name, r in runs.items()}
    assert len({tuple(v) for v in gen.values()}) == 1  # full-length regime: the same work in every variant
    for row in result["summary"].values():
        assert row["step_s"] > 0 and row["trl_ratio"] > 0
    assert result["summary"]["all off"]["vs_all_off"] == 1.0
