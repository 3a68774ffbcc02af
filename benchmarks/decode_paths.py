"""Generation throughput of the ``hf`` generator's two decode paths, and the bound the GEMMs set (issue 12).

One invocation, one process, alternating: ``decode: model`` (the model's own forward and ``DynamicCache``) and
``decode: fused`` (standard/fused.py) generate the same requests (``--prompts`` x ``--group`` rows, EOS
unreachable so every row runs ``--max-tokens`` tokens), then a GEMM-only loop does exactly the decode's
matrix products (one [rows x E] @ [E x out] per fused projection, the LM head included) with nothing else, and a
2048^3 ``torch.mm`` probes the fp32 matmul peak. Reported per path: CPU seconds per generate call (median of
``--repeats``), tokens/s, nominal GFLOP/s (2 x params x tokens) and its share of the peak. The GEMM-only line is
the most any decode path of this model and row count could reach without changing the GEMMs themselves.

``--paths`` picks the generators, alternated in the order given: ``model``, ``fused``, ``bf16`` (``decode: fused``
with ``dtype: bf16``: the fused step's GEMMs and KV buffer in bfloat16), ``int8`` (``dtype: int8``: its GEMMs in
int8, fbgemm's dynamic linear) and ``multinomial`` (``decode: fused`` with
``sampler: multinomial``, the sampler before 2026-12-06, instead of ``race``); the last line gives the first path's
time over each other's. ``--mismatch`` then samples ``--prompts`` x ``--group`` rows with every path but ``model``
at temperature 1 with the model's real EOS, teacher-forces them in float32 (``forward.completion_logprobs``, the
trainer's pass) and prints per path mean / p99 / max |log p_sampler - log p_trainer| per token, the mean
importance weight exp(log p_trainer - log p_sampler), the share of tokens whose weight is over 3 and
``mismatch/kl`` (losses/mismatch.py). ``--prefill`` times the prefill alone (``forward.prefill`` of the requests,
the generator's first pass) in float32 and under ``torch.autocast`` to bfloat16, alternating.

``--recipe`` measures a recipe's model instead, as it trains (``recipes/smollm2_math.yaml``: SmolLM2-135M with
its LoRA adapter, folded into the fused weights; ``--set model.lora=null``: full fine-tuning), on its task's
first ``--prompts`` training problems as the recipe prompts them, ``--max-tokens`` defaulting to the recipe's
``rollout.max_completion_tokens``. A LoRA adapter's B is drawn at random (a trained adapter; peft starts it at 0).

    PYTHONPATH=src python benchmarks/decode_paths.py [--preset lab-small] [--prompts 8] [--group 8]
                                                     [--max-tokens 64] [--repeats 5] [--threads 1]
    PYTHONPATH=src python benchmarks/decode_paths.py --recipe recipes/smollm2_math.yaml [--set model.lora=null]
                                                     [--repeats 3] [--no-bound]
    PYTHONPATH=src python benchmarks/decode_paths.py --recipe recipes/smollm2_math.yaml --paths fused,bf16 \
                                                     --no-bound --mismatch [--prefill]
    PYTHONPATH=src python benchmarks/decode_paths.py --sampler-cost 49152       # the sampler alone, 64 rows
    PYTHONPATH=src python benchmarks/decode_paths.py --gemm-cost                # the decode's GEMMs alone, 64 rows
    PYTHONPATH=src python benchmarks/decode_paths.py --head-cost                # the LM head: one call / blocks

``--profile`` then runs one generate call of each path under torch's profiler and prints the ops with the most self
CPU time, each as a share of the call's.

``--gemm-cost`` times only the GEMMs of SmolLM2-135M's fused decode step, one shape at a time on ``--prompts`` x
``--group`` rows: float32, the ``int8`` path's, fp16 weights and weight-only int8, with each one's relative error.
``--head-cost`` times only SmolLM2-135M's LM head (576 -> 49,152, random weights) on ``--prompts`` x ``--group``
rows, as one ``F.linear`` call and as the fused decode computes it (``fused._head``, blocks of ``fused.HEAD_ROWS``
vocabulary rows), each call after the other GEMMs of a decode step (30 layers' fused q/k/v, o, gate/up and down,
random weights: ~0.5 GB, so the head's weight is not left in the caches by the previous call, as in a real decode);
alternating, the median of ``--repeats`` x 4 calls each, and whether the two products are bitwise equal.
``--sampler-cost VOCAB`` times only the draw of one decode step (``torch.multinomial`` against the ``race`` sampler,
``hf.sample_rows``) on ``--prompts`` x ``--group`` rows of a VOCAB-token softmax.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="lab-small", choices=["lab-small", "lab-tiny"])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-tokens", type=int, help="default 64, or the recipe's rollout.max_completion_tokens")
    p.add_argument("--recipe", help="a recipe's model and prompts instead of --preset on the lab task")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override (repeatable)")
    p.add_argument("--no-bound", action="store_true", help="skip the GEMM-only loop")
    p.add_argument("--paths", default="model,fused",
                   help="comma-separated: model, fused, bf16, int8, multinomial (default model,fused)")
    p.add_argument("--mismatch", action="store_true", help="sampler vs float32 trainer log-probs, per non-model path")
    p.add_argument("--prefill", action="store_true", help="time the prefill alone: float32 vs autocast bf16")
    p.add_argument("--profile", action="store_true", help="then one generate call per path under torch's profiler: "
                   "the ops with the most self CPU time")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gemm-cost", action="store_true", help="only time SmolLM2's decode GEMM shapes: fp32, int8, "
                   "fp16 weights, weight-only int8")
    p.add_argument("--head-cost", action="store_true", help="only time SmolLM2's LM head: one call against "
                   "fused._head's blocks, after a decode step's other GEMMs")
    p.add_argument("--sampler-cost", type=int, metavar="VOCAB", help="only time one decode step's draw: "
                   "torch.multinomial against hf.sample_rows over --prompts x --group rows of VOCAB tokens")
    a = p.parse_args()
    import torch

    if a.sampler_cost:
        sampler_cost(a.prompts * a.group, a.sampler_cost, a.repeats, a.threads)
        return
    if a.gemm_cost:
        gemm_cost(a.prompts * a.group, a.repeats, a.threads)
        return
    if a.head_cost:
        head_cost(a.prompts * a.group, a.repeats, a.threads)
        return

    from groupwise.adapters import base_model
    from groupwise.models.tiny import build_model, build_tokenizer
    from groupwise.rollout.base import Request, SamplingParams
    from groupwise.standard.hf import HFConfig, HFGenerator
    from groupwise.standard.lab import Lab, LabConfig

    torch.set_num_threads(a.threads)
    if a.recipe:
        from groupwise.config import load
        from groupwise.loop.setup import build

        pipe = build(load(a.recipe, [f"trainer.threads={a.threads}", *a.set]), train=False)
        model, tok, label = pipe.policy.eval(), pipe.tokenizer, f"{a.recipe} {' '.join(a.set)}".strip()
        a.max_tokens = a.max_tokens or pipe.cfg.rollout.max_completion_tokens
        with torch.no_grad():  # a trained adapter (peft starts B at 0, which folds to nothing)
            for n, q in model.named_parameters():
                if "lora_B" in n:
                    q.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(n)))
        reqs = [Request(pipe.encode(pipe.task.train[i])) for i in range(a.prompts) for _ in range(a.group)]
    else:
        tok = build_tokenizer()
        model, label = build_model(a.preset, tok).eval(), a.preset
        model.config.eos_token_id = None  # EOS unreachable: every row decodes max_tokens (vs_trl.py's regime A)
        lab = Lab(LabConfig(), seed=0)
        reqs = [Request(torch.tensor(tok.encode(lab.train[i].prompt + "\n", add_special_tokens=False)))
                for i in range(a.prompts) for _ in range(a.group)]
    a.max_tokens = a.max_tokens or 64
    params = SamplingParams(max_tokens=a.max_tokens, temperature=1.0)
    kinds = {"model": HFConfig(decode="model"), "fused": HFConfig(decode="fused"),
             "bf16": HFConfig(decode="fused", dtype="bf16"), "int8": HFConfig(decode="fused", dtype="int8"),
             "multinomial": HFConfig(decode="fused", sampler="multinomial")}
    gens = {d: HFGenerator(kinds[d], model, tok) for d in a.paths.split(",")}
    for g in gens.values():
        g.eos_ids = torch.tensor([], dtype=torch.long)
    rows = len(reqs)
    n_params = sum(q.numel() for n, q in model.named_parameters() if "lora_" not in n)  # what the fused GEMMs do
    times: dict[str, list[float]] = {k: [] for k in (*gens, "gemm only")}
    tokens = rows * a.max_tokens

    base = base_model(model)
    layers = base.model.layers
    mats = [w for layer in layers for w in (
        torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight]).t(),
        layer.self_attn.o_proj.weight.t(), torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]).t(),
        layer.mlp.down_proj.weight.t())] + [base.lm_head.weight.t()]
    mats = [m.contiguous() for m in mats]
    inputs = [torch.randn(rows, m.shape[0]) for m in mats]

    def gemms() -> None:
        for _ in range(a.max_tokens):
            for x, m in zip(inputs, mats):
                x @ m

    def peak() -> float:
        x = torch.randn(2048, 2048)
        x @ x
        t = time.process_time()
        for _ in range(3):
            x @ x
        return 3 * 2 * 2048 ** 3 / (time.process_time() - t)

    with torch.no_grad():
        for g in gens.values():  # warm-up
            g.generate(reqs, SamplingParams(max_tokens=min(8, a.max_tokens), temperature=1.0),
                       torch.Generator().manual_seed(0))
        peaks = [peak()]
        for r in range(a.repeats):
            for name, g in (gens.items() if r % 2 == 0 else reversed(gens.items())):
                t = time.process_time()
                out = g.generate(reqs, params, torch.Generator().manual_seed(r))
                times[name].append(time.process_time() - t)
                assert sum(len(o.completion_ids) for o in out) == tokens
            if not a.no_bound:
                t = time.process_time()
                gemms()
                times["gemm only"].append(time.process_time() - t)
            peaks.append(peak())
    best = max(peaks)
    print(f"{label} ({n_params / 1e6:.2f}M params), {rows} rows x {a.max_tokens} tokens, {a.threads} thread(s); "
          f"fp32 matmul peak {best / 1e9:.1f} GFLOP/s per CPU s (best of {len(peaks)} probes)")
    print(f"decode paths: {', '.join(f'{k}: {g.decode_path}' for k, g in gens.items())}")
    print(f"{'path':<10} {'CPU s':>7} {'range':>13} {'tok/s':>7} {'GFLOP/s':>8} {'%peak':>6}")
    for path, ts in times.items():
        if not ts:
            continue
        s = statistics.median(ts)
        print(f"{path:<10} {s:>7.3f} {min(ts):>6.3f}-{max(ts):<6.3f} {tokens / s:>7.0f} "
              f"{2 * n_params * tokens / s / 1e9:>8.1f} {100 * 2 * n_params * tokens / s / best:>5.1f}%")
    first, *others = gens
    for other in others:
        m, f = statistics.median(times[first]), statistics.median(times[other])
        print(f"{first}/{other}: {m / f:.2f}x "
              f"(per repeat: {', '.join(f'{x / y:.2f}' for x, y in zip(times[first], times[other]))})")
    if a.prefill:
        prefill_times(model, reqs, tok, a.repeats)
    if a.profile:
        for name, g in gens.items():
            profile(g, reqs, params, name)
    if a.mismatch:
        for name in (n for n in gens if n != "model"):
            mismatch(model, tok, HFGenerator(kinds[name], model, tok), reqs, a.max_tokens, name)


def alternating_ms(calls: dict, repeats: int, block: int) -> dict[str, float]:
    """Each callable's CPU ms per call: one warm-up call each, then ``repeats`` blocks of ``block`` calls, the order
    reversed every other repeat; the median over blocks."""
    for f in calls.values():
        f()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(repeats):
        for name, f in (calls.items() if r % 2 == 0 else reversed(calls.items())):
            t = time.process_time()
            for _ in range(block):
                f()
            times[name].append((time.process_time() - t) / block * 1000)
    return {name: statistics.median(v) for name, v in times.items()}


def sampler_cost(rows: int, vocab: int, repeats: int, threads: int) -> None:
    """CPU ms per draw of one token for each of ``rows`` rows over ``vocab`` tokens (a softmax of random logits):
    ``torch.multinomial`` (``sampler: multinomial``) against ``hf.sample_rows`` (``race``), median of ``repeats``
    blocks of 20 draws, alternating."""
    import torch

    from groupwise.standard.hf import sample_rows

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(rows, vocab, generator=g) * 3, -1)
    draws = {"multinomial": lambda: torch.multinomial(probs, 1, generator=g), "race": lambda: sample_rows(probs, g)}
    ms = alternating_ms(draws, repeats, 20)
    m, race = ms["multinomial"], ms["race"]
    print(f"{rows} rows x {vocab} tokens, {threads} thread(s): multinomial {m:.1f} ms, race {race:.1f} ms a draw "
          f"({m / race:.2f}x)")


def gemm_cost(rows: int, repeats: int, threads: int) -> None:
    """CPU ms per call of each GEMM shape of SmolLM2-135M's fused decode step on ``rows`` rows (random weights and
    inputs): float32 ``x @ w``, the int8 pack's ``quantized::linear_dynamic`` (``dtype: int8``), fp16 weights
    (``quantized::linear_dynamic_fp16``) and weight-only int8 (``torch._weight_int8pack_mm``); median of ``repeats``
    blocks of 10 calls, alternating; and each's relative output error against float32."""
    import functools
    import warnings

    import torch

    from groupwise.standard.fused import _pack, _qlinear

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    print(f"{rows} rows, {threads} thread(s): CPU ms per call (relative error against float32)")
    for name, k, n in [("q|k|v", 576, 960), ("o", 576, 576), ("gate|up", 576, 3072), ("down", 1536, 576),
                       ("lm head", 576, 49152)]:
        w, x = torch.randn(n, k, generator=g) * 0.02, torch.randn(rows, k, generator=g)
        wt, packed = w.t().contiguous(), _pack(w, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fp16 = torch.ops.quantized.linear_prepack_fp16(w, None)
        scale = w.abs().amax(1) / 127
        w8 = torch.round(w / scale[:, None]).to(torch.int8)
        calls = {"fp32": functools.partial(torch.matmul, x, wt), "int8": functools.partial(_qlinear, x, packed),
                 "fp16 weights": functools.partial(torch.ops.quantized.linear_dynamic_fp16, x, fp16),
                 "weight-only int8": functools.partial(torch._weight_int8pack_mm, x, w8, scale)}
        ref = calls["fp32"]()
        err = {c: float((f() - ref).norm() / ref.norm()) for c, f in calls.items()}
        ms = alternating_ms(calls, repeats, 10)
        print(f"{name:<8} {k}->{n}: " + ", ".join(f"{c} {v:.2f}" + (f" ({err[c]:.1e})" if c != "fp32" else "")
                                                  for c, v in ms.items()))


def head_cost(rows: int, repeats: int, threads: int) -> None:
    """CPU ms of SmolLM2-135M's LM head on ``rows`` rows: one ``F.linear`` against ``fused._head``, each call
    preceded by the rest of a decode step's GEMMs (module docstring)."""
    import torch

    from groupwise.standard import fused

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    F = torch.nn.functional
    rand = lambda *shape: torch.randn(*shape, generator=g) * 0.02  # noqa: E731
    layers = [(rand(576, 960), rand(576, 576), rand(576, 3072), rand(1536, 576)) for _ in range(30)]
    w, x = rand(49152, 576), torch.randn(rows, 576, generator=g)

    def body() -> torch.Tensor:
        h = x
        for qkv, o, gu, down in layers:
            h = h + (h @ qkv)[:, :576] @ o
            gate, up = (h @ gu).chunk(2, -1)
            h = h + (F.silu(gate) * up) @ down
        return h / h.norm(dim=-1, keepdim=True) * 24  # (an RMS-normed residual's scale)

    heads = {"one call": lambda h: F.linear(h, w), f"blocks of {fused.HEAD_ROWS}": lambda h: fused._head(h, w, None)}
    ms: dict[str, list[float]] = {name: [] for name in heads}
    for r in range(repeats * 4 + 2):
        for name, f in (heads.items() if r % 2 == 0 else reversed(heads.items())):
            h = body()
            t = time.process_time()
            f(h)
            if r >= 2:  # (two rounds of warm-up)
                ms[name].append((time.process_time() - t) * 1000)
    h = body()
    same = torch.equal(*(f(h) for f in heads.values()))
    (a, sa), (b, sb) = ((name, statistics.median(v)) for name, v in ms.items())
    print(f"LM head 576->49152, {rows} rows, {threads} thread(s), after a decode step's other GEMMs: {a} {sa:.1f} ms, "
          f"{b} {sb:.1f} ms a call ({sa / sb:.2f}x); bitwise equal: {same}")


def profile(gen, reqs, params, name: str, top: int = 12) -> None:
    """One generate call under ``torch.profiler`` (CPU): the ``top`` ops by self CPU time, each's share of the
    call's total (the profiler's own overhead included)."""
    import torch
    from torch.profiler import ProfilerActivity

    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        gen.generate(reqs, params, torch.Generator().manual_seed(0))
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops)
    print(f"profile {name} ({gen.decode_path}): " + ", ".join(
        f"{e.key} {100 * e.self_cpu_time_total / total:.1f}%" for e in ops[:top]))


