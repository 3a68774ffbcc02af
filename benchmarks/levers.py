#!/usr/bin/env python
"""Each of groupwise's speed levers switched on alone, against TRL, in one invocation (docs/benchmarks.md "Levers").

    PYTHONPATH=src python benchmarks/levers.py --warm-start            # regime B (the levers' realistic case)
    PYTHONPATH=src python benchmarks/levers.py --quick                 # seconds; what the smoke test runs
    PYTHONPATH=src python benchmarks/levers.py --warm-start --levers skip_inert_rows,fused_decode

Every option of ``benchmarks/vs_trl.py`` (regime, sizes, threads, repeats) means the same here. One repeat runs
TRL once, then groupwise once per variant: ``all off`` (every lever below off), each lever alone on top of it,
``defaults`` (groupwise as shipped) and ``all on``; the order reverses on odd repeats against drifting load. Each
run is its own subprocess (``--in-process``: not; for the smoke test), timed exactly as in vs_trl.py (medians over
steps 2..N, then over repeats). Each groupwise run records the values its overrides resolved to.

The levers, and the setting that turns each off (``all off`` sets all of them):
  skip_inert_rows   optim.skip_inert_rows=false: zero-advantage rows go through the forward and backward
  share_prefill     rollout.generator.share_prefill=false: every row prefills its own copy of the prompt
  common_prefix     rollout.generator.share_common_prefix=false: the prefix all prompts share runs with each prompt
  compaction        rollout.generator.compact_below=0: finished rows stay in the KV cache and keep decoding
  micro_batches     on = optim.micro_batch_tokens=1024 (off = the default 8192: one micro-batch at these sizes)
  fused_decode      rollout.generator.decode=model: the model's own forward per decode step (on = fused)
  shared_prefix     optim.shared_prefix=false: each row's prompt runs in the update (on by default since 2026-12-06)
None of them changes what is computed: the tests pin each one's samples or gradient to its off setting
(tests/unit/rollout/test_hf.py, test_fused_decode.py, tests/unit/update/test_update.py, test_shared_prefix.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl  # noqa: E402

# lever -> (its setting when off, its setting when on); "defaults" ships all on but micro_batches
LEVERS = {
    "skip_inert_rows": ("optim.skip_inert_rows=false", "optim.skip_inert_rows=true"),
    "share_prefill": ("rollout.generator.share_prefill=false", "rollout.generator.share_prefill=true"),
    "common_prefix": ("rollout.generator.share_common_prefix=false",
                      "rollout.generator.share_common_prefix=true"),
    "compaction": ("rollout.generator.compact_below=0", "rollout.generator.compact_below=0.75"),
    "micro_batches": ("optim.micro_batch_tokens=8192", "optim.micro_batch_tokens=1024"),
    "fused_decode": ("rollout.generator.decode=model", "rollout.generator.decode=fused"),
    "shared_prefix": ("optim.shared_prefix=false", "optim.shared_prefix=true"),
}


def variants(levers: list[str]) -> dict[str, list[str]]:
    """Variant name -> its groupwise overrides."""
    off = [LEVERS[k][0] for k in LEVERS]
    out = {"all off": off}
    for k in levers:
        out[f"+ {k}"] = [LEVERS[j][1] if j == k else LEVERS[j][0] for j in LEVERS]
    out["defaults"] = []
    out["all on"] = [on for _, on in LEVERS.values()]
    return out


def run(opts: vs_trl.Options, levers: list[str], log=print, isolate: bool = True) -> dict:
    vs_trl._use_src()
    workdir = Path(opts.workdir) if opts.workdir else Path(tempfile.mkdtemp(prefix="levers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    info = vs_trl.make_model_dir(opts, workdir / "model")
    spec = {"model_dir": info["model_dir"], "task": info.get("task", vs_trl.TASK), "steps": opts.steps,
            "prompts": opts.prompts, "group": opts.group,
            "max_tokens": opts.max_tokens, "threads": opts.threads, "lr": opts.lr, "seed": opts.seed,
            "reward": opts.reward_kind, "workdir": str(workdir), "prefix_tokens": opts.prefix_tokens,
            "optim": info.get("optim", {})}  # regime real: the recipe's optim (vs_trl.group_optim), then the levers
    arms = {"trl": None, **variants(levers)}
    probes = [vs_trl.matmul_peak(opts.matmul_n, opts.threads)]
    runs: list[dict] = []
    for r in range(opts.repeats):
        for k, (name, gw) in enumerate(arms.items() if r % 2 == 0 else reversed(arms.items())):
            log(f"[repeat {r + 1}/{opts.repeats}] {name} ...")
            side = "trl" if gw is None else "groupwise"
            run_spec = {**spec, "gw": gw or []}
            out = vs_trl.run_side(side, run_spec, workdir, f"{r}-{k}") if isolate else vs_trl.run_here(side, run_spec)
            out.update(repeat=r, side=name, overrides=gw or [])
            runs.append(out)
        probes.append(vs_trl.matmul_peak(opts.matmul_n, opts.threads))
    peak = {x: max(p[x] for p in probes) for x in ("wall", "cpu")}
    agg = vs_trl.summarize(runs, info["params"], peak)  # per variant: medians over steps 2..N, then over repeats
    per_run, summary = agg["per_run"], agg["sides"]
    trl = [x["step_s"] for x in per_run if x["side"] == "trl"]
    for name, row in summary.items():
        row["trl_ratio"] = summary["trl"]["step_s"] / row["step_s"]
        row["trl_ratio_per_repeat"] = [a / x["step_s"] for a, x in zip(trl, (y for y in per_run if y["side"] == name))]
    base = summary["all off"]["step_s"]
    for row in summary.values():
        row["vs_all_off"] = base / row["step_s"]
    paths = sorted({x.get("decode_path", "") for x in runs if "rollout.generator.decode=fused" in x["overrides"]})
    return {"options": vars(opts) | {"sides": list(opts.sides)}, "regime": info["regime"], "params": info["params"],
            "peak_flops": peak, "peak_probes": [p["wall"] for p in probes], "levers": {k: LEVERS[k] for k in levers},
            "variants": arms, "runs": runs, "summary": summary, "fused_paths": paths}


def table(result: dict) -> str:
    o, pk = result["options"], result["peak_flops"]
    lines = [f"groupwise levers vs TRL GRPOTrainer | {o['preset']} ({result['params'] / 1e6:.2f}M params) | "
             f"{result['regime']}",
             f"work/step: {o['prompts']} prompts x G={o['group']}, cap {o['max_tokens']} | {o['threads']} thread(s) | "
             f"{o['steps']} steps x {o['repeats']} run(s) per variant | matmul peak {pk['wall'] / 1e9:.1f} GFLOP/s",
             "",
             f"{'variant':<18} {'s/step':>7} {'range':>11} {'gen s':>6} {'update s':>8} {'gen tok':>7} {'rows':>5} "
             f"{'TRL/variant':>11} {'per repeat':>12} {'vs all off':>10}"]
    for name, a in result["summary"].items():
        rng = "{:.2f}-{:.2f}".format(*a["step_s_range"])
        upd = f"{a['update_s']:>8.2f}" if "update_s" in a else f"{'':>8}"
        per = ",".join(f"{x:.2f}" for x in a["trl_ratio_per_repeat"])
        lines.append(f"{name:<18} {a['step_s']:>7.2f} {rng:>11} {a['gen_s']:>6.2f} {upd} {a['gen_tokens']:>7.0f} "
                     f"{a['rows_trained']:>5.1f} {a['trl_ratio']:>10.2f}x {per:>12} {a['vs_all_off']:>9.2f}x")
    if result["fused_paths"]:
        lines.append(f"decode path of the fused_decode runs: {', '.join(result['fused_paths'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--levers", default=",".join(LEVERS), help=f"comma-separated subset of {','.join(LEVERS)}")
    p.add_argument("-h", "--help", action="store_true")
    own, rest = p.parse_known_args(argv)
    if own.help:
        print(__doc__)
        return {}
    levers = [x.strip() for x in own.levers.split(",") if x.strip()]
    if bad := [x for x in levers if x not in LEVERS]:
        raise SystemExit(f"--levers: unknown {', '.join(bad)}; choose from {', '.join(LEVERS)}")
    opts, json_out, isolate = vs_trl.parse(rest)
    result = run(opts, levers, log=lambda m: print(m, file=sys.stderr, flush=True), isolate=isolate)
    print(table(result))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
