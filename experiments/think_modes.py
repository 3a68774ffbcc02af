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
  grpo_lg      GRPO forced to <LG> (the think_modes builder with only <LG> allowed, correctness reward)
  think_modes  the method: mode token sampled after a 10-step forced warm-up, caps, think_mode reward,
               dr_grpo + mode_balance (β_bal 0.1)

Held-out eval (128 problems, mean@4 at T=1, greedy) every 25 steps. The eval samples without per-mode caps;
``mean@4 capped`` re-grades the same records with the caps (a completion longer than its mode's cap is
wrong), which is what capped generation would give. Mode of a completion = its first tag.

Budget: 3 arms x seeds x 50 steps, run one at a time with one torch thread (--jobs 1), seed-major order.
grpo-s0 and grpo-s1 were first run for 100 steps; they are read at step 50 (constant lr, no warm-up: the state
at step 50 of a longer run is the state a 50-step run ends in).

Usage: PYTHONPATH=src python experiments/think_modes.py --jobs 1 [--seeds 0 1 2] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

RECIPE = "recipes/think_modes_lab.yaml"
STEPS, EVAL_EVERY = 50, 25
MODES = ("<NT>", "<SH>", "<LG>")
CAPS = {"<NT>": 8, "<SH>": 22, "<LG>": 39}  # as in the recipe (LG = max_completion_tokens - 1)
COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]", f"eval.every={EVAL_EVERY}", f"trainer.steps={STEPS}"]
GRPO = ["reward.terms=[{name: correctness}]", "advantage=grpo", "advantage_transforms=[]"]
ARMS = {  # run in this order (the method and its spec baseline first)
    "think_modes": COMMON,
    "grpo_lg": [*COMMON, "rollout.builder={name: think_modes, modes: [<LG>], cap_sh: 22, warmup_steps: 0}", *GRPO],
    "grpo": [*COMMON, "rollout.builder={name: standard}", *GRPO],
}
BUDGET = [STEPS]  # the step compared (set from --steps); longer runs are read at this step


def mode_of(text: str) -> str:
    return next((m for m in MODES if text.startswith(m)), "invalid")


def within_cap(r: dict) -> bool:
    m = mode_of(r["text"])
    return m in CAPS and r["finish_reason"] == "stop" and r["length"] <= CAPS[m] + 1


def records(run: Path, step: int) -> list[dict]:
    path = run / "eval" / f"step_{step}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip() and not json.loads(x)["greedy"]]


def final_step(run: Path) -> int:
    """The last eval step within the budget. The schedule is constant lr without warm-up, so a longer run's
    state at step N is the state an N-step run ends in (earlier 100-step grpo runs are read at step N)."""
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
    recs = records(run, final_step(run))
    sh = shares(recs)
    out = {"mean@4": statistics.fmean(r["correct"] for r in recs),
           "mean@4 capped": statistics.fmean(r["correct"] and within_cap(r) for r in recs),
           "greedy": eval_metric(run, "eval/greedy_acc", final_step(run)), "length": statistics.fmean(r["length"] for r in recs),
           "mode entropy": entropy(sh), **{f"share {m}": sh[m] for m in (*MODES, "invalid")}}
    return out


def by_difficulty(runs: list[Path]) -> dict[int, dict[str, float]]:
    """Final-eval mode shares per difficulty, pooled over seeds."""
    recs = [r for run in runs for r in records(run, final_step(run))]
    out = {}
    for d in sorted({r["difficulty"] for r in recs}):
        rows = [r for r in recs if r["difficulty"] == d]
        out[d] = {**shares(rows), "acc": statistics.fmean(r["correct"] for r in rows),
                  "len": statistics.fmean(r["length"] for r in rows)}
    return out


def by_mode(runs: list[Path]) -> dict[str, dict[str, float]]:
    recs = [r for run in runs for r in records(run, final_step(run))]
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
    curves = {m: [statistics.fmean(shares(records(run, s))[m] for run in runs) for s in steps] for m in MODES}
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


