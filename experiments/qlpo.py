"""QLPO (arXiv:2607.21793): the spec's acceptance experiment (specs-01-08.md §4) on the reasoning lab.

Claim under test: resampling each GRPO group from K over-generated rollouts by length/correctness quadrant
(favouring short correct and long incorrect answers) shortens responses by 30-70% at preserved accuracy,
with no length term in the reward. Spec pass criteria: QLPO(alpha=1/3) mean length >= 20% below GRPO with
accuracy within 1.5 points; QLPO(alpha=1) length ~ GRPO; the re-check count falls fastest under QLPO.

Setting: recipes/qlpo_lab.yaml (lab with overthinking: 0..6 redundant ``chk`` re-checks after the answer,
+1 when correct, plus wrap slips for accuracy headroom), embedded lab-tiny warm start shared by all arms,
16 prompts per step, lr 3e-4, 112 completion tokens, held-out eval (128 problems, mean@4 at T=1 + greedy)
every EVAL_EVERY steps.

  grpo       GRPO, G = 8 (no transform)
  qlpo       K = 16 generated, M = 8 kept, alpha = 1/3 (the paper's setting)
  qlpo_a1    K = 16 -> M = 8, alpha = 1: a ratio-preserving uniform subsample (isolates the quadrant weighting
             from over-generation); run when --with-alpha1 is given

The spec's GRPO G = 16 arm is not run (budget). Generation cost: QLPO samples 2x the tokens of GRPO per step
(``rollout/qlpo_pool_tokens``; the trainer's ``perf/gen_tokens`` counts only the kept samples).

Budget: 3 seeds x 2 arms x STEPS steps (+ 3 x STEPS with --with-alpha1), one run at a time with one torch
thread (--jobs 1). The grpo runs are identical (same resolved config) to experiments/acoer.py's accuracy-only
arm, which reuses them.

Usage: PYTHONPATH=src python experiments/qlpo.py --jobs 1 [--seeds 0 1 2] [--with-alpha1] [--report-only]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

RECIPE = "recipes/qlpo_lab.yaml"
STEPS, EVAL_EVERY = 120, 20
COMMON = [f"trainer.steps={STEPS}", f"eval.every={EVAL_EVERY}", "trainer.save_every=0", "trainer.sinks=[jsonl]"]
GRPO = ["rollout.group_size=8", "rollout.transforms=[]"]
ARMS = {"grpo": GRPO, "qlpo": [], "qlpo_a1": ["rollout.transforms.0.alpha=1.0"]}
QUAD = ("sc", "lc", "si", "li")


def rows(run: Path) -> list[dict]:
    return [r for r in harness.metrics(run) if "perf/step_s" in r]


def eval_records(run: Path, step: int) -> list[dict]:
    path = run / "eval" / f"step_{step}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def checks_per_response(run: Path, step: int) -> float:
    """Mean number of redundant ``chk`` re-checks per sampled (T=1) held-out response."""
    return statistics.fmean(r["text"].count("chk ") for r in eval_records(run, step) if not r["greedy"])


def run_cells(dirs: list[Path]) -> dict[str, dict[str, float]]:
    c: dict[str, dict[str, float]] = {}
    for k in ("eval/mean_at_k", "eval/greedy_acc", "eval/len_mean", "eval/len_correct_mean"):
        c[k] = harness.agg([harness.final_eval(d, k) for d in dirs])
    c["chk per response"] = harness.agg([checks_per_response(d, rows(d)[-1]["step"]) for d in dirs])
    c["generated tokens (pool)"] = harness.agg([sum(r.get("rollout/qlpo_pool_tokens", r["perf/gen_tokens"])
                                                    for r in rows(d)) for d in dirs])
    c["wall_s"] = harness.agg([rows(d)[-1]["perf/wall_s_total"] for d in dirs])
    return c


def quadrant_table(runs: dict[str, list[Path]]) -> str:
    lines = ["| arm | when | SC | LC | SI | LI | mean length | correct frac |", "|---|---|---|---|---|---|---|---|"]
    for arm, dirs in runs.items():
        if arm == "grpo":
            continue
        for when in ("before", "after"):
            cells = []
            for key in [f"rollout/qlpo_{q}_frac_{when}" for q in QUAD] + [f"rollout/qlpo_len_mean_{when}",
                                                                         f"rollout/qlpo_correct_frac_{when}"]:
                cells.append(harness.fmt(harness.agg([statistics.fmean(r[key] for r in rows(d)) for d in dirs]), 3))
            lines.append(f"| {arm} | {when} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_quadrants(runs: dict[str, list[Path]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in runs if a != "grpo"]
    fig, axes = plt.subplots(1, len(arms), figsize=(5 * len(arms), 3.5), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        for q, color in zip(QUAD, ("tab:green", "tab:olive", "tab:orange", "tab:red")):
            for when, style in (("before", ":"), ("after", "-")):
                xs, ys = harness.curves({arm: runs[arm]}, f"rollout/qlpo_{q}_frac_{when}")[arm]
                ys = [statistics.fmean(ys[max(0, i - 9):i + 1]) for i in range(len(ys))]
                ax.plot(xs, ys, style, color=color, label=f"{q.upper()} {when}")
        ax.set_title(f"{arm}: quadrant shares (pool dotted, kept solid)", fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def report(runs: dict[str, list[Path]], out_dir: Path) -> str:
    cells = {arm: run_cells(dirs) for arm, dirs in runs.items()}
    start = runs["grpo"][0]
    base = {k: harness.summary(start)["before"][k] for k in ("eval/mean_at_k", "eval/greedy_acc", "eval/len_mean")}
    seeds = [int(d.name.rsplit("-s", 1)[1]) for d in runs["grpo"]]
    g, q = cells["grpo"], cells["qlpo"]
    rel = 1 - q["eval/len_mean"]["mean"] / g["eval/len_mean"]["mean"]
    d_acc = q["eval/mean_at_k"]["mean"] - g["eval/mean_at_k"]["mean"]
    steps = rows(start)[-1]["step"]
    md = (f"# QLPO experiment\n\nSeeds {seeds}, {steps} steps, 16 prompts/step, eval every {EVAL_EVERY} steps "
          "(128 held-out problems, mean@4 at T=1, greedy). Command: `PYTHONPATH=src python experiments/qlpo.py "
          f"--jobs 1{' --with-alpha1' if 'qlpo_a1' in runs else ''}`.\n\n"
          f"Warm start (step 0): mean@4 {base['eval/mean_at_k']:.3f}, greedy {base['eval/greedy_acc']:.3f}, "
          f"length {base['eval/len_mean']:.1f} tokens, chk/response {checks_per_response(start, 0):.2f}.\n\n"
          "## Final held-out metrics (mean ± std [min, max] over seeds)\n\n"
          + harness.table(cells, list(g), digits=3) +
          f"\nQLPO(alpha=1/3) vs GRPO: mean length {100 * rel:+.1f}% shorter (spec pass: >= 20%), "
          f"mean@4 {100 * d_acc:+.1f} points (spec pass: within 1.5).\n\n"
          "## Quadrant shares of the pool (before) and of the kept group (after), per-step means\n\n"
          + quadrant_table(runs) + "\nPlots: `eval_curves.png` (held-out accuracy and length), `training.png`, "
          "`quadrants.png`.\n")
    (out_dir / "results.md").write_text(md)
    (out_dir / "results.json").write_text(json.dumps(cells, indent=1))
    harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc", "eval/len_mean", "eval/len_correct_mean"],
                        out_dir / "eval_curves.png")
    harness.plot_curves(runs, ["reward/correct_frac", "rollout/completion_len_mean"], out_dir / "training.png")
    plot_quadrants(runs, out_dir / "quadrants.png")
    return md


def main() -> None:
    with_a1 = "--with-alpha1" in sys.argv
    if with_a1:
        sys.argv.remove("--with-alpha1")
    args = harness.cli_args(__doc__.splitlines()[0])
    out_dir = Path(args.out) if args.out else harness.OUT / "qlpo"
    arms = {a: [*COMMON, *ov] for a, ov in ARMS.items() if with_a1 or a != "qlpo_a1"}
    runs = harness.run_arms("qlpo", RECIPE, arms, args)
    print(report(runs, out_dir))


if __name__ == "__main__":
    main()
