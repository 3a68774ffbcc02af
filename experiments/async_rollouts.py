"""Asynchronous rollouts at equal samples: does sampling step t from policy version t − K cost accuracy?

Setting: recipes/grpo_lab.yaml unchanged (80 steps x 16 prompts x 8 samples, 48 completion tokens, lr 1e-4,
the cached SFT warm start), so every arm trains on the same number of samples; the only difference is
``rollout.max_async_level`` K = 0 (the synchronous loop), 1 and 2 (loop/lag.py: step t sampled by version
max(0, t − K), PPO ratio against that version's log-probs). 3 seeds. One torch thread per run (with K > 0 the
update thread and the rollout thread each run single-threaded ops, so one run may use both cores).

Report: held-out mean@4 (T=1) and greedy accuracy after training, mean ± std [min, max] over seeds; the PPO
ratio's clip fraction (how far the lag moves the ratio) and the wall-clock per run.

Usage: PYTHONPATH=src nice -n 19 python experiments/async_rollouts.py --jobs 1 [--seeds 0 1 2] [--report-only]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

EXPERIMENT, RECIPE = "async_rollouts", "recipes/grpo_lab.yaml"
COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]"]
ARMS = {f"k{k}": [f"rollout.max_async_level={k}"] for k in (0, 1, 2)}
KEYS = ("mean_at_k", "greedy_acc", "format_frac")


def clip_frac(d: Path) -> float:
    rows = [r for r in harness.metrics(d) if "loss/clip_frac_low" in r]
    return statistics.fmean(r["loss/clip_frac_low"] + r["loss/clip_frac_high"] for r in rows)


def main() -> None:
    args = harness.cli_args(__doc__.splitlines()[0])
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    runs = harness.run_arms(EXPERIMENT, RECIPE, {k: [*COMMON, *v] for k, v in ARMS.items()}, args)
    rows = {"warm start (step 0)": {k: harness.agg([harness.summary(d)["before"][f"eval/{k}"] for d in runs["k0"]])
                                    for k in KEYS}}
    for arm, dirs in runs.items():
        rows[f"K={arm[1:]}"] = {**{k: harness.agg([harness.final_eval(d, f"eval/{k}") for d in dirs]) for k in KEYS},
                                "clip_frac": harness.agg([clip_frac(d) for d in dirs])}
    secs = {arm: statistics.fmean(harness.summary(d)["last"]["perf/wall_s_total"] for d in dirs)
            for arm, dirs in runs.items()}
    png = harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc", "reward/correct_frac"],
                              out_dir / "curves.png")
    text = (f"# {EXPERIMENT}\n\n`{RECIPE}`, seeds {args.seeds}, 128 held-out problems (mean@4 at T=1, greedy), "
            "equal samples per arm. Cells: mean ± std [min, max] over seeds.\n\n"
            + harness.table(rows, [*KEYS, "clip_frac"])
            + "\nRL wall-clock per run (one torch thread per thread, one run at a time, shared machine): "
            + ", ".join(f"K={arm[1:]} {v:.0f} s" for arm, v in secs.items()) + f"\n\n![curves]({png.name})\n")
    (out_dir / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
