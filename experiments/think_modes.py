"""Adaptive think modes (arXiv:2608.20256, "Learning When to Think"): the spec's acceptance experiment
(specs-01-08.md §2) scaled to the reasoning lab.

Claim under test: with NoThink / Short / Long as the first token, per-mode caps, the mode-shaped reward and
the balance term, GRPO learns to route easy problems to cheap modes: routing does not collapse (mode entropy
> 0.8·ln 3), NoThink's share falls and Long's rises with difficulty, and the mean length is >= 30% shorter
than Long-only GRPO with accuracy within 2 points (the paper: -41% tokens on MATH500 at ~equal accuracy).

Setting: recipes/think_modes_lab.yaml (lab with ``modes: true``, 1..4 operations; warm start: 1500 SFT steps
on a uniform mix of the three styles), caps NT 8 / SH 22 / LG 39 tokens after the mode tag (a Short trace
fits only for 1-2 operations); all arms share the task and model config, hence one cached warm start.

  grpo         plain GRPO (standard builder: the policy writes its own mode tag, no caps, no shaping;
               correctness reward, std-normalised advantage)
  grpo_lg      GRPO forced to <LG> (the think_modes builder with only <LG> allowed, correctness reward), and
               evaluated forced to <LG> (``eval.forced_prefix=<LG>``: every eval sample, greedy included, starts
               with the prefilled tag, as in its training), so Long-only GRPO is judged on all 128 problems
  think_modes  the method: mode token sampled after the forced warm-up, caps, think_mode reward,
               dr_grpo + mode_balance (β_bal 0.1), the sampled mode token's loss weighted 4x (credit
               ``mode_token_weight``, the spec's optional Thinkless-style knob)

Held-out eval (128 problems, mean@4 at T=1, greedy) every 50 steps. The eval of think_modes and grpo samples
the tag freely and without per-mode caps; ``mean@4 capped`` re-grades the same records with the caps (a
completion longer than its mode's cap is wrong), which is what capped generation would give. Mode of a
completion = its first tag.

Budget: the spec's RL run is 600 steps with a 45-step forced warm-up; this runs half of it, 300 steps, with
the warm-up scaled by the same fraction (45/600 of the steps: 22 of 300; ``--steps N`` scales it too), for
3 arms x 3 seeds, one at a time with one torch thread (--jobs 1), seed-major order. A 50-step run took
~1.5 min on one thread, so the 9 runs take about 80 single-thread minutes.

Headroom setting (``--setting headroom``; issue 30; written 2026-12-05 before its warm start was built).
The first lab left nothing to route: <LG> was at 0.995 from the warm start on 1-4 operations and routing collapsed
to it. ``recipes/think_modes_headroom_lab.yaml`` is the headroom lab's third setting (chains of 2-12 additions, the
warm start taught 2-6 only, 0-2 droppable ``chk`` re-checks in <LG> traces) with mode tags, no wrap slip (the task
writes the slip into <LG> traces only, so the modes would differ by more than their length) and no privileged
examples; lab-tiny, 1200 SFT steps at lr 1e-3 on a uniform mix of the three styles (its own warm start, built with
``experiments/headroom_lab.py --recipe recipes/think_modes_headroom_lab.yaml --build``, whose probe reads <LG>
steps). Caps after the tag: <NT> 8, <SH> 27 (a clean Short trace fits on 2-4 additions only), <LG> 127. Same three
arms, 80 steps (the headroom lab's budget; forced warm-up 6 = 45/600 of 80), eval every 40 steps on 132 held-out
problems (12 per k = 2..12), mean@8 at T = 1 and greedy. Run order: think_modes and grpo_lg for seeds 0-2 first,
then grpo (``--arms``), one lane.
  - Check before any RL run (``--mode-check``): each mode forced at the warm start, accuracy and length per k. Go
    only if <LG> is >= 0.8 mean@8 on k = 2..6 (the addition table learned under the mixed SFT) and the modes'
    accuracies differ by k (something to route); otherwise report the check and stop.
  - Expected at the warm start: <LG> ~0.9 on k <= 6 and at chance (~0.1) on k >= 7 (the third setting's gap);
    <SH> below <LG> on k <= 6 (two additions per written result; how far below is the open question); <NT> above
    chance only at k = 2, if at all. Free tag: ~1/3 per mode at every k.
  - Expected for think_modes (3 seeds): routing by difficulty, not collapse: <NT>'s share rises on k >= 7, where
    every mode is at chance and a correct <NT> earns 1.5·γ^4 = 1.22 against <LG>'s 1 (a weak signal: ~0.1 x 0.22
    per sample, so the shift may be partial in 80 steps); <SH> on k = 2-4 as far as its accuracy there matches
    <LG>'s; <LG> on k = 5-6. Mode entropy > 0.8·ln 3. Length >= 30% below grpo_lg's (the long chains are the
    longest <LG> traces, so <NT> there alone cuts most tokens) at mean@8 within 2 points of grpo_lg's: the paper's
    claim, expected to hold here, unlike on the first lab.
  - Expected for grpo_lg: ~0.5 mean@8 throughout (k <= 6 solved from the warm start, k >= 7 at chance, as in the
    third setting). grpo (correctness only, free tag, no caps): keeps whichever mode is most accurate per problem,
    no length incentive, so longer than think_modes.

Usage: PYTHONPATH=src python experiments/think_modes.py --jobs 1 [--setting lab|headroom] [--arms A ...]
       [--seeds 0 1 2] [--report-only | --mode-check]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

SETTINGS = {  # setting -> recipe, steps, eval every, caps after the tag (LG = max_completion_tokens - 1), eval k
    "lab": ("recipes/think_modes_lab.yaml", 300, 50, {"<NT>": 8, "<SH>": 22, "<LG>": 39}, 4),
    "headroom": ("recipes/think_modes_headroom_lab.yaml", 80, 40, {"<NT>": 8, "<SH>": 27, "<LG>": 127}, 8),
}
RECIPE, STEPS, EVAL_EVERY, CAPS, K = SETTINGS["lab"]
MK = f"mean@{K}"  # the held-out metric's name (set with the setting)
SPEC_STEPS, SPEC_WARMUP = 600, 45  # specs-01-08.md §2: RL 600 steps, forced warm-up 45
MODES = ("<NT>", "<SH>", "<LG>")
GRPO = ["reward.terms=[{name: correctness}]", "advantage=grpo", "advantage_transforms=[]"]
BUDGET = [STEPS]  # the step compared (set from --steps); longer runs are read at this step


def warmup(steps: int) -> int:
    """The spec's forced warm-up, 45 of 600 steps, scaled to ``steps`` (22 of 300)."""
    return steps * SPEC_WARMUP // SPEC_STEPS