def main() -> None:
    args = harness.cli_args(__doc__.splitlines()[0])
    BUDGET[0] = args.steps or STEPS
    if not args.report_only:  # seed-major order, so a cut-short experiment still has every arm at the early seeds
        for seed in args.seeds:
            harness.run_arms("think_modes", RECIPE, ARMS, argparse.Namespace(**{**vars(args), "seeds": [seed]}))
    runs = harness.run_arms("think_modes", RECIPE, ARMS, argparse.Namespace(**{**vars(args), "report_only": True}))
    out = Path(args.out) if args.out else harness.OUT / "think_modes"
    cols = ["mean@4", "mean@4 capped", "greedy", "length", "mode entropy", "share <NT>", "share <SH>",
            "share <LG>", "share invalid"]
    finals = {arm: [per_run(r) for r in dirs] for arm, dirs in runs.items()}
    rows = {arm: {c: harness.agg([f[c] for f in fs]) for c in cols} for arm, fs in finals.items()}
    # the eval samples the mode tag freely; grpo_lg never trained its tag, so its policy "forced to <LG>" is read
    # from its <LG>-tagged eval samples (the completion after <LG> is sampled from exactly pi(. | <LG>))
    lg_only = [lg_samples(r) for r in runs["grpo_lg"]]
    rows["grpo_lg, <LG> samples"] = {c: harness.agg([f[c] for f in lg_only]) for c in ("mean@4", "length")}
    before = {c: harness.agg([per_run_before(r)[c] for r in runs["grpo"]]) for c in ("mean@4", "length")}
    lines = [f"# Adaptive think modes on the lab: {len(args.seeds)} seeds x {args.steps or STEPS} steps\n",
             "Final held-out eval (128 problems, 4 samples at T=1); mean ± std [min, max] over seeds.\n",
             harness.table(rows, cols), f"\nWarm start (step 0): mean@4 {harness.fmt(before['mean@4'])}, "
             f"length {harness.fmt(before['length'], 1)}.\n"]
    ref = rows["grpo_lg, <LG> samples"]
    lg = ref["length"]["mean"]
    for arm in ("think_modes", "grpo"):
        lines.append(f"- {arm}: length {100 * (rows[arm]['length']['mean'] / lg - 1):+.1f}% vs grpo_lg's <LG> samples; "
                     f"mean@4 {100 * (rows[arm]['mean@4']['mean'] - ref['mean@4']['mean']):+.1f} points "
                     f"(capped: {100 * (rows[arm]['mean@4 capped']['mean'] - ref['mean@4']['mean']):+.1f})")
    lines.append(f"- ln 3 = {math.log(3):.3f}; pass threshold 0.8·ln 3 = {0.8 * math.log(3):.3f}\n")
    for arm in ("think_modes", "grpo", "grpo_lg"):
        lines.append(f"\n## {arm}: final eval by #operations (pooled over seeds)\n")
        lines.append("| ops | share <NT> | share <SH> | share <LG> | invalid | mean@4 | length |\n|---|---|---|---|---|---|---|")
        for d, v in by_difficulty(runs[arm]).items():
            lines.append(f"| {d} | {v['<NT>']:.3f} | {v['<SH>']:.3f} | {v['<LG>']:.3f} | {v['invalid']:.3f} | "
                         f"{v['acc']:.3f} | {v['len']:.1f} |")
        lines.append(f"\n## {arm}: final eval by mode (pooled over seeds)\n")
        lines.append("| mode | samples | mean@4 | mean@4 capped | length | mean #ops |\n|---|---|---|---|---|---|")
        for m, v in by_mode(runs[arm]).items():
            lines.append(f"| {m} | {v['n']} | {v['acc']:.3f} | {v['acc capped']:.3f} | {v['len']:.1f} | "
                         f"{v['difficulty']:.2f} |")
    steps, held = share_curves(runs["think_modes"])
    lines.append("\n## think_modes: held-out mode shares over training (mean over seeds)\n")
    lines.append("| step | " + " | ".join(MODES) + " |\n|---|---|---|---|")
    lines += [f"| {s} | " + " | ".join(f"{held[m][i]:.3f}" for m in MODES) + " |" for i, s in enumerate(steps)]
    pngs = plots(runs, out)
    lines.append("\nPlots: " + ", ".join(p.name for p in pngs))
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def lg_samples(run: Path) -> dict[str, float]:
    recs = [r for r in records(run, final_step(run)) if mode_of(r["text"]) == "<LG>"]
    return {"mean@4": statistics.fmean(r["correct"] for r in recs), "length": statistics.fmean(r["length"] for r in recs)}


def per_run_before(run: Path) -> dict[str, float]:
    recs = records(run, 0)
    return {"mean@4": statistics.fmean(r["correct"] for r in recs), "length": statistics.fmean(r["length"] for r in recs)}


if __name__ == "__main__":
    main()
