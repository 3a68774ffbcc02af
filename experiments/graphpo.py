"""GraphPO (arXiv:2606.18954): at an equal generated-token budget, do graph rollouts with merged states find more
distinct states per token, give lower-variance step advantages, and train to at least the tree's accuracy with
shorter correct paths than chains (GRPO) and trees?

Paper claim: GraphPO beats DAPO and tree methods (PROS, TreeRL) on math benchmarks with the shortest responses;
merging equivalent states lowers the variance of advantage estimates. Spec §8 acceptance (scaled to the lab): arms at
equal generated-token budget: GRPO chains, tree rollouts (no merging), GraphPO with exact merging, GraphPO with
hashed-feature embeddings (κ = 0.92). Pass: GraphPO ≥ tree on accuracy, strictly more unique states per token,
lower advantage variance, shorter correct paths than both baselines.

Setting, fixed before any GraphPO training run (recipes/graphpo_lab.yaml = grpo_lab.yaml's task and warm start:
three additions mod 10, wrapping steps off by one 60% of the time): 16 prompts per step, 48 tokens, lr 1e-4,
40 steps (80 for GRPO in docs/results.md; halved so that 12 runs fit a 40-minute single-core budget), eval every
20 steps on 128 held-out problems (mean@4, greedy). Budget: chains are G = 8 samples; the graph arms have W = 8 leaf
slots and one child per slot (the same rows per round as 8 chains); the tree has ``branch`` 2 and W = ``--tree-width``
leaf slots, chosen from the probe's token counts at the warm start (no training result was looked at) so that its
sampled tokens per problem match the chains'. Every arm's sampled tokens per step are reported.

Probe (``--probe``, at the warm start, the same policy for every arm): 32 held-out problems, ``--resamples`` builds of
each arm's rollouts (fresh seeds). Unique states per 1k tokens: distinct lab states (step index, running value; the
final answer) over every sample's step prefixes, per problem and build, over the sampled tokens of that build
(the generator's own count). Advantage variance: the per-token advantage the update would use on each step (edge)
identified by its (state before, state after), per problem; for each such step seen in two or more builds, the
variance across builds (ddof 1) of its mean advantage; averaged over steps.

    PYTHONPATH=src python experiments/graphpo.py --probe            # tokens, states/1k, advantage variance
    PYTHONPATH=src python experiments/graphpo.py --probe --calibrate --probe-arms grpo  # + tree tokens, W = 12..16
    PYTHONPATH=src python experiments/graphpo.py --jobs 1           # 4 arms x 3 seeds, then the report

Headroom setting (issue 30; written 2026-12-05 before any GraphPO run on it): ``--setting headroom`` runs
``recipes/graphpo_headroom_lab.yaml`` = the third setting (``recipes/headroom_unseen_lab.yaml``: 2-12-step chains,
the warm start taught 2-6, 23-128-token completions with re-checks and loops) at its own budget: 80 steps x 16
prompts, 128 tokens, lr 1e-4, evals at 0 / 40 / 80 on 132 held-out problems (mean@8, pass@8, greedy, length of
correct answers). Arms grpo (the setting's GRPO runs, reused), tree (width from ``--probe --calibrate`` at this warm
start, to match the chains' sampled tokens per problem, chosen before its runs) and graphpo (exact merging, W = 8);
seeds 0, 1, 2. Expectations: (1) more distinct states per 1k tokens than the tree (as on the first lab); (2) correct
held-out answers shorter than GRPO's and the tree's: here paths reach the same state with and without re-checks and
loops, so the efficiency term (μ = 1) has length to remove, which the first lab's fixed 29-token traces did not;
(3) accuracy: no direction held with confidence (on the first lab GraphPO was below GRPO, 0.361 vs 0.430); the
claim's "≥ the tree" is the criterion, and a clear difference only where the seed ranges do not overlap.

    PYTHONPATH=src python experiments/graphpo.py --setting headroom --probe --calibrate --probe-arms grpo graphpo
    PYTHONPATH=src python experiments/graphpo.py --setting headroom --arms grpo tree graphpo --jobs 1  # tree W = 10
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

SETTINGS = {  # setting -> (experiment, recipe, overrides of every arm, tree width, widths `--calibrate` tries)
    # `--probe --calibrate` at the warm start: W = 14 / 15 sample 226 / 235 tokens per problem, chains 232
    "lab": ("graphpo", "recipes/graphpo_lab.yaml",
            ["trainer.steps=40", "trainer.save_every=0", "trainer.sinks=[jsonl]", "eval.every=20"], 15,
            (12, 13, 14, 15, 16)),
    # the headroom lab's third setting, at its own budget (80 steps, evals at 0 / 40 / 80); `--probe --calibrate`
    # before any training run on it: chains 544 tokens per problem, the tree 473 / 520 / 539 / 573 / 593 at
    # W = 8 / 9 / 10 / 11 / 12 (638-787 at 14-22), graphpo (W = 8) 547: W = 10
    "headroom": ("graphpo_headroom", "recipes/graphpo_headroom_lab.yaml",
                 ["trainer.save_every=0", "trainer.sinks=[jsonl]"], 10, (8, 9, 10, 11, 12, 14, 16, 18, 20, 22)),
}
HEADROOM_GRPO = harness.OUT / "headroom_unseen_lab"  # the GRPO runs of experiments/headroom_lab.py on that recipe
PROBE_ONLY = {"graphpo_w0": ["credit=[{name: graphpo, w: 0.0, mu: 1.0}]"],  # pooling ablations, probe only
              "graphpo_w1": ["credit=[{name: graphpo, w: 1.0, mu: 1.0}]"]}


def arms(tree_width: int) -> dict[str, list[str]]:
    return {
        "grpo": ["rollout.builder={name: standard}", "credit=[]"],
        "tree": ["rollout.builder.equivalence=none", "rollout.builder.branch=2", f"rollout.builder.width={tree_width}",
                 "credit=[{name: graphpo, w: 0.0, mu: 1.0}]"],
        "graphpo": [],
        "graphpo_hashed": ["rollout.builder.equivalence=embedding", "rollout.builder.embedder=hashed",
                           "rollout.builder.kappa=0.92"],
        # added after the four arms above had run (an ablation, not a tuned setting): merged classes keep their
        # members' slots, so states are sampled in the policy's proportions, as chains do
        "graphpo_merged": ["rollout.builder.allocation=merged"],
    }


def edge_keys(sample, problem, task, tokenizer) -> list[tuple[int, int, tuple]]:
    """(start, end, (state before, state after)) of every step of a lab completion (a step ends at ';')."""
    ids = sample.completion_ids.tolist()
    semi = tokenizer.convert_tokens_to_ids(";")
    cuts = [i + 1 for i, t in enumerate(ids) if t == semi]
    out, prev, start = [], ("root",), 0
    for c in [*cuts, len(ids)]:
        if c <= start:
            continue
        text = tokenizer.decode(ids[:c], skip_special_tokens=True)
        state = task.canonical_state(problem, text) if c in cuts else ("answer", task.extract_answer(text))
        out.append((start, c, (prev, state)))
        prev, start = state, c
    return out


def probe_arm(recipe: str, overrides: list[str], n_problems: int, resamples: int) -> dict[str, float]:
    import torch

    from groupwise.config import load
    from groupwise.loop.setup import build
    from groupwise.types import ScoredBatch, TokenBatch

    torch.set_num_threads(1)
    p = build(load(recipe, ["trainer.threads=1", *overrides]))
    problems = list(p.task.test[:n_problems])
    per_edge: dict[tuple, list[list[float]]] = {}
    states, tokens = [], []
    for r in range(resamples):
        ctx = p.context(10**6 + r)
        p.generator.reset()
        groups = p.builder(problems, ctx)
        ctx.score(groups)
        tokens.append(p.generator.tokens / n_problems)
        batch = ScoredBatch.from_groups(groups)
        tb = TokenBatch.build(groups, p.advantage(batch))
        for credit in p.credit:
            tb = credit(tb)
        row = 0
        for gi, g in enumerate(groups):
            seen: set = set()
            for s in g.samples:
                for start, _end, key in edge_keys(s, g.problem, p.task, p.tokenizer):
                    seen.add(key[1])
                    if bool(s.loss_mask[start]):
                        per_edge.setdefault((gi, key), [[] for _ in range(resamples)])[r].append(
                            float(tb.advantages[row, start]))
                row += 1
            states.append(1000.0 * len(seen) / max(p.generator.tokens / n_problems, 1))
    variances = [statistics.variance(m) for m in ([statistics.fmean(x) for x in e if x] for e in per_edge.values())
                 if len(m) >= 2]
    return {"tokens/problem": statistics.fmean(tokens), "states/1k tokens": statistics.fmean(states),
            "advantage variance": statistics.fmean(variances), "edges (>=2 builds)": float(len(variances))}


def probe(args) -> None:
    experiment, recipe, _, _, widths = SETTINGS[args.setting]
    out_dir = Path(args.out) if args.out else harness.OUT / experiment
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "probe.json"
    rows = json.loads(path.read_text()) if args.probe_arms and path.exists() else {}
    for arm, ov in {**arms(args.tree_width), **PROBE_ONLY}.items():
        if args.probe_arms and arm not in args.probe_arms:
            continue
        rows[arm] = probe_arm(recipe, ov, 32, args.resamples)
        print(arm, rows[arm], flush=True)
    if args.calibrate:
        for w in args.widths or widths:
            rows[f"tree W={w}"] = probe_arm(recipe, arms(w)["tree"], 32, 2)
            print(f"tree W={w}", rows[f"tree W={w}"], flush=True)
    path.write_text(json.dumps(rows, indent=1))


def probe_table(out_dir: Path) -> str:
    rows = json.loads((out_dir / "probe.json").read_text())
    cols = ["tokens/problem", "states/1k tokens", "advantage variance", "edges (>=2 builds)"]
    head = "| arm | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n"
    return head + "".join(f"| {a} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |\n" for a, r in rows.items())


def main() -> None:
    def own(p):
        p.add_argument("--probe", action="store_true", help="only the warm-start probe (tokens, states, variance)")
        p.add_argument("--calibrate", action="store_true", help="with --probe: tree token counts over widths")
        p.add_argument("--setting", choices=list(SETTINGS), default="lab")
        p.add_argument("--widths", nargs="+", type=int, default=[], help="with --calibrate: these widths only")
        p.add_argument("--resamples", type=int, default=6)
        p.add_argument("--probe-arms", nargs="+", default=[], help="with --probe: only these (merged into probe.json)")
        p.add_argument("--tree-width", type=int, default=0, help="0: the setting's (SETTINGS)")
        p.add_argument("--arms", nargs="+", default=list(arms(0)), help="run / report only these")

    args = harness.cli_args(__doc__.splitlines()[0], own)
    experiment, recipe, common, width, _ = SETTINGS[args.setting]
    args.tree_width = args.tree_width or width
    if args.probe:
        probe(args)
        return
    out_dir = Path(args.out) if args.out else harness.OUT / experiment
    all_arms = arms(args.tree_width)
    for s in args.seeds if args.setting == "headroom" and not args.steps else []:
        harness.reuse(HEADROOM_GRPO / f"grpo-s{s}", recipe, [*common, *all_arms["grpo"], f"seed={s}"],
                      out_dir / f"grpo-s{s}")
    runs = harness.run_arms(experiment, recipe, {k: [*common, *all_arms[k]] for k in args.arms}, args)
    rows = {}
    for arm, dirs in runs.items():
        cells = harness.eval_cells(dirs, ("mean_at_k", "greedy_acc", "len_correct_mean"))
        cells["sampled tokens/problem"] = harness.agg([harness.tail_mean(d, "perf/gen_tokens", 10**9) / 16
                                                       for d in dirs])
        cells["train correct (last 10)"] = harness.agg([harness.tail_mean(d, "reward/correct_frac", 10) for d in dirs])
        cells["s/step"] = harness.agg([harness.tail_mean(d, "perf/step_s", 10**9) for d in dirs])
        if arm != "grpo":  # the builder's own per-step metrics (means over the last 10 steps)
            for key in ("merge_frac", "states_per_1k", "samples"):
                cells[key] = harness.agg([harness.tail_mean(d, f"rollout/graphpo_{key}", 10) for d in dirs])
        rows[arm] = cells
    before = harness.warm_start_eval(runs)
    cols = ["mean_at_k", "greedy_acc", "len_correct_mean", "train correct (last 10)", "sampled tokens/problem",
            "s/step", "merge_frac", "states_per_1k", "samples"]
    plots = [harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc"], out_dir / "eval_curves.png"),
             harness.plot_curves(runs, ["reward/correct_frac", "perf/gen_tokens"], out_dir / "train_curves.png")]
    lines = [f"# {experiment}\n\n", f"Recipe `{recipe}` + each arm's overrides ({' '.join(common)}), seeds "
             f"{args.seeds}; held-out mean@k (T = 1) and greedy, warm start mean@k {harness.fmt(before)}; "
             "`len_correct_mean`: tokens of correct held-out answers; sampled tokens per problem per step (the "
             "generator's count / 16 prompts); `merge_frac`, `states_per_1k`, `samples` (per group): the builder's "
             "metrics over the last 10 steps; train correct is over each arm's samples (a graph's samples are "
             "not i.i.d. rollouts: merged members' continuations repeat leaves, `even` allocation over-samples rare "
             "states), so it is not comparable across arms.\n\n", harness.table(rows, cols),
             "\nHeld-out mean@k at every evaluation:\n\n", harness.eval_curve(runs)]
    if (out_dir / "probe.json").exists():
        lines += ["\nWarm-start probe (`--probe`; 32 held-out problems, builds per arm as in probe.json):\n\n",
                  probe_table(out_dir)]
    harness.write_report(out_dir, lines, plots)


if __name__ == "__main__":
    main()