def arms(steps: int) -> dict[str, list[str]]:
    """Run in this order (the method and its spec baseline first)."""
    common = ["trainer.save_every=0", "trainer.sinks=[jsonl]", f"eval.every={EVAL_EVERY}", f"trainer.steps={steps}"]
    return {
        "think_modes": [*common, f"rollout.builder.warmup_steps={warmup(steps)}",
                        "credit=[{name: mode_token_weight, mode_token_loss_weight: 4.0}]"],
        "grpo_lg": [*common, "rollout.builder={name: think_modes, modes: [<LG>], cap_sh: 22, warmup_steps: 0}",
                    "eval.forced_prefix=<LG>", *GRPO],
        "grpo": [*common, "rollout.builder={name: standard}", *GRPO],
    }


def mode_of(text: str) -> str:
    return next((m for m in MODES if text.startswith(m)), "invalid")


def within_cap(r: dict) -> bool:
    m = mode_of(r["text"])
    return m in CAPS and r["finish_reason"] == "stop" and r["length"] <= CAPS[m] + 1


def final_step(run: Path) -> int:
    """The last eval step within the budget (a longer grpo or grpo_lg run is read at step N: constant lr without
    warm-up, so its state there is the state an N-step run ends in; think_modes' forced warm-up scales with the
    budget, so its runs of another budget are not comparable)."""
    return max(s for s in eval_steps(run) if s <= BUDGET[0])


