"""RLCSD (arXiv:2606.11709): does contrasting a correct sibling's hint with wrong siblings' hints give a
self-distillation signal that keeps response length stable and accuracy at least GRPO's, where one-sided
self-distillation drifts?

Paper claim: one-sided on-policy self-distillation (RLSD, OPSD) picks up the style shift any hint induces, so
response length drifts; RLCSD's contrast cancels it, and beats GRPO. Spec §10 acceptance (scaled): GRPO, OPSD,
RLCSD (the official constants, recipes/rlcsd_lab.yaml); 500 steps, 3 seeds; pass if RLCSD's response length stays
within ±15% of its initial length and its accuracy ≥ GRPO's, while OPSD's length drifts.

Setting (recipes/rlcsd_lab.yaml): the DASH-OPSD setting, fixed before any RLCSD run (chains of three additions
mod 10, wrapping steps off by one in 60% of warm-start traces; half the warm-start examples show the problem with
its clean trace in `<ref>` tags, so a hint changes what the policy predicts). 16 prompts x 8 samples, 48 tokens,
lr 1e-4, 300 steps (the DASH-OPSD budget), eval every 50 steps on 128 held-out problems with k = 8. The GRPO and
OPSD arms are exactly experiments/dash_opsd.py's (checked key by key on the resolved config, then copied from
experiments/out/dash_opsd/ instead of trained again). Not the spec's style-drift corpus (fillers without a
hint, terse traces with one): the lab has no filler tokens, so the length criterion is measured on the
setting's own traces.

    PYTHONPATH=src python experiments/rlcsd.py --jobs 2
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

EXPERIMENT = "rlcsd"
RECIPE = "recipes/rlcsd_lab.yaml"
COMMON = ["trainer.steps=300", "trainer.save_every=0", "trainer.sinks=[jsonl]"]
PLAIN = ["rollout.transforms=[]", "credit=[]"]
ARMS = {
    "grpo": [*PLAIN],
    "opsd": [*PLAIN, "teacher={name: frozen, context: \"{prompt}\\n<ref>{reference}</ref>\"}",
             "loss.terms=[{name: opsd, beta: 0.0, token_clip: 0.05, support: vocab}]"],
    "rlcsd": [],
}
REUSED = ("grpo", "opsd")  # from experiments/out/dash_opsd


def length_drift(run: Path, n: int = 10) -> float:
    """Relative change of the mean train completion length: last n steps against the first n."""
    rows = [r["rollout/completion_len_mean"] for r in harness.metrics(run) if "rollout/completion_len_mean" in r]
    return statistics.fmean(rows[-n:]) / statistics.fmean(rows[:n]) - 1.0


def main() -> None:
    def own(p):
        p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="run / report only these")

    args = harness.cli_args(__doc__.splitlines()[0], own)
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    arms = {k: [*COMMON, *ARMS[k]] for k in args.arms}
    for arm in REUSED:
        for s in args.seeds if arm in arms and not args.steps else []:
            harness.reuse(harness.OUT / "dash_opsd" / f"{arm}-s{s}", RECIPE, [*arms[arm], f"seed={s}"],
                          out_dir / f"{arm}-s{s}")
    runs = harness.run_arms(EXPERIMENT, RECIPE, arms, args)
    rows = {}
    for arm, dirs in runs.items():
        cells = {k: harness.agg([harness.final_eval(d, f"eval/{k}") for d in dirs])
                 for k in ("mean_at_k", "greedy_acc", "len_mean")}
        cells["train len drift"] = harness.agg([length_drift(d) for d in dirs])
        cells["train_correct(tail20)"] = harness.agg([harness.tail_mean(d, "reward/correct_frac") for d in dirs])
        if arm == "rlcsd":
            cells["targets"] = harness.agg([harness.tail_mean(d, "rollout/rlcsd_targets", 10**9) for d in dirs])
        cells["forwards/step"] = harness.agg([harness.forwards(d) for d in dirs])
        cells["s/step"] = harness.agg([harness.tail_mean(d, "perf/step_s", 10**9) for d in dirs])
        rows[arm] = cells
    before = harness.agg([harness.summary(r)["before"]["eval/mean_at_k"] for r in next(iter(runs.values()))])
    cols = ["mean_at_k", "greedy_acc", "len_mean", "train len drift", "train_correct(tail20)", "targets",
            "forwards/step", "s/step"]
    plots = [harness.plot_curves(runs, ["eval/mean_at_k", "eval/len_mean"], out_dir / "eval_curves.png"),
             harness.plot_curves(runs, ["reward/correct_frac", "rollout/completion_len_mean"],
                                 out_dir / "train_curves.png")]
    lines = [f"# {EXPERIMENT}\n\n", f"Recipe `{RECIPE}`, seeds {args.seeds}; held-out Mean@8 (k = 8, T = 1), greedy and "
             f"length on 128 problems; warm start Mean@8 {harness.fmt(before)}. 'train len drift': mean completion "
             "length of the last 10 steps over the first 10, minus 1.\n\n", harness.table(rows, cols),
             "\nHeld-out Mean@8 at every evaluation:\n\n", harness.eval_curve(runs)]
    lines += [f"\n![{p.stem}]({p.name})\n" for p in plots]
    (out_dir / "results.md").write_text("".join(lines))
    print("".join(lines))


if __name__ == "__main__":
    main()
