"""The peers' objectives on the lab (issue 46): GSPO, CISPO, GMPO and MaxRL against GRPO, same budget, 3 seeds.

Written 2026-12-07 before any run. Each objective is pinned against its reference code in its unit test; this asks
what it does to learning on the reasoning lab. Setting: ``recipes/grpo_lab.yaml`` (3-step chains with wrap slips,
the demo's warm start, 16 prompts x 8, lr 1e-4, 48 tokens), the setting of each objective's own recipe
(``recipes/<name>_lab.yaml``), 80 steps, held-out eval every 20 steps (128 problems, k = 4, T = 1, greedy).

Arms:
  grpo       the recipe (one pass over each batch)
  grpo_2ep   ``optim.ppo_epochs=2``: the control of the three ratio objectives, which equal PPO-clip's gradient
             on-policy, so they differ from GRPO only on a second pass (their recipes take two)
  gspo       ``loss.terms=[gspo]``, the sequence-level ratio, GSPO's clip 3e-4 / 4e-4, per-sequence reduction, 2 passes
  cispo      ``loss.terms=[cispo]``, the detached clipped IS weight (cap 5), 2 passes
  gmpo       ``loss.terms=[gmpo]``, the geometric mean of the token ratios clipped at 0.4 in log space, 2 passes
  maxrl      ``advantage=maxrl``, (r - mean) / mean: a success weighs ~1/p (one pass, against GRPO)

Reading rule (before the runs): an arm is BETTER (WORSE) than its control when its final held-out mean@4 is above
(below) the control's of the same seed in all three seeds, else NO DIFFERENCE at this scale. Expected: the three
ratio objectives NO DIFFERENCE against grpo_2ep (their claims are about stability at scale: long sequences, MoE
routing, rare tokens), GSPO's clip cutting a large share of its second pass (on SmolLM2 it cut half); MaxRL NO
DIFFERENCE in mean@4 (the lab's 3-step chains are of one difficulty, so ~1/p has little to reweigh).

    PYTHONPATH=src python experiments/peer_objectives.py --jobs 1

Running table:
- DONE 2026-12-07 (all 18 runs, ~22 min on one core beside a real-model run): grpo_2ep BETTER than GRPO (+0.044);
  GSPO NO DIFFERENCE against grpo_2ep (its clip cut ~30% of the sequence terms); CISPO WORSE (-0.079, unstable),
  GMPO WORSE (-0.042), MaxRL WORSE in mean@4 (-0.035) with the best greedy: docs/results.md, "The peers'
  objectives on the lab".
- LEFT: the real model (the four are arms of experiments/real_lab.py, queued).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

EXPERIMENT = "peer_objectives"
RECIPE = "recipes/grpo_lab.yaml"
STEPS, EVAL_EVERY = 80, 20
COMMON = [f"trainer.steps={STEPS}", "trainer.save_every=0", f"eval.every={EVAL_EVERY}", "trainer.sinks=[jsonl]"]
TWO_PASSES = "optim.ppo_epochs=2"
ARMS = {
    "grpo": [],
    "grpo_2ep": [TWO_PASSES],
    "gspo": ["loss.terms=[gspo]", "loss.reduction=seq_mean_token_mean", TWO_PASSES],
    "cispo": ["loss.terms=[cispo]", TWO_PASSES],
    "gmpo": ["loss.terms=[gmpo]", "loss.reduction=seq_mean_token_mean", TWO_PASSES],
    "maxrl": ["advantage=maxrl"],
}
CONTROL = {"grpo_2ep": "grpo", "gspo": "grpo_2ep", "cispo": "grpo_2ep", "gmpo": "grpo_2ep", "maxrl": "grpo"}


def verdict(diffs: list[float]) -> str:
    """The reading rule over the per-seed differences from the control."""
    if len(diffs) >= 3 and all(d > 0 for d in diffs):
        return "BETTER"
    if len(diffs) >= 3 and all(d < 0 for d in diffs):
        return "WORSE"
    return "NO DIFFERENCE"


def main() -> None:
    args = harness.cli_args(__doc__.splitlines()[0])
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    arms = {k: [*v, *COMMON] for k, v in ARMS.items()}
    runs = harness.finished(harness.run_arms(EXPERIMENT, RECIPE, arms, args))
    keys = ("mean_at_k", "greedy_acc", "len_mean")
    rows = {arm: {k: harness.agg([harness.final_eval(d, f"eval/{k}") for d in dirs]) for k in keys}
            | {f"{m}(mean)": harness.agg([harness.tail_mean(d, f"loss/{m}", 10**9) for d in dirs])
               for m in ("clip_frac_low", "clip_frac_high")}
            | {"s/step": harness.agg([harness.tail_mean(d, "perf/step_s", 10**9) for d in dirs])}
            for arm, dirs in runs.items()}
    cols = [*keys, "clip_frac_low(mean)", "clip_frac_high(mean)", "s/step"]
    final = {arm: {harness.seed_of(d): harness.final_eval(d, "eval/mean_at_k") for d in dirs}
             for arm, dirs in runs.items()}
    lines = [f"# {EXPERIMENT}\n\n", f"Recipe `{RECIPE}`, {STEPS} steps, seeds {args.seeds}, held-out eval every "
             f"{EVAL_EVERY} steps (128 problems, k = 4, T = 1). Cells: mean ± sd [min, max] over seeds; clip "
             "fractions are the run's mean over steps.\n\n", harness.table(rows, cols),
             "\nFinal mean@4 minus the control's, same seed (the reading rule in the docstring):\n\n"
             "| arm | control | per seed | mean | verdict |\n|---|---|---|---|---|\n"]
    for arm, control in CONTROL.items():
        if arm in final and control in final:
            diffs = [v - final[control][s] for s, v in sorted(final[arm].items()) if s in final[control]]
            if diffs:
                lines.append(f"| {arm} | {control} | {', '.join(f'{d:+.3f}' for d in diffs)} | "
                             f"{statistics.fmean(diffs):+.3f} | {verdict(diffs)} |\n")
    lines += ["\nHeld-out mean@4 along training:\n\n", harness.eval_curve(runs)]
    plots = [harness.plot_curves(runs, ["eval/mean_at_k", "reward/correct_frac", "update/grad_norm"],
                                 out_dir / "curves.png")]
    harness.write_report(out_dir, lines, plots)


if __name__ == "__main__":
    main()
