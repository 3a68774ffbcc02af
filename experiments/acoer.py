"""ACOER (arXiv:2606.22716): the spec's acceptance experiment (specs-01-08.md §7) on the reasoning lab.

Claim under test: a correct-only brevity bonus with an adaptive weight and budget shortens answers (the
paper: 33-62% fewer tokens) at about equal accuracy and stays stable, whereas GRPO with a length penalty on
every answer collapses: inside all-incorrect groups std normalisation turns tiny length differences into
unit-size advantages for shorter wrong answers. Spec pass criteria: ACOER length >= 30% below accuracy-only
GRPO with accuracy within 1 point; the all-answer penalty arm shows a collapse signature (accuracy down >= 10
points from the warm start, or length collapsed below the shortest complete trace) in >= 2 of 3 seeds;
alpha / budget trajectories logged and bounded.

Setting: recipes/acoer_lab.yaml (lab with overthinking: 0..6 redundant ``chk`` re-checks after the answer,
+1 when correct, plus wrap slips for accuracy headroom), embedded lab-tiny warm start shared by all arms,
G = 8, 16 prompts per step, lr 3e-4, 112 completion tokens, std-normalised GRPO advantages everywhere,
held-out eval (128 problems, mean@4 at T=1 + greedy) every EVAL_EVERY steps.

  grpo            accuracy-only GRPO (``correctness``)
  length_penalty  GRPO with r = c - 0.2 * len / 112 on every answer (recipes/length_penalty_lab.yaml)
  acoer           ACOER with the paper's control loop compressed 10x in time (see the recipe)
  acoer_fixed     fixed correct-only bonus, alpha = 0.3, budget 112 (no control loop); with --with-fixed

The grpo arm has the same resolved config as experiments/qlpo.py's grpo arm; finished runs there are copied
instead of retrained (checked by comparing resolved configs).

Budget: 3 seeds x 3 arms x STEPS steps (one arm reused when qlpo.py ran first), --jobs 1.

Usage: PYTHONPATH=src python experiments/acoer.py --jobs 1 [--seeds 0 1 2] [--with-fixed] [--report-only]
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from qlpo import COMMON, checks_per_response, rows  # noqa: E402  (same budget as the QLPO experiment)

RECIPE = "recipes/acoer_lab.yaml"
ARMS = {
    "grpo": ["reward.terms=[{name: correctness}]"],
    "length_penalty": ["reward.terms=[{name: length_penalty, coef: 0.2, max_length: 112}]"],
    "acoer": [],
    "acoer_fixed": ["reward.terms.0.alpha_init=0.3", "reward.terms.0.alpha_min=0.3", "reward.terms.0.alpha_max=0.3",
                    "reward.terms.0.warmup_steps=1000000"],
}
SHORTEST_TRACE = 23  # tokens of the shortest complete lab trace (2 operations, no re-check, EOS included)


def comparable(resolved: dict) -> dict:
    return {k: v for k, v in resolved.items() if k not in ("name", "out_dir")}


def reuse_grpo(args, out_dir: Path) -> None:
    """Copy finished qlpo-experiment grpo runs whose resolved config equals this arm's (minus name, out_dir)."""
    from groupwise.config import load, to_dict

    for s in args.seeds:
        src, dst = harness.OUT / "qlpo" / f"grpo-s{s}", out_dir / f"grpo-s{s}"
        if dst.exists() or not (src / "summary.json").exists():
            continue
        steps = [f"trainer.steps={args.steps}"] if args.steps else []
        want = to_dict(load(RECIPE, [*COMMON, *ARMS["grpo"], f"seed={s}", *steps, "trainer.threads=1",
                                     "trainer.progress=false"]))
        have = yaml.safe_load((src / "resolved_config.yaml").read_text())
        if comparable(want) == comparable(have):
            shutil.copytree(src, dst)
            print(f"  reused {src} (identical resolved config)", flush=True)


def collapse(run: Path) -> bool:
    s = harness.summary(run)
    return (s["before"]["eval/mean_at_k"] - s["after"]["eval/mean_at_k"] >= 0.10
            or s["after"]["eval/len_mean"] < SHORTEST_TRACE)


