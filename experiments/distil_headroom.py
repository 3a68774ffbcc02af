"""DistIL against GRPO on the headroom lab (issue 30): is DistIL's pass@8 above GRPO's where pass@8 is not at 1?

Written before any DistIL run on this setting. Claim (arXiv:2606.05152, qualitative): DistIL improves over RLVR with
better Pass@N (forward CE is mode-covering and keeps diversity). On the demo lab pass@8 was 1.000 for every arm, so
the claim could not be tested (docs/results.md, DistIL). Acceptance (the spec's §12, restricted to the GRPO
comparison): DistIL pass@8 >= GRPO pass@8 and DistIL pass@1 (Mean@8) >= GRPO - 0.01, over 3 seeds; reported with
the spread, and as a clear difference only if the seed ranges do not overlap.

Setting: recipes/distil_headroom_lab.yaml = recipes/headroom_lab.yaml plus DistIL's teacher, transform, credit and
loss (as recipes/distil_lab.yaml): the same task, warm start, 16 prompts x 8 samples, 128 tokens, lr 1e-4, 80 steps
(equal samples for both arms), eval every 40 steps on 132 held-out problems with k = 8. Arms: ``grpo`` (the
``headroom_lab`` GRPO runs, reused key by key when their resolved config equals this arm's) and ``distil``. Seeds 0,
1, 2. No other arm (reverse-KL, c_seq = 0) fits the remaining time.

Expectation (stated before running, weakly held): on the demo DistIL was slower than GRPO early (0.808 vs 0.845 at
step 50, 0.933 vs 0.965 at 150) and cost ~2.5x GRPO's step time; here the teacher has dense per-token signal on the
long chains where GRPO rarely samples a correct answer, which could favour DistIL on hard difficulties and on
pass@8. No direction is predicted with confidence; whatever comes out is reported.

The warm start was replaced before any DistIL run (lab-tiny, SFT lr 1e-3, 1200 steps; docs/results.md "The
headroom lab"): the first one's sums were right in 77% of steps, the second's in 99.8%. On it GRPO goes 0.137 ->
0.938 mean@8 by step 40 (the slip gone by step 5-10), so DistIL can differ from GRPO mainly in the first ~10 steps
and in pass@8 before GRPO's reaches ~0.99; the teacher's forward KL is now 0.10 nats/token (was 0.68).

Usage: PYTHONPATH=src python experiments/distil_headroom.py --jobs 2 [--report-only]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from headroom_lab import by_difficulty  # noqa: E402

EXPERIMENT, RECIPE = "distil_headroom", "recipes/distil_headroom_lab.yaml"
COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]"]
ARMS = {"grpo": ["loss.terms=[ppo_clip]", "teacher=none", "rollout.transforms=[]", "credit=[]"], "distil": []}


def main() -> None:
    args = harness.cli_args(__doc__.splitlines()[0])
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    arms = {k: [*COMMON, *v] for k, v in ARMS.items()}
    for s in args.seeds if not args.steps else []:
        harness.reuse(harness.OUT / "headroom_lab" / f"grpo-s{s}", RECIPE, [*arms["grpo"], f"seed={s}"],
                      out_dir / f"grpo-s{s}")
    runs = harness.run_arms(EXPERIMENT, RECIPE, arms, args)
    rows = {}
    for arm, dirs in runs.items():
        cells = harness.eval_cells(dirs, ("mean_at_k", "pass_at_k", "greedy_acc", "len_mean"))
        cells["entropy(tail20)"] = harness.agg([harness.tail_mean(d, "policy/entropy") for d in dirs])
        cells["wall_s"] = harness.agg([harness.summary(d)["last"]["perf/wall_s_total"] for d in dirs])
        cells.update(harness.cost_cells(dirs))
        rows[arm] = cells
    cols = ["mean_at_k", "pass_at_k", "greedy_acc", "len_mean", "entropy(tail20)", "forwards/step", "s/step", "wall_s"]
    png = harness.plot_curves(runs, ["eval/mean_at_k", "eval/pass_at_k", "policy/entropy"], out_dir / "curves.png")
    lines = [f"# {EXPERIMENT}\n\n`{RECIPE}`, seeds {args.seeds}; 132 held-out problems, k = 8 (pass@1 = Mean@8, "
             "pass@8) and greedy. Warm start: " + harness.fmt(harness.warm_start_eval(runs)) + " Mean@8, "
             + harness.fmt(harness.warm_start_eval(runs, "eval/pass_at_k")) + " pass@8.\n\n", harness.table(rows, cols),
             "\nMean@8 along training:\n\n", harness.eval_curve(runs),
             "\npass@8 along training:\n\n", harness.eval_curve(runs, "eval/pass_at_k")]
    for arm, dirs in runs.items():
        lines += [f"\n{arm}: held-out Mean@8 by difficulty after training:\n\n",
                  by_difficulty(dirs, "after")]
    harness.write_report(out_dir, lines, [png])


if __name__ == "__main__":
    main()
