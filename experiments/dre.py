"""DRE, Dynamic Rollout Editing (arXiv:2606.17890): the spec's acceptance experiment (specs-09-16.md §9) on the lab.

Claim under test: editing post-answer thinking out of successful rollouts (and training on the edit in its
place) stops GRPO from reinforcing overthinking: the post-answer tail of correct answers shrinks (spec: >= 50%
below GRPO's by the end) and total length falls, at accuracy within ±2 points, with the reasoning before the
answer (pre-emergence tokens) unchanged. The brief's framing: the papers report 30-76% fewer tokens at roughly
equal accuracy.

Setting: recipes/dre_lab.yaml: lab with ``p_wrap_slip: 0.6`` (headroom), ``max_checks: 6`` redundant
``chk <last step>;`` re-checks after the commitment ``so X.`` and ``check_correct_bonus: 1`` (a trace that
ends correct may carry one more: successful rollouts overthink a bit more), 112 completion tokens.

  dre        GRPO + DRE (replace mode, tau_abs 4, tau_rel 0.1, at most G/2 edits per group; text detector, copy)
  dre_probe  the same with the probe detector (greedy forced answer after ``</think><answer>`` at every ``;``/``.``
             boundary, 8 tokens; its probe tokens are in ``gen tokens``)
  dre_regen  the same with ``answer_mode: regen`` (the answer section resampled after the early ``</think>``,
             16 tokens)
  dre_probe_m2  dre_probe with ``m_stable: 2``: t* is the first boundary whose forced answer verifies and the next
             boundary's does too. Hypothesis, written before its runs (2026-12-03): at m_stable 1 the probe cut
             real steps because a forced answer was right by chance one boundary early (a lucky guess rarely
             repeats at the next boundary, a computed answer does), so m_stable 2 should cut fewer steps ("skips
             a step" below m_stable 1's 0.243 at 100 steps) and keep more accuracy (mean@4 above its 0.596).
  grpo  plain GRPO, not rerun here: experiments/out/qlpo/grpo-s{0,1,2} (experiments/qlpo.py's baseline) has
        the identical resolved config apart from its step count and no
        transform; the schedule is constant lr without warm-up and nothing else depends on the step count,
        so its state at step N is the state an N-step run ends in, and it is read at step N here. A seed whose
        qlpo run has not reached step N gets its own identical run (no transform) in the output directory.

Held-out eval (128 problems, mean@4 at T=1, greedy) every 20 steps. From the eval records: post-answer tail =
tokens between the first ``so X.`` whose X is the (correct) final answer and ``</think>``, of correct sampled
answers; pre-emergence = tokens from ``<think>`` to that commitment. Training diagnostics (rollouts as
generated, before editing) are logged by the dre transform, so only the dre arm has them.

Budget: 3 seeds x 40 steps of each dre arm (``--steps 100``: the longer run), run one at a time with one torch thread
(--jobs 1). ``--steps 200 --arms grpo dre dre_probe_m2 --out experiments/out/dre200``: the two arms the 100-step run
recommends at twice the budget (expected, written before the runs: dre's tail of correct answers stays >= 50%
below GRPO's, both arms stay within 2 points of GRPO's mean@4, and the length gap narrows because GRPO keeps
shortening on its own: 61.6 -> 53.1 tokens by step 100).

Usage: PYTHONPATH=src python experiments/dre.py --jobs 1 [--seeds 0 1 2] [--arms ...] [--report-only]
(``--arms`` runs and reports only the arms it names, plus the grpo baseline when ``grpo`` is among them; the
comparison lines need both ``dre`` and ``grpo``.)
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from groupwise.methods.dre import DREConfig, find_span  # noqa: E402
from groupwise.models.tiny import build_tokenizer  # noqa: E402

RECIPE = "recipes/dre_lab.yaml"
STEPS, EVAL_EVERY = 40, 20
COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]", f"eval.every={EVAL_EVERY}", f"trainer.steps={STEPS}"]
DRE = "rollout.transforms=[{name: dre, tau_abs: 4, tau_rel: 0.1, mode: replace"
ARMS = {"dre": COMMON,
        "dre_probe": [*COMMON, DRE + ", detector: probe, probe_max_tokens: 8}]"],
        "dre_regen": [*COMMON, DRE + ", answer_mode: regen, regen_max_tokens: 16}]"],
        "dre_probe_m2": [*COMMON, DRE + ", detector: probe, probe_max_tokens: 8, m_stable: 2}]"]}
BASELINE = harness.OUT / "qlpo"  # grpo-s<seed>: plain GRPO on the identical config, read at step N
BUDGET = [STEPS]
TOK = build_tokenizer()


def eval_steps(run: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in (run / "eval").glob("step_*.jsonl"))


def ntok(text: str) -> int:
    return len(TOK.encode(text, add_special_tokens=False))


def tails(recs: list[dict]) -> dict[str, float]:
    """Post-answer tail and pre-emergence tokens of correct answers (the answer is the record's own)."""
    tail, pre = [], []
    for r in recs:
        if not r["correct"]:
            continue
        span = find_span(r["text"], lambda x, a=r["answer"]: x == a, DREConfig())
        if span is None or span.answer_end is None:
            continue
        tail.append(ntok(r["text"][span.answer_end:span.think_end]))
        pre.append(ntok(r["text"][span.think_start:span.answer_end]))
    return {"tail": statistics.fmean(tail) if tail else 0.0, "pre": statistics.fmean(pre) if pre else 0.0,
            "tail>0": statistics.fmean(t > 0 for t in tail) if tail else 0.0}


def eval_metric(run: Path, key: str, step: int) -> float:
    return next(r[key] for r in harness.metrics(run) if r["step"] == step and key in r)


def skips_a_step(r: dict) -> bool:
    """The eval record writes fewer step results (``=v;``) before its commitment than its problem has steps: the
    reasoning itself was cut, not only the post-answer tail."""
    body = r["text"].split("<think>", 1)[-1].split("so ", 1)[0].split("</think>", 1)[0]
    return len(re.findall(r"=\d+;", body)) < r["difficulty"]


def mean_of(rows: list[dict], key: str) -> float:
    """Mean of ``key`` over the rows that log it (a step with no correct / incorrect rollout logs no tail); NaN if
    none."""
    vals = [r[key] for r in rows if key in r]
    return statistics.fmean(vals) if vals else float("nan")


def per_run(run: Path, step: int | None = None) -> dict[str, float]:
    step = BUDGET[0] if step is None else step
    recs = harness.eval_samples(run, step)
    correct = [r["length"] for r in recs if r["correct"]]
    rows = [r for r in harness.metrics(run) if "perf/step_s" in r and r["step"] <= BUDGET[0]]
    t = tails(recs)
    out = {"mean@4": statistics.fmean(r["correct"] for r in recs),
            "length": statistics.fmean(r["length"] for r in recs),
            "length correct": statistics.fmean(correct) if correct else 0.0, "tail correct": t["tail"],
            "pre-answer": t["pre"], "share with tail": t["tail>0"],
            "skips a step": statistics.fmean(skips_a_step(r) for r in recs),
            "greedy": eval_metric(run, "eval/greedy_acc", step),
            "edited frac": statistics.fmean(r.get("rollout/dre_edited_frac", 0.0) for r in rows),
            "gen tokens": rows[-1]["perf/gen_tokens_total"]}
    if "rollout/dre_tail_correct" in rows[0]:  # logged by the dre transform (the dre arm only)
        out.update({f"train tail {c} ({part})": mean_of(sel, f"rollout/dre_tail_{key}")
                    for c, key in (("c", "correct"), ("i", "incorrect"))
                    for part, sel in (("first 10", rows[:10]), ("last 10", rows[-10:]))})
    return out


def tail_curve(runs: dict[str, list[Path]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for arm, dirs in runs.items():
        steps = [s for s in eval_steps(dirs[0]) if s <= BUDGET[0]]
        axes[0].plot(steps, [statistics.fmean(tails(harness.eval_samples(d, s))["tail"] for d in dirs) for s in steps],
                     marker="o", label=arm)
        if not any("rollout/dre_tail_correct" in r for r in harness.metrics(dirs[0])):
            continue
        xs, ys = harness.curves({arm: dirs}, "rollout/dre_tail_correct")[arm]
        axes[1].plot(xs, [statistics.fmean(ys[max(0, i - 9):i + 1]) for i in range(len(ys))], label=f"{arm} correct")
        xs, ys = harness.curves({arm: dirs}, "rollout/dre_tail_incorrect")[arm]
        axes[1].plot(xs, [statistics.fmean(ys[max(0, i - 9):i + 1]) for i in range(len(ys))], ls="--",
                     label=f"{arm} incorrect")
    axes[0].set_title("held-out: post-answer tail tokens of correct answers", fontsize=9)
    axes[1].set_title("training rollouts (before editing): tail after first 'so X.'", fontsize=9)
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "tails.png", dpi=110)
    plt.close(fig)
    return out / "tails.png"


def main() -> None:
    def own(p):
        p.add_argument("--arms", nargs="+", default=["grpo", *ARMS], choices=["grpo", *ARMS],
                       help="run / report only these")

    args = harness.cli_args(__doc__.splitlines()[0], own)
    BUDGET[0] = args.steps or STEPS
    runs = harness.run_arms("dre", RECIPE, {k: ARMS[k] for k in args.arms if k != "grpo"}, args)
    out = Path(args.out) if args.out else harness.OUT / "dre"
    baseline = []
    # the qlpo baseline run, or where it has not reached step N, our own identical run
    for s in args.seeds if "grpo" in args.arms else []:
        run = BASELINE / f"grpo-s{s}"
        if not (run / "eval" / f"step_{BUDGET[0]}.jsonl").exists():
            run = out / f"grpo-s{s}"
            if not args.report_only:
                harness.run_one(RECIPE, [*COMMON, "rollout.transforms=[]", f"seed={s}", f"trainer.steps={BUDGET[0]}"],
                                out, run.name, out / "logs" / f"{run.name}.log")
        baseline.append(run)
    runs = {"grpo": baseline, **runs} if baseline else runs
    print("grpo baseline runs: " + (", ".join(str(r) for r in baseline) or "(not requested)"), flush=True)
    finals = {arm: [per_run(r) for r in dirs] for arm, dirs in runs.items()}
    cols = ["mean@4", "greedy", "length", "length correct", "tail correct", "pre-answer", "share with tail",
            "skips a step"]
    train_cols = ["edited frac", "train tail c (first 10)", "train tail c (last 10)", "train tail i (first 10)",
                  "train tail i (last 10)", "gen tokens"]
    rows = {arm: {c: harness.agg([f[c] for f in fs]) for c in cols + train_cols if c in fs[0]}
            for arm, fs in finals.items()}
    start = [per_run(r, 0) for r in next(iter(runs.values()))]  # step 0: the shared warm start
    base = {c: harness.agg([s[c] for s in start]) for c in ("mean@4", "length", "tail correct", "pre-answer")}
    lines = [f"# DRE on the lab: {len(args.seeds)} seeds x {args.steps or STEPS} steps\n",
             "grpo runs: " + (", ".join(str(r.relative_to(harness.ROOT)) for r in baseline) or "(not requested)")
             + "\n",
             "Final held-out eval (128 problems, 4 samples at T=1; tail/pre-answer over correct sampled answers); "
             "mean ± std [min, max] over seeds.\n", harness.table(rows, cols, 3),
             "\nTraining (rollouts as generated, before editing; `gen tokens` = tokens in the step's groups, edits "
             "counted at their edited length):\n", harness.table(rows, train_cols, 3),
             f"\nWarm start (step 0): mean@4 {harness.fmt(base['mean@4'])}, length {harness.fmt(base['length'], 1)}, "
             f"tail {harness.fmt(base['tail correct'], 1)}, pre-answer {harness.fmt(base['pre-answer'], 1)}.\n"]
    if "grpo" in rows and "dre" in rows:
        g, d = rows["grpo"], rows["dre"]
        lines.append(
            f"- DRE vs GRPO: tail of correct answers "
            f"{100 * (d['tail correct']['mean'] / max(g['tail correct']['mean'], 1e-9) - 1):+.1f}%, "
            f"length {100 * (d['length']['mean'] / g['length']['mean'] - 1):+.1f}%, "
            f"mean@4 {100 * (d['mean@4']['mean'] - g['mean@4']['mean']):+.1f} points, "
            f"pre-answer tokens {d['pre-answer']['mean'] - g['pre-answer']['mean']:+.1f}")
    for key, what in (("eval/mean_at_k", "mean@4"), ("eval/len_mean", "length")):
        lines.append(f"\nHeld-out {what} along training:\n\n" + harness.eval_curve(runs, key, BUDGET[0]))
    pngs = [harness.plot_curves(runs, ["eval/mean_at_k", "eval/len_mean", "eval/len_correct_mean"], out / "curves.png"),
            tail_curve(runs, out)]
    lines.append("\nPlots: " + ", ".join(p.name for p in pngs))
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
