"""RLCSD (arXiv:2606.11709): does contrasting a correct sibling's hint with wrong siblings' hints give a
self-distillation signal that keeps response length stable and accuracy at least GRPO's, where one-sided
self-distillation drifts?

Paper claim: one-sided on-policy self-distillation (RLSD, OPSD) picks up the style shift any hint induces, so
response length drifts; RLCSD's contrast cancels it, and beats GRPO. Spec §10 acceptance (scaled): GRPO, OPSD,
RLSD (one-sided: the same credit, hint against the plain prompt), RLCSD (the official constants,
recipes/rlcsd_lab.yaml); 500 steps, 3 seeds; pass if RLCSD's response length stays
within ±15% of its initial length and its accuracy ≥ GRPO's, while OPSD's length drifts.

Setting, fixed before any RLCSD run (recipes/rlcsd_lab.yaml), the spec's style drift on the DASH-OPSD chains
(three additions mod 10, wrapping steps off by one in 60% of warm-start traces): half the warm start's own
traces end their thinking with 1-3 filler words (well / ok / note / hmm) after the commitment, while the half of
its examples that show the problem with its clean trace in `<ref>` tags answer tersely; so any hint changes the
style the policy predicts, and a one-sided teacher signal is dominated by it. (Fillers between the steps were
tried first and dropped: the warm start then could not add, 9% accuracy, and GRPO did not move in 150 steps.)
OPSD's teacher is the frozen initial policy shown the clean reference (as in experiments/dash_opsd.py);
RLCSD's positive hint is a correct sibling, its negatives wrong siblings, in the same template. 16 prompts x 8
samples, 48 tokens, lr 1e-4 for every arm, 200 steps (cut from the spec's 500 to fit the session's two lanes
beside the other experiments; the curves show whether they flattened), eval every 50 steps on 128 held-out problems with
k = 8. The length criterion: mean train completion length of the last 10 steps against the first 10, and the largest
deviation of any 10-step window from the first 10 (the spec's "stays within").

    PYTHONPATH=src python experiments/rlcsd.py --jobs 2              # grpo, opsd, rlcsd
    PYTHONPATH=src python experiments/rlcsd.py --arms rlsd           # + the one-sided ablation
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

EXPERIMENT = "rlcsd"
RECIPE = "recipes/rlcsd_lab.yaml"
COMMON = ["trainer.steps=200", "trainer.save_every=0", "trainer.sinks=[jsonl]"]
PLAIN = ["rollout.transforms=[]", "credit=[]"]
ARMS = {
    "grpo": [*PLAIN],
    "opsd": [*PLAIN, "teacher={name: frozen, context: \"{prompt}\\n<ref>{reference}</ref>\"}",
             "loss.terms=[{name: opsd, beta: 0.0, token_clip: 0.05, support: vocab}]"],
    "rlcsd": [],
    "rlsd": ["rollout.transforms.0.negatives=none"],  # one-sided: the hint against the plain prompt
}


def length_drift(run: Path, n: int = 10) -> float:
    """Relative change of the mean train completion length: last n steps against the first n."""
    rows = [r["rollout/completion_len_mean"] for r in harness.metrics(run) if "rollout/completion_len_mean" in r]
    return statistics.fmean(rows[-n:]) / statistics.fmean(rows[:n]) - 1.0


def max_length_drift(run: Path, n: int = 10) -> float:
    """The spec's "stays within ±15%": the largest |mean length of a 10-step window / first 10 steps − 1|."""
    rows = [r["rollout/completion_len_mean"] for r in harness.metrics(run) if "rollout/completion_len_mean" in r]
    base = statistics.fmean(rows[:n])
    return max(abs(statistics.fmean(rows[i:i + n]) / base - 1.0) for i in range(0, len(rows) - n + 1))


def filler_share(run: Path, n: int = 10) -> tuple[float, float]:
    """Share of the recorded rollouts with a filler word, over the first and the last ``n`` recorded steps."""
    from groupwise.standard.lab import FILLERS

    steps = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines() if x.strip()]

    def share(rows):
        texts = [s["text"] for r in rows for g in r["groups"] for s in g["samples"]]
        return sum(any(f in t for f in FILLERS) for t in texts) / len(texts)

    return share(steps[:n]), share(steps[-n:])


def main() -> None:
    def own(p):
        p.add_argument("--arms", nargs="+", default=["grpo", "opsd", "rlcsd"], choices=list(ARMS),
                       help="run / report only these")

    args = harness.cli_args(__doc__.splitlines()[0], own)
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    arms = {k: [*COMMON, *ARMS[k]] for k in args.arms}
    runs = harness.run_arms(EXPERIMENT, RECIPE, arms, args)
    rows = {}
    for arm, dirs in runs.items():
        cells = harness.eval_cells(dirs, ("mean_at_k", "greedy_acc", "len_mean"))
        cells["train len drift"] = harness.agg([length_drift(d) for d in dirs])
        cells["max len drift"] = harness.agg([max_length_drift(d) for d in dirs])
        cells["train_correct(tail20)"] = harness.agg([harness.tail_mean(d, "reward/correct_frac") for d in dirs])
        if arm in ("rlcsd", "rlsd"):
            cells["targets"] = harness.agg([harness.tail_mean(d, "rollout/rlcsd_targets", 10**9) for d in dirs])
            cells["hint rows/step"] = harness.agg([harness.tail_mean(d, "rollout/rlcsd_teacher_rows", 10**9)
                                                   for d in dirs])
        fillers = [filler_share(d) for d in dirs]
        cells["fillers (first 10)"] = harness.agg([a for a, _ in fillers])
        cells["fillers (last 10)"] = harness.agg([b for _, b in fillers])
        cells.update(harness.cost_cells(dirs))
        rows[arm] = cells
    before = harness.warm_start_eval(runs)
    cols = ["mean_at_k", "greedy_acc", "len_mean", "train len drift", "max len drift", "train_correct(tail20)",
            "fillers (first 10)", "fillers (last 10)", "targets", "hint rows/step", "forwards/step", "s/step"]
    plots = [harness.plot_curves(runs, ["eval/mean_at_k", "eval/len_mean"], out_dir / "eval_curves.png"),
             harness.plot_curves(runs, ["reward/correct_frac", "rollout/completion_len_mean"],
                                 out_dir / "train_curves.png")]
    lines = [f"# {EXPERIMENT}\n\n",
             f"Recipe `{RECIPE}`, seeds {args.seeds}; held-out Mean@8 (k = 8, T = 1), greedy and "
             f"length on 128 problems; warm start Mean@8 {harness.fmt(before)}. 'train len drift': mean completion "
             "length of the last 10 steps over the first 10, minus 1; "
             "'max len drift': the largest |window / first 10 − 1| "
             "over 10-step windows (the spec's 'stays within ±15%'); 'fillers': share of the recorded rollouts with a "
             "filler word over the first / last 10 recorded steps.\n\n", harness.table(rows, cols),
             "\nHeld-out Mean@8 at every evaluation:\n\n", harness.eval_curve(runs)]
    harness.write_report(out_dir, lines, plots)


if __name__ == "__main__":
    main()
