"""Generation throughput of the ``hf`` generator's two decode paths, and the bound the GEMMs set (issue 12).

One invocation, one process, alternating: ``decode: model`` (the model's own forward and ``DynamicCache``) and
``decode: fused`` (rollout/fused.py) generate the same requests (``--prompts`` x ``--group`` rows, EOS
unreachable so every row runs ``--max-tokens`` tokens), then a GEMM-only loop does exactly the decode's
matrix products (one [rows x E] @ [E x out] per fused projection, the LM head included) with nothing else, and a
2048^3 ``torch.mm`` probes the fp32 matmul peak. Reported per path: CPU seconds per generate call (median of
``--repeats``), tokens/s, nominal GFLOP/s (2 x params x tokens) and its share of the peak. The GEMM-only line is
the most any decode path of this model and row count could reach without changing the GEMMs themselves.

``--recipe`` measures a recipe's model instead, as it trains (``recipes/smollm2_math.yaml``: SmolLM2-135M with
its LoRA adapter, folded into the fused weights; ``--set model.lora=null``: full fine-tuning), on its task's
first ``--prompts`` training problems as the recipe prompts them, ``--max-tokens`` defaulting to the recipe's
``rollout.max_completion_tokens``. A LoRA adapter's B is drawn at random (a trained adapter; peft starts it at 0).

    PYTHONPATH=src python benchmarks/decode_paths.py [--preset lab-small] [--prompts 8] [--group 8]
                                                     [--max-tokens 64] [--repeats 5] [--threads 1]
    PYTHONPATH=src python benchmarks/decode_paths.py --recipe recipes/smollm2_math.yaml [--set model.lora=null]
                                                     [--repeats 3] [--no-bound]
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
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    import torch

    from groupwise.models import base_model
    from groupwise.models.tiny import build_model, build_tokenizer
    from groupwise.rollout.base import Request, SamplingParams
    from groupwise.rollout.hf import HFConfig, HFGenerator
    from groupwise.tasks.lab import Lab, LabConfig

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
    gens = {d: HFGenerator(HFConfig(decode=d), model, tok) for d in ("model", "fused")}
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
    m, f = statistics.median(times["model"]), statistics.median(times["fused"])
    print(f"model/fused: {m / f:.2f}x "
          f"(per repeat: {', '.join(f'{x / y:.2f}' for x, y in zip(times['model'], times['fused']))})")


if __name__ == "__main__":
    main()
