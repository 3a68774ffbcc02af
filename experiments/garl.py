"""GARL / PAFT (J_Q family, arXiv:2604.25907): from a cold start, does GRPO stall while GARL (q = 0.75)
escapes, and how does PAFT (q = 0.75) behave?

Paper claim (abstract): with output-only supervision RLVR stalls when the initial success rate p0 is tiny
(escape time Ω(1/p0) at q = 0 vs Θ(log 1/p0) at q = 1); in cold start GARL q = 0.75 escapes where GRPO
fails completely; in warm start PAFT q = 0.75 is the stable choice (HotPotQA +14.4 maj@16 over GRPO).

Setting (recipes/garl_lab.yaml): the clean reasoning lab (chains of 2-4 operations) from a deliberately
short warm start, ``model.warm_start_steps: 250`` (lr 1e-3), chosen BEFORE any RL run from the starting
success rate alone: held-out sampled accuracy (mean@8, T=1, 128 problems, `trainer.steps=0`) after 150 /
200 / 250 SFT steps was 0.077 / 0.096 / 0.100 (format 0.63 / 0.81 / 0.94); the rule, fixed in advance, was
"closest to 10%, the middle of the 5-15% band" -> 250 (whose failures are arithmetic, not format).
16 prompts x 8 samples, lr 1e-4 (the recipe's), the same for every arm.
A first block of the same three arms at lr 3e-4 (100 steps; kept in experiments/out/garl_lr3e-4, not
evidence) was unstable: GARL and PAFT ended at 0% format in two of three seeds each, GRPO stayed flat at ~0.09
(an earlier, unrecorded diagnostic also saw PAFT's SFT on the policy's own successes wreck this warm start
within 5 steps at 3e-4 but not at 1e-4). The lab's RL lr is 1e-4 for every method.
Arms (the spec's cold-start list minus its 5th seed): grpo (std), rloo (= GARL q = 0, "GRPO without std"),
GARL q in {0.5, 0.75, 1}, PAFT q = 0.75. Budget: 200 steps (the spec asks 600; 200 is what one session's CPU
lane allows for six arms), fixed before the run. Hypothesis written before the run (the paper's): the escape
step falls as q grows, GARL q = 0.75 escapes in most seeds, rloo rarely.

Metrics: held-out mean@4 / greedy / format after training; training success rate (reward/correct_frac);
"escape" = the 10-step moving average of the training success rate reaching 0.5 (the spec's metric), with
the step it happens; mean grad norm (stability).

    PYTHONPATH=src python experiments/garl.py --jobs 1
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

EXPERIMENT = "garl"
RECIPE = "recipes/garl_lab.yaml"
STEPS = 200
EVAL_EVERY = 20
ESCAPE = 0.5
COMMON = ["trainer.save_every=0", f"eval.every={EVAL_EVERY}", "trainer.sinks=[jsonl]"]
ARMS = {
    "grpo": ["advantage=grpo", "advantage_transforms=[]"],
    "rloo": ["advantage=rloo", "advantage_transforms=[]"],  # = GARL q = 0 ("GRPO without std")
    "garl_q05": ["advantage_transforms.0.q=0.5"],
    "garl_q075": [],
    "garl_q1": ["advantage_transforms.0.q=1.0"],
    "paft_q075": ["advantage={name: paft, q: 0.75}", "advantage_transforms=[]", "loss.terms=[paft]"],
}


def escape_step(run: Path, key: str = "reward/correct_frac", window: int = 10) -> float:
    """First step whose trailing ``window``-step mean of ``key`` reaches ESCAPE (inf if never)."""
    rows = [(r["step"], r[key]) for r in harness.metrics(run) if key in r and "perf/step_s" in r]
    for i in range(window - 1, len(rows)):
        if statistics.fmean(v for _, v in rows[i - window + 1:i + 1]) >= ESCAPE:
            return float(rows[i][0])
    return float("inf")


def curve_rows(runs: dict[str, list[Path]], steps: int) -> str:
    """Seed-mean held-out mean@4 / format at every eval, and the seed-mean training success over each 50-step
    window (do the curves flatten within the budget?)."""
    evals = list(range(0, steps + 1, EVAL_EVERY))
    head = ("| arm | " + " | ".join(f"step {e}" for e in evals) + " |\n|---|" + "---|" * len(evals) + "\n")
    out = "Held-out mean@4 / format (seed means):\n\n" + head
    for arm, dirs in runs.items():
        ev = [{r["step"]: r for r in harness.metrics(d) if "eval/mean_at_k" in r} for d in dirs]
        out += f"| {arm} | " + " | ".join(
            f"{statistics.fmean(e[s]['eval/mean_at_k'] for e in ev):.3f} / "
            f"{statistics.fmean(e[s]['eval/format_frac'] for e in ev):.2f}" for s in evals) + " |\n"
    windows = [(a, min(a + 50, steps)) for a in range(0, steps, 50)]
    out += ("\nTraining success (reward/correct_frac), seed mean over each window of steps:\n\n| arm | "
            + " | ".join(f"{a + 1}-{b}" for a, b in windows) + " |\n|---|" + "---|" * len(windows) + "\n")
    for arm, dirs in runs.items():
        cells = []
        for a, b in windows:
            vals = [statistics.fmean(r["reward/correct_frac"] for r in harness.metrics(d)
                                     if "perf/step_s" in r and a < r["step"] <= b) for d in dirs]
            cells.append(f"{statistics.fmean(vals):.3f}")
        out += f"| {arm} | " + " | ".join(cells) + " |\n"
    return out


def main() -> None:
    args = harness.cli_args(__doc__.splitlines()[0])
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    arms = {k: [*COMMON, *v] + ([] if args.steps else [f"trainer.steps={STEPS}"]) for k, v in ARMS.items()}
    runs = harness.run_arms(EXPERIMENT, RECIPE, arms, args)
    before = [harness.summary(r)["before"]["eval/mean_at_k"] for r in runs["grpo"]]
    rows, escapes = {}, {}
    for arm, dirs in runs.items():
        cells = {k: harness.agg([harness.final_eval(d, f"eval/{k}") for d in dirs])
                 for k in ("mean_at_k", "greedy_acc", "format_frac")}
        cells["train_success(tail20)"] = harness.agg([harness.tail_mean(d, "reward/correct_frac") for d in dirs])
        cells["grad_norm(mean)"] = harness.agg([harness.tail_mean(d, "update/grad_norm", 10**9) for d in dirs])
        rows[arm] = cells
        escapes[arm] = [escape_step(d) for d in dirs]
    cols = ["mean_at_k", "greedy_acc", "format_frac", "train_success(tail20)", "grad_norm(mean)"]
    plots = [harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc"], out_dir / "eval_curves.png"),
             harness.plot_curves(runs, ["reward/correct_frac", "update/grad_norm", "rollout/completion_len_mean"],
                                 out_dir / "train_curves.png")]
    steps = args.steps or STEPS
    lines = [f"# {EXPERIMENT}\n\n", f"Recipe `{RECIPE}`, {steps} steps, seeds {args.seeds}, eval every {EVAL_EVERY} "
             "steps on 128 held-out problems (k=4, T=1). Cells: mean ± std [min, max] over seeds.\n\n",
             f"Held-out mean@4 at the warm start (step 0): {statistics.fmean(before):.3f} "
             f"(per seed {', '.join(f'{b:.3f}' for b in before)}).\n\n", harness.table(rows, cols),
             f"\nEscape (10-step mean training success ≥ {ESCAPE}): step per seed (inf = not within {steps}):\n\n"]
    lines += [f"- {arm}: {v} — {sum(x != float('inf') for x in v)}/{len(v)} seeds escape\n"
              for arm, v in escapes.items()]
    lines.append("\n" + curve_rows(runs, steps))
    lines += [f"\n![{p.stem}]({p.name})\n" for p in plots]
    (out_dir / "results.md").write_text("".join(lines))
    print("".join(lines))


if __name__ == "__main__":
    main()
