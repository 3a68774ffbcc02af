"""Asynchronous rollouts at equal samples: does sampling step t from policy version t − K cost accuracy?

Three settings (``--setting``), each with ``rollout.max_async_level`` K = 0 (the synchronous loop), 1 and 2
(loop/lag.py: step t sampled by version max(0, t − K), PPO ratio against that version's log-probs) as the only
difference between arms, so every arm trains on the same number of samples. 3 seeds. One torch thread per
stage (with K > 0 the update thread and the rollout thread each run single-threaded ops, so one run may use
both cores).

- ``lab`` (default): recipes/grpo_lab.yaml unchanged (lab-tiny, 80 steps x 16 prompts x 8 samples, 48
  completion tokens, lr 1e-4, the cached SFT warm start).
- ``lab-small``: the same recipe on ``embedded:lab-small`` (4.8M parameters; its own 400-step warm start,
  built once into the cache) at SFT lr 1e-3, everything else equal. At the recipe's SFT lr 2e-3 lab-small never
  learned the addition table (held-out mean@4 0.084, greedy 0.102 at the warm start, chance is 0.1; GRPO seed 0
  0.076 at step 40, so that run was stopped): the headroom lab's finding for lab-tiny on long chains
  (docs/results.md). At 1e-3 the teacher-forced probe (``experiments/headroom_lab.py --build``) put 0.97 of
  its mass on a right sum by SFT step 200 (0.15 at step 100), chosen before any RL run on it.
- ``smollm2``: recipes/smollm2_math.yaml (SmolLM2-135M-Instruct, LoRA) for 50 steps, K = 1 and 2 only: a
  100-step run there costs ~1 h on one thread, so the K = 0 arm is read from the committed GRPO experiment's
  runs (``experiments/smollm2.py``, ``experiments/out/smollm2``) at their step-50 eval. Both use a constant
  learning rate and the same seeds, so a 50-step run is those runs' first 50 steps (checked on the lab recipe:
  docs/scaling.md); the step-0 eval is theirs too (``eval.before=false`` here).

Expectation (written before the lab-small and smollm2 runs): as on lab-tiny, K = 1 and 2 end within K = 0's
seed spread, with the PPO ratio clipped on well under 1% of tokens at these learning rates.

Report: held-out accuracy after training (mean@k at T=1 and greedy), mean ± std [min, max] over seeds; the
PPO ratio's clip fraction (how far the lag moves the ratio) and the wall-clock per run.

Usage: PYTHONPATH=src nice -n 19 python experiments/async_rollouts.py --jobs 1 [--setting lab|lab-small|smollm2]
       [--seeds 0 1 2] [--report-only]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]"]
SETTINGS = {  # setting -> (recipe, overrides, lags run here)
    "lab": ("recipes/grpo_lab.yaml", [], (0, 1, 2)),
    "lab-small": ("recipes/grpo_lab.yaml", ["model.path=embedded:lab-small", "model.warm_start_lr=1e-3"], (0, 1, 2)),
    "smollm2": ("recipes/smollm2_math.yaml", ["trainer.steps=50", "eval.every=0", "eval.before=false"], (1, 2)),
}
SMOLLM2_K0, SMOLLM2_STEP = harness.OUT / "smollm2", 50  # the committed K = 0 runs, read at this step's eval
KEYS = ("mean_at_k", "greedy_acc", "format_frac")


def clip_frac(d: Path) -> float:
    rows = [r for r in harness.metrics(d) if "loss/clip_frac_low" in r]
    return statistics.fmean(r["loss/clip_frac_low"] + r["loss/clip_frac_high"] for r in rows)


def main() -> None:
    args = harness.cli_args(__doc__.splitlines()[0], lambda p: p.add_argument(
        "--setting", choices=list(SETTINGS), default="lab"))
    experiment = "async_rollouts" if args.setting == "lab" else f"async_rollouts_{args.setting}"
    recipe, extra, lags = SETTINGS[args.setting]
    out_dir = Path(args.out) if args.out else harness.OUT / experiment
    arms = {f"k{k}": [*COMMON, *extra, f"rollout.max_async_level={k}"] for k in lags}
    runs = harness.run_arms(experiment, recipe, arms, args)
    runs = harness.finished(runs)
    k0 = runs.get("k0") or [SMOLLM2_K0 / f"grpo_lora-s{s}" for s in args.seeds]
    at = lambda step: {k: harness.agg([harness.eval_at(d, step, f"eval/{k}") for d in k0]) for k in KEYS}  # noqa: E731
    rows = {"warm start (step 0)": at(0)}
    if "k0" not in runs:
        rows[f"K=0 (experiments/smollm2.py, step {SMOLLM2_STEP})"] = {**at(SMOLLM2_STEP),
                                                                      "clip_frac": harness.agg([0.0 for _ in k0])}
    for arm, dirs in runs.items():
        rows[f"K={arm[1:]}"] = {**harness.eval_cells(dirs, KEYS),
                                "clip_frac": harness.agg([clip_frac(d) for d in dirs])}
    secs = {arm: harness.agg([harness.summary(d)["last"]["perf/wall_s_total"] for d in dirs])
            for arm, dirs in runs.items()}
    per_seed = {} if "k0" in runs else {"K=0": [harness.eval_at(d, SMOLLM2_STEP) for d in k0]}
    per_seed |= {f"K={arm[1:]}": [harness.final_eval(d, "eval/mean_at_k") for d in dirs] for arm, dirs in runs.items()}
    png = harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc", "reward/correct_frac"],
                              out_dir / "curves.png")
    text = (f"# {experiment}\n\n`{recipe}` {' '.join(extra)}, seeds {args.seeds}, held-out mean@k at T=1 and "
            "greedy, equal samples per arm. Cells: mean ± std [min, max] over seeds.\n\n"
            + harness.table(rows, [*KEYS, "clip_frac"])
            + "\nRL wall-clock per run (one torch thread per stage): "
            + ", ".join(f"K={arm[1:]} {harness.fmt(v, 0)} s" for arm, v in secs.items())
            + "\n\nHeld-out mean@k per seed (" + ", ".join(map(str, args.seeds)) + "): "
            + "; ".join(f"{arm} " + " ".join(f"{v:.3f}" for v in vals) for arm, vals in per_seed.items())
            + f"\n\n![curves]({png.name})\n")
    (out_dir / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