def eval_steps(run: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in (run / "eval").glob("step_*.jsonl"))


def eval_metric(run: Path, key: str, step: int) -> float:
    return next(r[key] for r in harness.metrics(run) if r["step"] == step and key in r)


def shares(recs: list[dict]) -> dict[str, float]:
    return {m: statistics.fmean(mode_of(r["text"]) == m for r in recs) for m in (*MODES, "invalid")}


def entropy(sh: dict[str, float]) -> float:
    return -sum(p * math.log(p) for m, p in sh.items() if m in MODES and p > 0)


def per_run(run: Path) -> dict[str, float]:
    recs = harness.eval_samples(run, final_step(run))
    sh = shares(recs)
    out = {MK: statistics.fmean(r["correct"] for r in recs),
           MK + " capped": statistics.fmean(r["correct"] and within_cap(r) for r in recs),
           "greedy": eval_metric(run, "eval/greedy_acc", final_step(run)),
           "length": statistics.fmean(r["length"] for r in recs),
           "mode entropy": entropy(sh), **{f"share {m}": sh[m] for m in (*MODES, "invalid")}}
    return out


def by_difficulty(runs: list[Path]) -> dict[int, dict[str, float]]:
    """Final-eval mode shares per difficulty, pooled over seeds."""
    recs = [r for run in runs for r in harness.eval_samples(run, final_step(run))]
    out = {}
    for d in sorted({r["difficulty"] for r in recs}):
        rows = [r for r in recs if r["difficulty"] == d]
        out[d] = {**shares(rows), "acc": statistics.fmean(r["correct"] for r in rows),
                  "len": statistics.fmean(r["length"] for r in rows)}
    return out


def by_mode(runs: list[Path]) -> dict[str, dict[str, float]]:
    recs = [r for run in runs for r in harness.eval_samples(run, final_step(run))]
    out = {}
    for m in (*MODES, "invalid"):
        rows = [r for r in recs if mode_of(r["text"]) == m]
        if rows:
            out[m] = {"n": len(rows), "acc": statistics.fmean(r["correct"] for r in rows),
                      "acc capped": statistics.fmean(r["correct"] and within_cap(r) for r in rows),
                      "len": statistics.fmean(r["length"] for r in rows),
                      "difficulty": statistics.fmean(r["difficulty"] for r in rows)}
    return out


def share_curves(runs: list[Path]) -> tuple[list[int], dict[str, list[float]]]:
    """Held-out mode shares at every eval step, mean over seeds."""
    steps = [s for s in eval_steps(runs[0]) if s <= BUDGET[0]]
    curves = {m: [statistics.fmean(shares(harness.eval_samples(run, s))[m] for run in runs) for s in steps]
              for m in MODES}
    return steps, curves


def plots(runs: dict[str, list[Path]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pngs = [harness.plot_curves(runs, ["eval/mean_at_k", "eval/len_mean", "reward/correct_frac"], out / "curves.png")]
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 3.5))
    for m, c in zip(MODES, ("tab:green", "tab:orange", "tab:blue")):  # training shares of the method's rollouts
        xs, ys = harness.curves({"t": runs["think_modes"]}, f"rollout/mode_share_{m[1:-1]}")["t"]
        ys = [statistics.fmean(ys[max(0, i - 4):i + 1]) for i in range(len(ys))]
        axes[0].plot(xs, ys, label=m, color=c)
        steps, held = share_curves(runs["think_modes"])
        axes[1].plot(steps, held[m], marker="o", label=f"think_modes {m}", color=c)
        if "grpo" in runs:
            steps, held = share_curves(runs["grpo"])
            axes[1].plot(steps, held[m], marker="x", ls="--", label=f"grpo {m}", color=c)
    axes[0].set_title("think_modes: training mode shares (5-step mean)", fontsize=9)
    axes[1].set_title("held-out mode shares (T=1)", fontsize=9)
    diff = by_difficulty(runs["think_modes"])
    ds = list(diff)
    bottom = [0.0] * len(ds)
    for m, c in zip(MODES, ("tab:green", "tab:orange", "tab:blue")):
        vals = [diff[d][m] for d in ds]
        axes[2].bar([str(d) for d in ds], vals, bottom=bottom, label=m, color=c)
        bottom = [b + v for b, v in zip(bottom, vals)]
    axes[2].set_title("think_modes, final eval: mode share by #operations", fontsize=9)
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "modes.png", dpi=110)
    plt.close(fig)
    return [*pngs, out / "modes.png"]


