"""DASH drift shaping (arXiv:2607.00482): does segment-level credit at intermediate answer commitments, escalating
after a correct one, cut drift (a correct answer abandoned for a wrong one) without costing accuracy?

Paper claim: DASH beats GRPO (AIME25 50.8 vs 45.4) and adds +1.3 over Dr.GRPO on average, with about twice the
self-correction rate and fewer abandoned answers. Spec §6 acceptance (scaled): GRPO, Dr.GRPO, DASH on each; 500
steps, 3 seeds; pass if DASH cuts the drift rate by ≥ 30% relative to GRPO, keeps or raises the productive-fix
rate, accuracy ≥ GRPO, and the no-escalation ablation cuts drift less.

Setting, fixed before any DASH run (recipes/dash_drift_lab.yaml): the lab's default chains (2-4 additions /
subtractions mod 10) from a 1,500-step warm start (lr 1e-3) whose traces drift (p_drift 0.3: a correct
``so X.``, then ``wait``, a botched step and a wrong ``so Y.``); it adds reliably (greedy 1.00) and errs mainly by
drifting (Mean@8 0.70). No p_fix: wrong-then-fixed steps inside the chain (p_fix 0.1-0.2) left 400-600-step warm
starts unable to add (9-14% accuracy), so productive fixes can only emerge. Two earlier settings were dropped after
one-seed GRPO pilots that did not learn, both from 600- / 400-step warm starts at ~10-18% Mean@8: the default
chains (train correctness 0.15 -> 0.11 over 100 steps) and the demo's chains with wrap slips (0.11 -> 0.10).
Every arm runs the ``dash_drift`` transform, which marks commitments and counts drift (``drift_reward: 0`` in the
baseline arms, so their rewards and advantages are plain GRPO's / Dr.GRPO's). 16 prompts x 8 samples, 64 tokens,
lr 1e-4, 150 steps (cut from the spec's 500 to fit the end of the session; the curves show whether they flattened),
eval every 50 steps on 128 held-out problems with k = 8. Drift rate = share of train rollouts with a correct commitment
and a wrong final answer; fix rate = share with a wrong commitment and a correct final answer (both from the
transform; first 10 steps, steps 1-30 (the speed of removal: a GRPO pilot removed most drift within ~20 steps) and
the last 20).

Headroom setting (``--setting headroom``; issue 30; written 2026-12-05 before its warm start was built).
``recipes/dash_drift_headroom_lab.yaml``: the headroom lab's third setting (chains of 2-12 additions, the warm start
taught 2-6 only, 0-2 ``chk`` re-checks) with drift as the flaw (p_drift 0.3, no wrap slip, no privileged examples);
lab-tiny, 1200 SFT steps at lr 1e-3 (the second setting's, which learned the addition table by step ~350), built
with ``experiments/headroom_lab.py --recipe recipes/dash_drift_headroom_lab.yaml --build``. Arms grpo and dash
(the spec's main pair; Dr.GRPO and the ablation are left out for time), 80 steps x 16 x 8, 128 tokens, eval every
40 steps on 132 held-out problems (12 per k), mean@8; 3 seeds, one lane.
  - Check before the runs: the warm start's per-step sums right in >= 0.97 of sampled steps on k <= 6
    (``headroom_lab.py --step-check``); otherwise report and stop.
  - Expected at the warm start: k <= 6 right before the drift and drifting on ~30% of those, so ~0.65 mean@8 there,
    ~0.1 on k >= 7, ~0.35 overall; train drift rate ~0.15.
  - Expected: GRPO removes the drift on k <= 6 as on the first lab, but more slowly: the drift episode is ~8 tokens
    of a 30-80-token trace, so a sequence-level advantage spreads its credit thinner than on 29-token traces; DASH's
    segment credit lands on the drifting segment, so this is where it could remove drift faster. Bar (the spec's):
    drift over steps 1-30 >= 30% below GRPO's, final mean@8 >= GRPO's. k >= 7 at chance in both (nothing there to
    drift from). A tie, as on the first lab, is the other likely outcome.

    PYTHONPATH=src python experiments/dash_drift.py --jobs 2                   # grpo, dash
    PYTHONPATH=src python experiments/dash_drift.py --arms dr_grpo dash_dr no_escalation
    PYTHONPATH=src python experiments/dash_drift.py --setting headroom --jobs 1
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

SETTINGS = {"lab": ("dash_drift", "recipes/dash_drift_lab.yaml", 150),  # setting -> experiment, recipe, steps
            "headroom": ("dash_drift_headroom", "recipes/dash_drift_headroom_lab.yaml", 80)}
MARKS_ONLY = ["rollout.transforms=[{name: dash_drift, drift_reward: 0.0}]", "credit=[]"]
DR = ["advantage=dr_grpo", "loss.reduction=seq_sum_const"]  # as recipes/dr_grpo_lab.yaml
ARMS = {
    "grpo": MARKS_ONLY,
    "dash": [],
    "dr_grpo": [*MARKS_ONLY, *DR],
    "dash_dr": DR,
    "no_escalation": ["credit.0.eta=0.0"],
}


def main() -> None:
    def own(p):
        p.add_argument("--arms", nargs="+", default=["grpo", "dash"], choices=list(ARMS),
                       help="run / report only these")
        p.add_argument("--setting", choices=list(SETTINGS), default="lab")

    args = harness.cli_args(__doc__.splitlines()[0], own)
    experiment, recipe, steps = SETTINGS[args.setting]
    common = [f"trainer.steps={steps}", "trainer.save_every=0", "trainer.sinks=[jsonl]"]
    out_dir = Path(args.out) if args.out else harness.OUT / experiment
    runs = harness.run_arms(experiment, recipe, {k: [*common, *ARMS[k]] for k in args.arms}, args)
    rows = {}
    for arm, dirs in runs.items():
        cells = harness.eval_cells(dirs, ("mean_at_k", "greedy_acc", "len_mean"))
        for key, name in (("rollout/drift_frac", "drift"), ("rollout/fix_frac", "fix"),
                          ("rollout/tokens_after_correct", "tokens after correct")):
            cells[f"{name} (first 10)"] = harness.agg([harness.head_mean(d, key) for d in dirs])
            cells[f"{name} (steps 1-30)"] = harness.agg([harness.head_mean(d, key, 30) for d in dirs])
            cells[f"{name} (tail20)"] = harness.agg([harness.tail_mean(d, key) for d in dirs])
        cells["train_correct(tail20)"] = harness.agg([harness.tail_mean(d, "reward/correct_frac") for d in dirs])
        cells["train_correct(steps 1-30)"] = harness.agg([harness.head_mean(d, "reward/correct_frac", 30)
                                                          for d in dirs])
        cells["drift < 2% from step"] = harness.agg([harness.first_step_at(d, "rollout/drift_frac", 0.02, 5, below=True)
                                                     for d in dirs])
        cells.update(harness.cost_cells(dirs))
        rows[arm] = cells
    before = harness.warm_start_eval(runs)
    cols = ["mean_at_k", "greedy_acc", "len_mean", "train_correct(steps 1-30)", "train_correct(tail20)", "s/step"]
    behaviour = [f"{n} ({w})" for n in ("drift", "fix", "tokens after correct")
                 for w in ("first 10", "steps 1-30", "tail20")] + ["drift < 2% from step"]
    plots = [harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc"], out_dir / "eval_curves.png"),
             harness.plot_curves(runs, ["reward/correct_frac", "rollout/drift_frac", "rollout/fix_frac"],
                                 out_dir / "train_curves.png")]
    lines = [f"# {experiment}\n\n",
             f"Recipe `{recipe}`, {steps} steps, seeds {args.seeds}; held-out Mean@8 (k = 8, T = 1) and greedy on "
             f"the recipe's held-out problems; warm start Mean@8 {harness.fmt(before)}.\n\n", harness.table(rows, cols),
             "\nBehaviour on the train rollouts (share of rollouts; tokens after the first correct commitment; "
             "the first step whose trailing 5-step drift rate is under 2%):\n\n",
             harness.table(rows, behaviour), "\nHeld-out Mean@8 at every evaluation:\n\n", harness.eval_curve(runs)]
    harness.write_report(out_dir, lines, plots)


if __name__ == "__main__":
    main()
