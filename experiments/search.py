"""Multi-turn tool use on the search task: does GRPO through the tool loop learn to search, and what does HDR's
replay save in wall-clock per step when every search costs a tool round trip?

Setting, fixed before the runs (recipes/search_lab.yaml): 1-2 hop questions about people of a procedural
knowledge base, answerable only with the BM25 search tool (held-out questions are about held-out people);
the warm start (600 SFT steps) is the reference episodes, half of them replaced by an immediate guess
(``task.p_guess: 0.5``), the removable flaw. Checked before: with ``p_guess: 0`` the same warm start answers
0.88 of held-out questions (mean@4) by searching, so the tool loop and the task can be learned by this model.
16 prompts x 8 samples, up to 3 model turns of 32 tokens, 160 tokens in all, lr 1e-4, 80 steps, held-out
eval every 20 steps on the 96 test questions (k = 4).

  main      GRPO through the tool loop, 3 seeds: held-out mean@4 / greedy, and the share of rollouts that
            search (rollout/tool_calls, training).
  latency   seed 0, 6 steps, ``task.tool_latency_s = 0.05`` (a 50 ms round trip per search, 8 concurrent):
            GRPO with 16 prompts, GRPO with 24 prompts (the larger fresh batch) and HDR (16 fresh + up to 8
            replayed groups, recipes/hdr_lab.yaml's replay settings); wall-clock per step, searches per step.
            The model is loaded from the main phase's warm-start directory (the latency knob is part of the
            task config and would otherwise key a second warm start).
  latency_full  (issue 14; setting fixed before its runs) the same three arms and 50 ms round trip over whole
            runs: seeds 0 1 2, the recipe's 80 steps each, held-out eval every 10 steps (outside the wall-clock).
            Target = grpo24's final held-out mean@4 (mean over its seeds). Reported: final mean@4, measured
            wall-clock (every step's time, tool round trips included), searches and generated tokens in all, and
            the wall-clock and generated tokens at which each seed first reaches the target (linear between
            evals). Run with ``--phase latency_full``; not part of ``all``.

    PYTHONPATH=src python experiments/search.py --check-warm-start   # the check above
    PYTHONPATH=src python experiments/search.py --jobs 1 [--phase main|latency|all|latency_full] [--report-only]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

EXPERIMENT, RECIPE = "search", "recipes/search_lab.yaml"
COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]"]
HDR = "replay={name: hdr, capacity: 64, replay_groups: 8, tau: 0.001}"
LATENCY_S, LATENCY_STEPS = 0.05, 6
LATENCY_ARMS = {"grpo16": [], "grpo24": ["rollout.prompts_per_step=24"], "hdr": [HDR]}
FULL_EVAL_EVERY = 10


def warm_start_dir() -> Path:
    from groupwise.config import load
    from groupwise.models.warm_start import ensure_warm_start
    from groupwise.registry import BuildEnv

    cfg = load(RECIPE)
    task = cfg.task.build(BuildEnv(run=cfg, seed=cfg.seed))
    return ensure_warm_start(cfg.model.path.split(":", 1)[1], task, cfg.model)


def main_phase(args) -> list[str]:
    runs = harness.run_arms(EXPERIMENT, RECIPE, {"grpo": COMMON}, args)
    dirs = runs["grpo"]
    rows = {"warm start (step 0)": {k: harness.agg([harness.summary(d)["before"][f"eval/{k}"] for d in dirs])
                                    for k in ("mean_at_k", "greedy_acc", "len_mean")},
            "grpo": harness.eval_cells(dirs)}
    for name, cells in rows.items():
        head = name != "grpo"
        get = harness.head_mean if head else harness.tail_mean
        cells["searches/rollout"] = harness.agg([get(d, "rollout/tool_calls", 10) for d in dirs])
        cells["train correct"] = harness.agg([get(d, "reward/correct_frac", 10) for d in dirs])
    rows["warm start (step 0)"]["s/step"] = harness.agg([harness.head_mean(d, "perf/step_s", 10) for d in dirs])
    rows["grpo"]["s/step"] = harness.agg([harness.tail_mean(d, "perf/step_s", 10) for d in dirs])
    cols = ["mean_at_k", "greedy_acc", "len_mean", "searches/rollout", "train correct", "s/step"]
    plot = harness.plot_curves(runs, ["eval/mean_at_k", "rollout/tool_calls", "reward/correct_frac"],
                               (Path(args.out) if args.out else harness.OUT / EXPERIMENT) / "curves.png")
    return [f"## main: GRPO through the tool loop (seeds {args.seeds})\n\n", "Training columns: steps 1-10 for the "
            "warm-start row, the last 10 steps for grpo.\n\n", harness.table(rows, cols),
            "\nHeld-out mean@4 at every evaluation:\n\n", harness.eval_curve(runs), f"\n![curves]({plot.name})\n"]


def latency_phase(args) -> list[str]:
    extra = [*COMMON, f"model.path={warm_start_dir()}", f"task.tool_latency_s={LATENCY_S}",
             f"trainer.steps={LATENCY_STEPS}", "eval.before=false", "eval.after=false", "eval.every=0"]
    lat = argparse_like(args, seeds=[0])
    runs = harness.run_arms(EXPERIMENT, RECIPE, {f"latency_{a}": [*extra, *ov] for a, ov in LATENCY_ARMS.items()}, lat)
    rows = {}
    for arm, (d,) in runs.items():
        m = [r for r in harness.metrics(d) if "perf/step_s" in r]
        mean = lambda f, m=m: statistics.fmean(f(r) for r in m)  # noqa: E731
        rows[arm] = {"s/step": mean(lambda r: r["perf/step_s"]), "rollout s/step": mean(lambda r: r["perf/rollout_s"]),
                     "update s/step": mean(lambda r: r["perf/update_s"]),
                     # the rest of the step: HDR's drift scan over its stored groups (replay.sample)
                     "other s/step": mean(lambda r: r["perf/step_s"] - r["perf/rollout_s"] - r["perf/update_s"]),
                     "searches/step": mean(lambda r: r["rollout/tool_calls"] * r["rollout/samples"]),
                     "completion tokens/step": mean(lambda r: r["perf/gen_tokens"]),
                     "trained rows/step": mean(lambda r: r["rollout/samples"] + r.get("update/replay_rows", 0.0)),
                     "groups scanned/step": mean(lambda r: r.get("replay/scanned", 0.0)),
                     "accept rate": mean(lambda r: r.get("replay/accept_rate", 0.0))}
    head = "| arm | " + " | ".join(next(iter(rows.values()))) + " |\n|---|" + "---|" * len(next(iter(rows.values())))
    body = "".join(f"| {a} | " + " | ".join(f"{v:.2f}" for v in r.values()) + " |\n" for a, r in rows.items())
    return [f"## latency: {LATENCY_S * 1000:.0f} ms per search, seed 0, {LATENCY_STEPS} steps "
            "(means over the steps)\n\n",
            head + "\n" + body]


def latency_full_phase(args) -> list[str]:
    extra = [*COMMON, f"model.path={warm_start_dir()}", f"task.tool_latency_s={LATENCY_S}",
             f"eval.every={FULL_EVAL_EVERY}"]
    runs = harness.run_arms(EXPERIMENT, RECIPE, {f"latfull_{a}": [*extra, *ov] for a, ov in LATENCY_ARMS.items()},
                            args)
    key = "eval/mean_at_k"
    target = statistics.fmean(harness.final_eval(d, key) for d in runs["latfull_grpo24"])
    train = {arm: [[r for r in harness.metrics(d) if "perf/step_s" in r] for d in dirs] for arm, dirs in runs.items()}
    ref = {x: statistics.fmean(m[-1][x] for m in train["latfull_grpo24"])
           for x in ("perf/wall_s_total", "perf/gen_tokens_total")}
    lines = [f"## latency_full: {LATENCY_S * 1000:.0f} ms per search over whole runs (seeds {args.seeds})\n\n",
             f"Held-out eval every {FULL_EVAL_EVERY} steps (not in the wall-clock); target = grpo24's final mean@4 = "
             f"{target:.3f}. Cells: mean ± std [min, max] over seeds; 'to target' is interpolated between evals, over "
             "the seeds that reach it (x: relative to grpo24's mean total); 'drift scan' is the step time outside "
             "rollout and update (HDR's scoring of its stored groups).\n\n",
             "| arm | final mean@4 | wall-clock s | drift scan s/step | searches | generated tokens | seeds reaching "
             "target | wall-clock s to target | generated tokens to target |\n|---|---|---|---|---|---|---|---|---|\n"]
    for arm, dirs in runs.items():
        ms = train[arm]
        cells = [harness.fmt(harness.agg([harness.final_eval(d, key) for d in dirs])),
                 harness.fmt(harness.agg([m[-1]["perf/wall_s_total"] for m in ms]), 0),
                 harness.fmt(harness.agg([statistics.fmean(r["perf/step_s"] - r["perf/rollout_s"] - r["perf/update_s"]
                                                           for r in m) for m in ms]), 2),
                 harness.fmt(harness.agg([sum(r["rollout/tool_calls"] * r["rollout/samples"] for r in m)
                                          for m in ms]), 0),
                 harness.fmt(harness.agg([m[-1]["perf/gen_tokens_total"] for m in ms]), 0)]
        reach = {x: [harness.first_reach(harness.eval_points(d, key, x), target) for d in dirs] for x in ref}
        cells.append(f"{sum(r is not None for r in reach['perf/wall_s_total'])}/{len(dirs)}")
        for x, got in reach.items():
            got = [r for r in got if r is not None]
            cells.append(f"{harness.fmt(harness.agg(got), 0)} ({statistics.fmean(got) / ref[x]:.2f}x)" if got else "-")
        lines.append(f"| {arm.removeprefix('latfull_')} | " + " | ".join(cells) + " |\n")
    lines += ["\nHeld-out mean@4 at every evaluation:\n\n", harness.eval_curve(runs)]
    return lines


def check_warm_start() -> None:
    """Held-out mean@4 / greedy through the tool loop of the recipe's warm start and of a clean one
    (``task.p_guess=0``, built once, ~10-15 min on 2 cores): can this model learn the loop and the task at all?"""
    import torch

    from groupwise.config import load
    from groupwise.eval import evaluate
    from groupwise.loop.setup import build

    torch.set_num_threads(1)
    for extra in ([], ["task.p_guess=0.0"]):
        cfg = load(RECIPE, ["trainer.threads=1", *extra])
        p = build(cfg)
        m, _ = evaluate(p.generator, p.tokenizer, p.task, list(p.task.test[:96]), p.encode, k=4, temperature=1.0,
                        max_tokens=cfg.rollout.max_completion_tokens, verify=p.reward.check)
        print(f"p_guess {cfg.task.cfg.p_guess}: mean@4 {m['eval/mean_at_k']:.3f}  greedy {m['eval/greedy_acc']:.3f}",
              flush=True)


def argparse_like(args, **changes):
    import argparse

    return argparse.Namespace(**{**vars(args), **changes})


def main() -> None:
    def own(p):
        p.add_argument("--phase", choices=("all", "main", "latency", "latency_full"), default="all")
        p.add_argument("--check-warm-start", action="store_true", help="only evaluate the two warm starts")

    args = harness.cli_args(__doc__.splitlines()[0], own)
    if args.check_warm_start:
        check_warm_start()
        return
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    lines = [f"# {EXPERIMENT}\n\nRecipe `{RECIPE}`.\n\n"]
    if args.phase in ("all", "main"):
        lines += main_phase(args)
    if args.phase in ("all", "latency"):
        lines += latency_phase(args)
    if args.phase == "latency_full":  # its own report, beside the main one
        lines += latency_full_phase(args)
        (out_dir / "latency_full.md").write_text("".join(lines))
        print("".join(lines))
        return
    harness.write_report(out_dir, lines, [])


if __name__ == "__main__":
    main()