def mode_check(out: Path) -> dict:
    """Each mode forced at the warm start (``eval.forced_prefix``): held-out mean@k, length and the share within
    its cap, per k (the premise: does accuracy by mode differ by difficulty?)."""
    import json

    import torch

    from groupwise.config import load
    from groupwise.eval.evaluate import evaluate_run
    from groupwise.loop.setup import build

    torch.set_num_threads(1)
    p = build(load(RECIPE, ["trainer.threads=1"]))
    problems = list(p.task.test)[:p.cfg.eval.n_problems]
    res: dict = {}
    for m in MODES:
        _, recs = evaluate_run(p, problems, forced_prefix=m, greedy=False)
        res[m] = {d: {"acc": statistics.fmean(r["correct"] for r in rows),
                      "in_cap": statistics.fmean(within_cap({**r, "text": m + r["text"]}) for r in rows),
                      "len": statistics.fmean(r["length"] for r in rows)}
                  for d in sorted({r["difficulty"] for r in recs})
                  for rows in [[r for r in recs if r["difficulty"] == d]]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "mode_check.json").write_text(json.dumps(res, indent=1))
    print(f"{'k':>3} " + " ".join(f"{m + ' ' + c:>14}" for m in MODES for c in (MK, "in cap", "len")))
    for d in res["<LG>"]:
        print(f"{d:>3} " + " ".join(f"{res[m][d][c]:>14.3f}" for m in MODES for c in ("acc", "in_cap", "len")))
    return res


