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
G = 8, 16 prompts per step, lr 1e-4 (constant, no warm-up), 112 completion tokens, std-normalised GRPO
advantages everywhere, held-out eval (128 problems, mean@4 at T=1 + greedy) every 20 steps.

  grpo            accuracy-only GRPO (``correctness``)
  length_penalty  GRPO with r = c - 0.2 * len / 112 on every answer (recipes/length_penalty_lab.yaml)
  acoer           ACOER with the paper's control loop compressed 10x in time (see the recipe)
  acoer_fixed     fixed correct-only bonus, alpha = 0.3, budget 112 (no control loop); with --with-fixed

Collapse setting (``--early-exit P``; hypothesis written before its runs): every arm, grpo included (trained
here, to experiments/out/acoer_early_exit), adds ``task.p_early_exit=P``: a share P of the warm start's traces
answer after a partial prefix of the steps (short, and mostly wrong without the remaining steps). On the plain
task the penalty arm could not collapse because no short wrong answer was reachable; here one is. Expected at
P = 0.3 and 100 steps: the all-answer penalty raises the held-out early-exit share (sampled answers without the
``so X.`` commitment) above GRPO's and loses accuracy against GRPO, showing the spec's collapse signature in
>= 2 of 3 seeds; ACOER's early-exit share stays near GRPO's (an all-incorrect group scores 0 throughout), unless
lucky short correct guesses earn its bonus (the paper's 1-in-6 over-compression of correct answers).

The grpo arm is experiments/qlpo.py's grpo arm (trained there, or here at the end if missing), whose resolved config
equals this recipe with ``reward.terms=[{name: correctness}]``; the report checks that every arm's resolved config
equals the grpo runs' apart from name/out_dir/seed/trainer.steps/reward, and reads every arm at its step-STEPS
held-out eval (constant lr, no warm-up: the first N steps of a longer baseline run are an N-step run).

Budget: 3 seeds x 2 trained arms x STEPS = 200 steps (qlpo.STEPS; the spec asks 800) (``--steps N``: N steps,
compared with the baseline's step-N eval), seeds interleaved (acoer, length_penalty per seed), one torch thread
per run (--jobs 2 runs two at once, with the same bits). Collapse setting: ``--early-exit 0.3 --steps 100``.

Usage: PYTHONPATH=src python experiments/acoer.py --jobs 2 [--seeds 0 1 2] [--with-fixed] [--early-exit P]
[--steps N] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from qlpo import (  # noqa: E402
    COMMON,
    STEPS,
    check_baseline,
    checks_per_response,
    comparable,
    curve_table,
    ensure_baseline,
    eval_at,
    resolved,
    rows,
)

RECIPE = "recipes/acoer_lab.yaml"
ARMS = {
    "acoer": [],
    "length_penalty": ["reward.terms=[{name: length_penalty, coef: 0.2, max_length: 112}]"],
    "acoer_fixed": ["reward.terms.0.alpha_init=0.3", "reward.terms.0.alpha_min=0.3", "reward.terms.0.alpha_max=0.3",
                    "reward.terms.0.warmup_steps=1000000"],
}
SHORTEST_TRACE = 23  # tokens of the shortest complete lab trace (2 operations, no re-check, EOS included)


def check_arms(runs: dict[str, list[Path]]) -> None:
    """Every arm's resolved config equals the grpo baseline's apart from name/out_dir/seed/steps and the reward."""
    ref = {k: v for k, v in comparable(resolved(runs["grpo"][0])).items() if k != "reward"}
    for dirs in runs.values():
        for d in dirs:
            have = {k: v for k, v in comparable(resolved(d)).items() if k != "reward"}
            if have != ref:
                diff = sorted(k for k in ref.keys() | have.keys() if ref.get(k) != have.get(k))
                raise SystemExit(f"{d}: resolved config differs from the grpo baseline in {diff}")


def collapse(run: Path, step: int) -> bool:
    before, after = eval_at(run, 0), eval_at(run, step)
    return (before["eval/mean_at_k"] - after["eval/mean_at_k"] >= 0.10 or after["eval/len_mean"] < SHORTEST_TRACE)


def early_exit_share(run: Path, step: int) -> float:
    """Share of sampled (T=1) held-out answers that never commit (no ``so X.`` in the think block): early exits."""
    return statistics.fmean("so " not in r["text"].split("</think>", 1)[0] for r in harness.eval_samples(run, step))


def trajectories(runs: dict[str, list[Path]], out: Path, step: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["reward/acoer_alpha", "reward/acoer_budget", "reward/acoer_ema_acc", "reward/acoer_ema_len"]
    arms = [a for a in runs if a.startswith("acoer")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.4 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for arm, style in zip(arms, ("-", "--")):
            for d in runs[arm]:
                r = [x for x in rows(d, step) if key in x]
                ax.plot([x["step"] for x in r], [x[key] for x in r], style, label=f"{arm} {d.name[-2:]}")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def report(runs: dict[str, list[Path]], out_dir: Path, step: int, flags: str, own_baseline: bool) -> str:
    note = check_baseline(runs["grpo"], step)
    check_arms(runs)
    cells: dict[str, dict[str, dict[str, float]]] = {}
    for arm, dirs in runs.items():
        c = cells[arm] = {}
        for k in ("eval/mean_at_k", "eval/greedy_acc", "eval/len_mean", "eval/len_correct_mean"):
            c[k] = harness.agg([eval_at(d, step)[k] for d in dirs])
        c["min mean@4 over evals"] = harness.agg([min(eval_at(d, s)["eval/mean_at_k"] for s in range(20, step + 1, 20))
                                                   for d in dirs])
        c["chk per response"] = harness.agg([checks_per_response(d, step) for d in dirs])
        c["early exits"] = harness.agg([early_exit_share(d, step) for d in dirs])
        tail = [[r for r in rows(d, step)][-10:] for d in dirs]
        for key, label in (("reward/correct_frac", "train correct_frac (last 10)"),
                           ("rollout/completion_len_mean", "train len (last 10)"),
                           ("adv/zero_std_group_frac", "zero-std groups (last 10)")):
            c[label] = harness.agg([statistics.fmean(r[key] for r in t) for t in tail])
    start = runs["grpo"][0]
    base = eval_at(start, 0)
    g, a = cells["grpo"], cells["acoer"]
    rel = 1 - a["eval/len_mean"]["mean"] / g["eval/len_mean"]["mean"]
    d_acc = a["eval/mean_at_k"]["mean"] - g["eval/mean_at_k"]["mean"]
    collapses = {arm: sum(collapse(d, step) for d in dirs) for arm, dirs in runs.items()}
    ctrl = []
    for arm in (x for x in runs if x.startswith("acoer")):
        for d in runs[arm]:
            r = [x for x in rows(d, step) if "reward/acoer_alpha" in x]
            al, bu = [x["reward/acoer_alpha"] for x in r], [x["reward/acoer_budget"] for x in r]
            bo = [x["reward/acoer_bonus_mean"] for x in r]
            moved = next((x["step"] for x in r if x["reward/acoer_alpha"] != al[0]), None)
            ctrl.append(f"| {arm} | {d.name} | {al[0]:.3f} -> {al[-1]:.3f} [{min(al):.3f}, {max(al):.3f}] | "
                        f"{moved if moved is not None else '-'} | {bu[0]:.1f} -> {bu[-1]:.1f} [{min(bu):.1f}, "
                        f"{max(bu):.1f}] | {statistics.fmean(bo[-10:]):.3f} |")
    seeds = [harness.seed_of(d) for d in runs["grpo"]]
    steps_flag = f" --steps {step}" if step != STEPS else ""
    md = (f"# ACOER experiment\n\nSeeds {seeds}, compared at step {step}, G = 8, 16 prompts/step, lr 1e-4 "
          "constant, std-normalised GRPO, eval every 20 steps (128 held-out problems, mean@4 at T=1, greedy). "
          "Command: " + ("" if own_baseline else
                         f"`PYTHONPATH=src python experiments/qlpo.py --jobs 2{steps_flag}` (the grpo arm), then ")
          + f"`PYTHONPATH=src python experiments/acoer.py --jobs 2{steps_flag}{flags}`.\nGRPO baseline: {note}.\n\n"
          f"Warm start (step 0): mean@4 {base['eval/mean_at_k']:.3f}, greedy {base['eval/greedy_acc']:.3f}, "
          f"length {base['eval/len_mean']:.1f} tokens, chk/response {checks_per_response(start, 0):.2f}, "
          f"early exits {early_exit_share(start, 0):.3f}.\n\n"
          f"## Held-out metrics at step {step} (mean ± std [min, max] over seeds)\n\n" + harness.table(cells, list(g))
          + f"\nACOER vs accuracy-only GRPO: mean length {100 * rel:.1f}% shorter (spec pass: >= 30%), mean@4 "
          f"{100 * d_acc:+.1f} points (spec pass: within 1).\n\n"
          f"Collapse signature at step {step} (mean@4 down >= 10 points from the warm start, or held-out length < "
          f"{SHORTEST_TRACE} tokens): " + ", ".join(f"{arm} {n}/{len(runs[arm])}" for arm, n in collapses.items())
          + ".\n\n## Held-out curves (seed-mean mean@4 / length / early-exit share)\n\n"
          + curve_table(runs, step, early_exit_share)
          + "\n## Control loop (alpha, budget; first step alpha moved; mean bonus over the last 10 steps)\n\n"
          "| arm | run | alpha start -> end [min, max] | alpha first moved at step | budget start -> end [min, max] "
          "| bonus (last 10) |\n|---|---|---|---|---|---|\n"
          + "\n".join(ctrl) + "\n\nPlots: `eval_curves.png`, `training.png`, `control_loop.png`.\n")
    (out_dir / "results.md").write_text(md)
    (out_dir / "results.json").write_text(json.dumps({"cells": cells, "collapses": collapses}, indent=1))
    harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc", "eval/len_mean", "eval/len_correct_mean"],
                        out_dir / "eval_curves.png")
    harness.plot_curves(runs, ["reward/correct_frac", "rollout/completion_len_mean", "adv/zero_std_group_frac",
                               "adv/abs_mean"], out_dir / "training.png")
    trajectories(runs, out_dir / "control_loop.png", step)
    return md


def main() -> None:
    def own(p: argparse.ArgumentParser) -> None:
        p.add_argument("--with-fixed", action="store_true", help="add the acoer_fixed arm")
        p.add_argument("--early-exit", type=float, default=0.0, metavar="P",
                       help="the collapse setting: task.p_early_exit=P in every arm, grpo trained here")

    args = harness.cli_args(__doc__.splitlines()[0], own)
    with_fixed, early = args.with_fixed, args.early_exit
    name = "acoer_early_exit" if early else "acoer"
    out_dir = Path(args.out) if args.out else harness.OUT / name
    step = args.steps or STEPS
    task = [f"task.p_early_exit={early}"] if early else []
    grpo = {"grpo": ["reward.terms=[{name: correctness}]"]} if early else {}  # qlpo.py's grpo arm, on this task
    arms = {a: [*COMMON, *ov, *task] for a, ov in {**grpo, **ARMS}.items() if with_fixed or a != "acoer_fixed"}
    runs: dict[str, list[Path]] = {} if early else {"grpo": [harness.OUT / "qlpo" / f"grpo-s{s}" for s in args.seeds]}
    for s in args.seeds:  # seeds interleaved: a cut-short experiment still has matched arms
        for arm, dirs in harness.run_arms(name, RECIPE, arms,
                                          argparse.Namespace(**{**vars(args), "seeds": [s]})).items():
            runs.setdefault(arm, []).extend(dirs)
    if not args.report_only and not early:  # normally trained by experiments/qlpo.py already; trains what is missing
        ensure_baseline(args.seeds, args.jobs)
    flags = (" --with-fixed" if with_fixed else "") + (f" --early-exit {early:g}" if early else "")
    print(report(runs, out_dir, step, flags, own_baseline=bool(early)))


if __name__ == "__main__":
    main()
