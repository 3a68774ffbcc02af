"""DASH-OPSD (arXiv:2608.06243): do divergence-adaptive supervision horizons beat vanilla on-policy
self-distillation, with no extra forward pass?

Paper claim: on Qwen3 1.7B-8B, DASH beats vanilla OPSD (macro Avg@12 41.87 -> 45.07 at 1.7B); a fixed λ
already beats OPSD, the adaptive λ beats the best fixed λ, the adaptive profile still helps after matching
the weight scale, and the inverted gate hurts. Spec §3 acceptance (scaled): arms GRPO, vanilla OPSD, DASH
(κ = 5), DASH scale-matched, inverted gate, fixed λ 0.5 / 0.9; 300 steps, 3 seeds; pass if DASH ≥ vanilla
OPSD on held-out Mean@8 at equal steps with no increase in forward passes, and inverted ≤ DASH.

Setting, fixed before any distillation run (recipes/dash_opsd_lab.yaml): the demo's chains (three additions
mod 10, wrapping steps off by one in 60% of warm-start traces) from a 400-step warm start in which half the
examples show the problem with its clean reference trace in `<ref>` tags (`task.privileged_frac: 0.5`).
Checked before the main runs: on 128 held-out chains the warm-started student (plain prompt) has mean@4
0.33 / greedy 0.17, the same model shown the reference 0.994 / 1.00, so the frozen privileged teacher
knows what the student does not. 16 prompts x 8 samples, 48 tokens, lr 1e-4 for every arm, eval every 50
steps on 128 held-out problems with k = 8 (Mean@8) and greedy. The distillation arms have no reward term in
the loss (OPSD is reward-free); GRPO uses the binary correctness reward and ppo_clip.

    PYTHONPATH=src python experiments/dash_opsd.py --check-teacher     # the warm start, student vs teacher view
    PYTHONPATH=src python experiments/dash_opsd.py --jobs 2            # grpo, opsd, dash, dash_inverted
    PYTHONPATH=src python experiments/dash_opsd.py --jobs 2 --all-arms # + scale-matched, fixed λ 0.5 / 0.9
    PYTHONPATH=src python experiments/dash_opsd.py --more fixed_0.5    # + one of them
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

EXPERIMENT = "dash_opsd"
RECIPE = "recipes/dash_opsd_lab.yaml"
COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]"]
OPSD = "loss.terms=[{name: opsd, beta: 0.0, token_clip: 0.05, support: vocab}]"  # DASH's divergence, λ ≡ 0
ARMS = {
    "grpo": ["loss.terms=[ppo_clip]", "teacher=none"],
    "opsd": [OPSD],
    "dash": [],
    "dash_inverted": ["loss.terms.0.gate_sign=-1"],
}
MORE = {
    "dash_scale": ["loss.terms.0.scale_match=true"],
    "fixed_0.5": ["loss.terms.0.gate=fixed", "loss.terms.0.fixed_lambda=0.5"],
    "fixed_0.9": ["loss.terms.0.gate=fixed", "loss.terms.0.fixed_lambda=0.9"],
}


def check_teacher() -> None:
    """Held-out mean@4 / greedy of the warm start on plain prompts (the student) and with the reference in
    the prompt (the frozen privileged teacher's view), before any distillation run."""
    import torch

    from groupwise.config import load
    from groupwise.eval import evaluate
    from groupwise.loop.setup import build
    from groupwise.teachers import PRIVILEGED_CONTEXT, privileged_problem

    torch.set_num_threads(1)
    p = build(load(RECIPE, ["trainer.threads=1"]))
    problems = list(p.task.test[:128])
    for name, ps in (("student, plain prompt", problems),
                     ("teacher view, problem + reference",
                      [privileged_problem(x, PRIVILEGED_CONTEXT) for x in problems])):
        m, _ = evaluate(p.generator, p.tokenizer, p.task, ps, p.encode, k=4, temperature=1.0, max_tokens=48,
                        verify=p.reward.check)
        print(f"{name}: mean@4 {m['eval/mean_at_k']:.3f}  greedy {m['eval/greedy_acc']:.3f}", flush=True)


def main() -> None:
    def own(p):
        p.add_argument("--all-arms", action="store_true")
        p.add_argument("--more", nargs="+", default=[], choices=list(MORE), help="add only these of the extra arms")
        p.add_argument("--check-teacher", action="store_true", help="only measure what the teacher knows")

    args = harness.cli_args(__doc__.splitlines()[0], own)
    if args.check_teacher:
        check_teacher()
        return
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    arms = {k: [*COMMON, *v]
            for k, v in {**ARMS, **{k: MORE[k] for k in (MORE if args.all_arms else args.more)}}.items()}
    runs = harness.run_arms(EXPERIMENT, RECIPE, arms, args)
    rows = {}
    for arm, dirs in runs.items():
        cells = harness.eval_cells(dirs, ("mean_at_k", "greedy_acc", "pass_at_k", "len_mean"))
        cells["train_correct(tail20)"] = harness.agg([harness.tail_mean(d, "reward/correct_frac") for d in dirs])
        cells.update(harness.cost_cells(dirs))
        rows[arm] = cells
    before = statistics.fmean(harness.summary(r)["before"]["eval/mean_at_k"] for r in runs["grpo"])
    cols = ["mean_at_k", "greedy_acc", "pass_at_k", "len_mean", "train_correct(tail20)", "forwards/step", "s/step"]
    plots = [harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc"], out_dir / "eval_curves.png"),
             harness.plot_curves(runs, ["reward/correct_frac", "loss/opsd_div", "loss/dash_weight_mean"],
                                 out_dir / "train_curves.png")]
    lines = [f"# {EXPERIMENT}\n\n", f"Recipe `{RECIPE}`, seeds {args.seeds}; held-out Mean@8 (k = 8, T = 1), greedy "
             f"and pass@8 on 128 problems. Held-out Mean@8 at the warm start: {before:.3f}.\n\n",
             harness.table(rows, cols)]
    lines += ["\nHeld-out Mean@8 at every evaluation (the curve as numbers; the criterion is the final column):\n\n",
              harness.eval_curve(runs)]
    harness.write_report(out_dir, lines, plots)


if __name__ == "__main__":
    main()