def main() -> None:
    global RECIPE, STEPS, EVAL_EVERY, CAPS, K, MK

    def own(p):
        p.add_argument("--setting", choices=list(SETTINGS), default="lab")
        p.add_argument("--arms", nargs="+", default=["think_modes", "grpo_lg", "grpo"], help="the arms to run")
        p.add_argument("--mode-check", action="store_true", help="only measure each forced mode at the warm start")
    args = harness.cli_args(__doc__.splitlines()[0], own)
    RECIPE, STEPS, EVAL_EVERY, CAPS, K = SETTINGS[args.setting]
    MK = f"mean@{K}"
    name = "think_modes" if args.setting == "lab" else f"think_modes_{args.setting}"
    out = Path(args.out) if args.out else harness.OUT / name
    if args.mode_check:
        mode_check(out)
        return
    BUDGET[0] = args.steps or STEPS
    plan = {arm: o for arm, o in arms(BUDGET[0]).items() if arm in args.arms}
    if not args.report_only:  # seed-major order, so a cut-short experiment still has every arm at the early seeds
        for seed in args.seeds:
            harness.run_arms(name, RECIPE, plan, argparse.Namespace(**{**vars(args), "seeds": [seed]}))
    plan = {arm: o for arm, o in arms(BUDGET[0]).items()
            if all((out / f"{arm}-s{s}" / "summary.json").exists() for s in args.seeds)}  # the arms that finished
    runs = harness.run_arms(name, RECIPE, plan, argparse.Namespace(**{**vars(args), "report_only": True}))
    if not {"think_modes", "grpo_lg"} <= set(runs):
        sys.exit(f"{out}: the report needs think_modes and grpo_lg finished for seeds {args.seeds}")
    cols = [MK, MK + " capped", "greedy", "length", "mode entropy", "share <NT>", "share <SH>",
            "share <LG>", "share invalid"]
    finals = {arm: [per_run(r) for r in dirs] for arm, dirs in runs.items()}
    rows = {arm: {c: harness.agg([f[c] for f in fs]) for c in cols} for arm, fs in finals.items()}
    # warm start, free tag (think_modes' step-0 eval: the same weights, eval seed and uncapped sampling as grpo's)
    # and forced to <LG> (grpo_lg's step-0 eval)
    before = {arm: {c: harness.agg([per_run_before(r)[c] for r in runs[arm]]) for c in (MK, "length")}
              for arm in ("think_modes", "grpo_lg")}
    n_eval = len(harness.eval_samples(runs["grpo_lg"][0], 0)) // K
    lines = [f"# Adaptive think modes, {RECIPE}: {len(args.seeds)} seeds x {BUDGET[0]} steps\n",
             f"Final held-out eval ({n_eval} problems, {K} samples at T=1); mean ± std [min, max] over seeds. grpo_lg "
             "is evaluated forced to <LG> (eval.forced_prefix), the others sample their tag.\n",
             harness.table(rows, cols)]
    for arm, what in (("think_modes", "free tag"), ("grpo_lg", "forced <LG>")):
        lines.append(f"\nWarm start (step 0, {what}): {MK} {harness.fmt(before[arm][MK])}, "
                     f"length {harness.fmt(before[arm]['length'], 1)}.")
    ref = rows["grpo_lg"]
    lg = ref["length"]["mean"]
    lines.append("")
    for arm in [a for a in ("think_modes", "grpo") if a in runs]:
        lines.append(f"- {arm}: length {100 * (rows[arm]['length']['mean'] / lg - 1):+.1f}% vs grpo_lg (forced <LG>); "
                     f"{MK} {100 * (rows[arm][MK]['mean'] - ref[MK]['mean']):+.1f} points "
                     f"(capped: {100 * (rows[arm][MK + ' capped']['mean'] - ref[MK]['mean']):+.1f})")
    lines.append(f"- ln 3 = {math.log(3):.3f}; pass threshold 0.8·ln 3 = {0.8 * math.log(3):.3f}\n")
    for arm in runs:
        lines.append(f"\n## {arm}: final eval by #operations (pooled over seeds)\n")
        lines.append(f"| ops | share <NT> | share <SH> | share <LG> | invalid | {MK} | length |\n"
                     "|---|---|---|---|---|---|---|")
        for d, v in by_difficulty(runs[arm]).items():
            lines.append(f"| {d} | {v['<NT>']:.3f} | {v['<SH>']:.3f} | {v['<LG>']:.3f} | {v['invalid']:.3f} | "
                         f"{v['acc']:.3f} | {v['len']:.1f} |")
        lines.append(f"\n## {arm}: final eval by mode (pooled over seeds)\n")
        lines.append(f"| mode | samples | {MK} | {MK} capped | length | mean #ops |\n|---|---|---|---|---|---|")
        for m, v in by_mode(runs[arm]).items():
            lines.append(f"| {m} | {v['n']} | {v['acc']:.3f} | {v['acc capped']:.3f} | {v['len']:.1f} | "
                         f"{v['difficulty']:.2f} |")
    steps, held = share_curves(runs["think_modes"])
    lines.append("\n## think_modes: held-out mode shares over training (mean over seeds)\n")
    lines.append("| step | " + " | ".join(MODES) + " |\n|---|---|---|---|")
    lines += [f"| {s} | " + " | ".join(f"{held[m][i]:.3f}" for m in MODES) + " |" for i, s in enumerate(steps)]
    for key, what in (("eval/mean_at_k", MK), ("eval/len_mean", "length")):
        lines.append(f"\n## Held-out {what} along training\n\n" + harness.eval_curve(runs, key, BUDGET[0]))
    pngs = plots(runs, out)
    lines.append("\nPlots: " + ", ".join(p.name for p in pngs))
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def per_run_before(run: Path) -> dict[str, float]:
    recs = harness.eval_samples(run, 0)
    return {MK: statistics.fmean(r["correct"] for r in recs),
            "length": statistics.fmean(r["length"] for r in recs)}


if __name__ == "__main__":
    main()