def trajectories(runs: dict[str, list[Path]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["reward/acoer_alpha", "reward/acoer_budget", "reward/acoer_ema_acc", "reward/acoer_ema_len"]
    arms = [a for a in runs if a.startswith("acoer")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.4 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for arm, style in zip(arms, ("-", "--")):
            for d in runs[arm]:
                r = [x for x in rows(d) if key in x]
                ax.plot([x["step"] for x in r], [x[key] for x in r], style, label=f"{arm} {d.name[-2:]}")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def report(runs: dict[str, list[Path]], out_dir: Path, flags: str) -> str:
    cells: dict[str, dict[str, dict[str, float]]] = {}
    for arm, dirs in runs.items():
        c = cells[arm] = {}
        for k in ("eval/mean_at_k", "eval/greedy_acc", "eval/len_mean", "eval/len_correct_mean"):
            c[k] = harness.agg([harness.final_eval(d, k) for d in dirs])
        c["chk per response"] = harness.agg([checks_per_response(d, rows(d)[-1]["step"]) for d in dirs])
        c["train correct_frac (last 10)"] = harness.agg([harness.tail_mean(d, "reward/correct_frac", 10)
                                                         for d in dirs])
        c["train len (last 10)"] = harness.agg([harness.tail_mean(d, "rollout/completion_len_mean", 10)
                                                for d in dirs])
    start = runs["grpo"][0]
    base = harness.summary(start)["before"]
    g, a = cells["grpo"], cells["acoer"]
    rel = 1 - a["eval/len_mean"]["mean"] / g["eval/len_mean"]["mean"]
    d_acc = a["eval/mean_at_k"]["mean"] - g["eval/mean_at_k"]["mean"]
    collapses = {arm: sum(collapse(d) for d in dirs) for arm, dirs in runs.items()}
    ctrl = []
    for arm in (x for x in runs if x.startswith("acoer")):
        for d in runs[arm]:
            r = [x for x in rows(d) if "reward/acoer_alpha" in x]
            al, bu = [x["reward/acoer_alpha"] for x in r], [x["reward/acoer_budget"] for x in r]
            moved = next((x["step"] for x in r if x["reward/acoer_alpha"] != al[0]), None)
            ctrl.append(f"| {arm} | {d.name} | {al[0]:.3f} -> {al[-1]:.3f} [{min(al):.3f}, {max(al):.3f}] | "
                        f"{moved if moved is not None else '-'} | {bu[0]:.1f} -> {bu[-1]:.1f} [{min(bu):.1f}, "
                        f"{max(bu):.1f}] |")
    steps = rows(start)[-1]["step"]
    md = (f"# ACOER experiment\n\nSeeds {[int(d.name.rsplit('-s', 1)[1]) for d in runs['grpo']]}, {steps} steps, "
          "G = 8, 16 prompts/step, std-normalised GRPO, eval every 20 steps (128 held-out problems, mean@4 at "
          f"T=1, greedy). Command: `PYTHONPATH=src python experiments/acoer.py --jobs 1{flags}`.\n\n"
          f"Warm start (step 0): mean@4 {base['eval/mean_at_k']:.3f}, greedy {base['eval/greedy_acc']:.3f}, "
          f"length {base['eval/len_mean']:.1f} tokens, chk/response {checks_per_response(start, 0):.2f}.\n\n"
          "## Final held-out metrics (mean ± std [min, max] over seeds)\n\n" + harness.table(cells, list(g)) +
          f"\nACOER vs accuracy-only GRPO: mean length {100 * rel:+.1f}% shorter (spec pass: >= 30%), mean@4 "
          f"{100 * d_acc:+.1f} points (spec pass: within 1).\n\n"
          "Collapse signature (mean@4 down >= 10 points from the warm start, or held-out length < "
          f"{SHORTEST_TRACE} tokens): " + ", ".join(f"{arm} {n}/{len(runs[arm])}" for arm, n in collapses.items())
          + ".\n\n## Control loop (alpha, budget; first step alpha moved)\n\n| arm | run | alpha start -> end "
          "[min, max] | alpha first moved at step | budget start -> end [min, max] |\n|---|---|---|---|---|\n"
          + "\n".join(ctrl) + "\n\nPlots: `eval_curves.png`, `training.png`, `control_loop.png`.\n")
    (out_dir / "results.md").write_text(md)
    (out_dir / "results.json").write_text(json.dumps({"cells": cells, "collapses": collapses}, indent=1))
    harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc", "eval/len_mean", "eval/len_correct_mean"],
                        out_dir / "eval_curves.png")
    harness.plot_curves(runs, ["reward/correct_frac", "rollout/completion_len_mean", "adv/zero_std_group_frac",
                               "adv/abs_mean"], out_dir / "training.png")
    trajectories(runs, out_dir / "control_loop.png")
    return md


def main() -> None:
    with_fixed = "--with-fixed" in sys.argv
    if with_fixed:
        sys.argv.remove("--with-fixed")
    args = harness.cli_args(__doc__.splitlines()[0])
    out_dir = Path(args.out) if args.out else harness.OUT / "acoer"
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        reuse_grpo(args, out_dir)
    arms = {a: [*COMMON, *ov] for a, ov in ARMS.items() if with_fixed or a != "acoer_fixed"}
    runs = harness.run_arms("acoer", RECIPE, arms, args)
    print(report(runs, out_dir, " --with-fixed" if with_fixed else ""))


if __name__ == "__main__":
    main()