def prefill_times(model, reqs, tok, repeats: int) -> None:
    """CPU seconds of the generator's prefill (``forward.prefill``: each distinct prompt once, the common prefix
    once) in float32 and under autocast to bfloat16, alternating."""
    import contextlib

    import torch

    from groupwise.models.forward import prefill

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ctx = {"float32": contextlib.nullcontext, "autocast bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}
    times: dict[str, list[float]] = {k: [] for k in ctx}
    with torch.no_grad():
        for r in range(repeats + 1):  # the first round is a warm-up
            for name in (ctx if r % 2 == 0 else reversed(ctx)):
                t = time.process_time()
                with ctx[name]():
                    prefill(model, [q.prompt_ids for q in reqs], pad, "cpu")
                if r:
                    times[name].append(time.process_time() - t)
    print("prefill alone: " + ", ".join(f"{k} {statistics.median(v):.3f} CPU s ({min(v):.3f}-{max(v):.3f})"
                                        for k, v in times.items()))


def mismatch(model, tok, gen, reqs, max_tokens: int, name: str) -> None:
    """Sample with ``gen`` (real EOS, temperature 1), teacher-force in float32 (the trainer's pass) and print the
    per-token |Δ log p| statistics, the importance weights and ``mismatch/kl``."""
    import torch

    from groupwise.losses.mismatch import mismatch as mismatch_metrics
    from groupwise.models.forward import completion_logprobs, pack
    from groupwise.rollout.base import SamplingParams

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.no_grad():
        out = gen.generate(reqs, SamplingParams(max_tokens=max_tokens, temperature=1.0),
                           torch.Generator().manual_seed(123))
        old, smp = [], []
        for i in range(0, len(reqs), 16):  # 16 rows per forward
            chunk = out[i:i + 16]
            packed = pack([r.prompt_ids for r in reqs[i:i + 16]], [o.completion_ids for o in chunk], pad)
            lp = completion_logprobs(model, packed, 1.0).logprobs
            for j, o in enumerate(chunk):
                old.append(lp[j, :len(o.completion_ids)].double())
                smp.append(o.rollout_logprobs.double())
    o, q = torch.cat(old), torch.cat(smp)
    d = (o - q).abs()
    w = torch.exp(o - q)
    m = mismatch_metrics(o[None], q[None], torch.ones_like(o, dtype=torch.bool)[None], "token_truncate", 3.0)
    print(f"mismatch {name} ({gen.decode_path}): {len(d)} tokens, {len(out)} rows; |Δ log p| mean {d.mean():.2e} "
          f"p99 {d.quantile(0.99):.2e} max {d.max():.2e}; IS weight mean {w.mean():.4f}, over 3: "
          f"{100 * float((w > 3).double().mean()):.3f}%; mismatch/kl {m.metrics['mismatch/kl'][0] / len(d):.2e}")


if __name__ == "__main__":
    main()
