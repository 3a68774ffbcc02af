"""QLPO (arXiv:2607.21793): the spec's acceptance experiment (specs-01-08.md §4) on the reasoning lab.

Claim under test: resampling each GRPO group from K over-generated rollouts by length/correctness quadrant
(favouring short correct and long incorrect answers) shortens responses by 30-70% at preserved accuracy,
with no length term in the reward. Spec pass criteria: QLPO(alpha=1/3) mean length >= 20% below GRPO with
accuracy within 1.5 points; QLPO(alpha=1) length ~ GRPO; the re-check count falls fastest under QLPO.

Setting: recipes/qlpo_lab.yaml (lab with overthinking: 0..6 redundant ``chk`` re-checks after the answer,
+1 when correct, plus wrap slips for accuracy headroom), embedded lab-tiny warm start shared by all arms,
16 prompts per step, lr 1e-4 (constant, no warm-up), 112 completion tokens, held-out eval (128 problems,
mean@4 at T=1 + greedy) every EVAL_EVERY steps.

  grpo       GRPO, G = 8 (no transform)
  grpo_g16   GRPO, G = 16: the same generation as QLPO, all of it trained on
  qlpo       K = 16 generated, M = 8 kept, alpha = 1/3 (the paper's setting)
  qlpo_a1    K = 16 -> M = 8, alpha = 1: a ratio-preserving uniform subsample (isolates the quadrant weighting
             from over-generation)

Generation cost: QLPO samples K = 16 per prompt, about 2x the
tokens of GRPO per step; the trainer's ``perf/gen_tokens`` counts every generated completion token, discarded
samples included (``rollout/qlpo_pool_tokens`` is the same pool count as seen by the transform).

Budget: 3 seeds x STEPS = 200 steps per arm (the spec asks 500; 200 is what fits one session on two lanes)
(``--steps N`` trains every arm N steps and reads it at its step-N eval; N a multiple of EVAL_EVERY), one torch
thread per run (--jobs 2 runs two at once, with the same bits). Comparison point: every arm is compared at its
held-out eval of step STEPS. A GRPO run trained for longer is read at its step-STEPS eval: the lr schedule is
constant with no warm-up and nothing else in the run depends on ``trainer.steps``, so the state after step N of
a longer run is the state at the end of an N-step run (same eval seed, same evals before it);
``check_baseline`` verifies that the resolved configs differ in ``trainer.steps`` (and name) only.
experiments/acoer.py uses these same grpo runs as its accuracy-only arm.

Usage: PYTHONPATH=src python experiments/qlpo.py --jobs 2 [--seeds 0 1 2] [--steps N] [--report-only]

Real-model setting (``--setting smollm2``; issue 30's "one method on the real model"; written 2026-12-05 before
any run). recipes/smollm2_math.yaml (SmolLM2-135M-Instruct, LoRA, 8 prompts per step, 2-term +/- arithmetic,
48-token cap, lr 6e-4 constant) with ``rollout.group_size=16`` and the qlpo transform (keep 8, alpha 1/3), so
each step samples 16 per prompt and trains on 8 per prompt: the paper's comparison, the same trained batch as
GRPO G = 8. One arm, 3 seeds, 50 steps, held-out eval (200 problems, mean@4 at T = 1, greedy) at step 50 only.
GRPO is read from the committed runs of experiments/smollm2.py (experiments/out/smollm2) at their step-50
eval, as experiments/async_rollouts.py does (constant lr, same seeds; the step-0 eval is theirs too);
``check_smollm2`` fails unless the resolved configs differ only in the listed keys. Budget: a GRPO step there
took ~28 s of which ~22 s generation, so ~50 s a step here (twice the generation), ~45-55 min a run on one
thread, two runs at once: ~1 h 45 min for the three seeds. qlpo_a1 and grpo_g16 are not run here (time).

Expectations (written before the runs):
- Length: no 30-70% cut. The completions are ~21 tokens and shaped by the prompt's two worked examples
  (``a - b = c. The final answer is \\boxed{c}.``); in the GRPO runs' logged groups the correct samples are
  19-26 tokens and a group's correct samples differ by a token or two (the digits of the answer), so there is
  no length slack for the quadrant weighting to remove. Expect held-out length within 5% of GRPO's.
- Accuracy: the pool of 16 holds a mixed group more often than 8 samples do, and the quota keeps a mixed pool
  mixed (m+ clamped to [1, 7]), so fewer kept groups have zero reward variance (``adv/zero_std_group_frac``
  below GRPO's 0.5-0.7). That may speed learning a little, but GRPO's seeds spread ±0.048 at step 50, so any
  accuracy difference under ~5 points will not be distinguishable at 3 seeds; expect mean@4 within GRPO's
  seed range, at twice the generated tokens.

    PYTHONPATH=src python experiments/qlpo.py --setting smollm2 --jobs 2
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import yaml  # noqa: E402

RECIPE = "recipes/qlpo_lab.yaml"
STEPS, EVAL_EVERY = 200, 20
COMMON = [f"trainer.steps={STEPS}", f"eval.every={EVAL_EVERY}", "trainer.save_every=0", "trainer.sinks=[jsonl]"]
GRPO = ["rollout.group_size=8", "rollout.transforms=[]"]
ARMS = {"grpo": GRPO, "grpo_g16": ["rollout.group_size=16", "rollout.transforms=[]"], "qlpo": [],
        "qlpo_a1": ["rollout.transforms.0.alpha=1.0"]}
QUAD = ("sc", "lc", "si", "li")


def rows(run: Path, upto: int | None = None) -> list[dict]:
    """Training-step rows (up to step ``upto`` when given)."""
    return [r for r in harness.metrics(run) if "perf/step_s" in r and (upto is None or r["step"] <= upto)]


def eval_at(run: Path, step: int) -> dict:
    """The held-out eval metrics logged at ``step`` (step 0: the warm start)."""
    hit = [r for r in harness.metrics(run) if "eval/mean_at_k" in r and r["step"] == step]
    if not hit:
        raise ValueError(f"{run}: no held-out eval at step {step}")
    return hit[-1]


# config keys added to groupwise after some runs were made, at values that leave the run unchanged (each one's
# default path is the old code path, pinned by its tests): dropped before comparing, so an old run compares
ADDED_AT_DEFAULT = ((("task", "label_noise"), 0.0), (("eval", "forced_prefix"), ""),
                    (("rollout", "generator", "decode"), "model"), (("rollout", "sync_check"), "resync"),
                    (("rollout", "sync_check_tol"), 0.0), (("rollout", "max_async_level"), 0),
                    (("rollout", "async_timeout_s"), 3600.0), (("reward", "fail_fast"), True),
                    (("loss", "importance_sampling"), {"mode": "none", "cap": 3.0}))


def comparable(resolved: dict) -> dict:
    """A resolved config without what may differ between runs compared at one step: name, out_dir, seed, steps,
    and the ADDED_AT_DEFAULT keys at their defaults."""
    import copy

    out = {k: copy.deepcopy(v) for k, v in resolved.items() if k not in ("name", "out_dir", "seed")}
    out["trainer"] = {k: v for k, v in out["trainer"].items() if k != "steps"}
    for path, default in ADDED_AT_DEFAULT:
        node = out
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(path[-1], default) == default:
            node.pop(path[-1], None)
    return out


def resolved(run: Path) -> dict:
    return yaml.safe_load((run / "resolved_config.yaml").read_text())


def check_baseline(dirs: list[Path], step: int) -> str:
    """Fail unless the runs share one resolved config apart from name/out_dir/seed/trainer.steps, constant lr with
    no warm-up, and each ran at least ``step`` steps; returns a one-line note for the report."""
    ref = comparable(resolved(dirs[0]))
    for d in dirs:
        cfg = resolved(d)
        if comparable(cfg) != ref:
            raise SystemExit(f"{d}: resolved config differs from {dirs[0]} beyond name/out_dir/seed/trainer.steps")
        if cfg["optim"]["schedule"] != "constant" or cfg["optim"]["warmup_steps"] != 0:
            raise SystemExit(f"{d}: step-{step} comparison needs a constant lr schedule without warm-up")
        if cfg["trainer"]["steps"] < step:
            raise SystemExit(f"{d}: ran {cfg['trainer']['steps']} < {step} steps")
    lens = {d.name: resolved(d)["trainer"]["steps"] for d in dirs}
    return (f"baseline runs {lens} (trainer.steps per run) share one resolved config otherwise; all read at their "
            f"step-{step} eval")


def checks_per_response(run: Path, step: int) -> float:
    """Mean number of redundant ``chk`` re-checks per sampled (T=1) held-out response."""
    return statistics.fmean(r["text"].count("chk ") for r in harness.eval_samples(run, step))


def run_cells(dirs: list[Path], step: int) -> dict[str, dict[str, float]]:
    """Per-arm aggregates at the eval of ``step`` (and training totals up to it)."""
    c: dict[str, dict[str, float]] = {}
    for k in ("eval/mean_at_k", "eval/greedy_acc", "eval/len_mean", "eval/len_correct_mean"):
        c[k] = harness.agg([eval_at(d, step)[k] for d in dirs])
    c["chk per response"] = harness.agg([checks_per_response(d, step) for d in dirs])
    # perf/gen_tokens counts every generated completion token (QLPO: all K per prompt, discarded ones included)
    c["generated tokens (M)"] = harness.agg([rows(d, step)[-1]["perf/gen_tokens_total"] / 1e6 for d in dirs])
    c["update tokens (M)"] = harness.agg([sum(r["update/loss_tokens"] for r in rows(d, step)) / 1e6 for d in dirs])
    # no wall-clock column: runs of one arm shared the machine with different loads, so seconds do not compare
    return c


def quadrant_table(runs: dict[str, list[Path]], step: int) -> str:
    """Quadrant shares of the pool (before) and of the kept group (after), means over the first / last 10 steps."""
    lines = ["| arm | when | steps | SC | LC | SI | LI | mean length | correct frac |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, dirs in runs.items():
        if arm.startswith("grpo"):
            continue
        for when in ("before", "after"):
            for label, cut in (("1-10", slice(0, 10)), (f"{step - 9}-{step}", slice(-10, None))):
                cells = [harness.fmt(harness.agg([statistics.fmean(r[key] for r in rows(d, step)[cut])
                                                  for d in dirs]), 3)
                         for key in [*(f"rollout/qlpo_{q}_frac_{when}" for q in QUAD),
                                     f"rollout/qlpo_len_mean_{when}", f"rollout/qlpo_correct_frac_{when}"]]
                lines.append(f"| {arm} | {when} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_quadrants(runs: dict[str, list[Path]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in runs if not a.startswith("grpo")]
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


CONTRASTS = (("qlpo", "grpo", "the paper's comparison: same trained batch size"),
             ("qlpo", "grpo_g16", "same generation: keep 8 by quadrant vs train on all 16"),
             ("qlpo_a1", "grpo", "over-generation alone: K = 16 -> 8 uniform vs G = 8"),
             ("qlpo", "qlpo_a1", "quadrant weighting alone: alpha 1/3 vs 1 at equal generation"))


def contrasts(cells: dict) -> str:
    """Length and accuracy differences for the pairs that separate over-generation from quadrant weighting."""
    lines = ["| arm | vs | what it isolates | length change | mean@4 change (points) | greedy change (points) |",
             "|---|---|---|---|---|---|"]
    for a, b, what in CONTRASTS:
        if a in cells and b in cells:
            x, y = cells[a], cells[b]
            rel = x["eval/len_mean"]["mean"] / y["eval/len_mean"]["mean"] - 1
            d = {k: 100 * (x[k]["mean"] - y[k]["mean"]) for k in ("eval/mean_at_k", "eval/greedy_acc")}
            lines.append(f"| {a} | {b} | {what} | {100 * rel:+.1f}% | {d['eval/mean_at_k']:+.1f} | "
                         f"{d['eval/greedy_acc']:+.1f} |")
    return "\n".join(lines) + "\n"


def curve_table(runs: dict[str, list[Path]], step: int, extra=None) -> str:
    """Seed-mean held-out mean@4 and length at every eval up to ``step`` (do the curves flatten?), and the seed
    mean of ``extra(run, step)`` after them when given."""
    evals = list(range(0, step + 1, EVAL_EVERY))
    lines = ["| arm | " + " | ".join(f"step {e}" for e in evals) + " |", "|---|" + "---|" * len(evals)]
    for arm, dirs in runs.items():
        cell = [f"{statistics.fmean(eval_at(d, e)['eval/mean_at_k'] for d in dirs):.3f} / "
                f"{statistics.fmean(eval_at(d, e)['eval/len_mean'] for d in dirs):.1f}"
                + (f" / {statistics.fmean(extra(d, e) for d in dirs):.2f}" if extra else "") for e in evals]
        lines.append(f"| {arm} | " + " | ".join(cell) + " |")
    return "\n".join(lines) + "\n"


def report(runs: dict[str, list[Path]], out_dir: Path, step: int) -> str:
    note = check_baseline(runs["grpo"], step)
    cells = {arm: run_cells(dirs, step) for arm, dirs in runs.items()}
    start = runs["grpo"][0]
    base = eval_at(start, 0)
    seeds = [harness.seed_of(d) for d in runs["grpo"]]
    g, q = cells["grpo"], cells["qlpo"]
    rel = 1 - q["eval/len_mean"]["mean"] / g["eval/len_mean"]["mean"]
    d_acc = q["eval/mean_at_k"]["mean"] - g["eval/mean_at_k"]["mean"]
    steps_flag = f" --steps {step}" if step != STEPS else ""
    md = (f"# QLPO experiment\n\nSeeds {seeds}, compared at step {step} (16 prompts/step, lr 1e-4 constant), eval "
          f"every {EVAL_EVERY} steps (128 held-out problems, mean@4 at T=1, greedy). Command: `PYTHONPATH=src "
          f"python experiments/qlpo.py --jobs 2{steps_flag}`.\n"
          f"GRPO baseline: {note}.\n\n"
          f"Warm start (step 0): mean@4 {base['eval/mean_at_k']:.3f}, greedy {base['eval/greedy_acc']:.3f}, "
          f"length {base['eval/len_mean']:.1f} tokens, chk/response {checks_per_response(start, 0):.2f}.\n\n"
          f"## Held-out metrics at step {step} (mean ± std [min, max] over seeds)\n\n"
          + harness.table(cells, list(g), digits=3) +
          f"\nQLPO(alpha=1/3) vs GRPO: mean length {100 * rel:.1f}% shorter (spec pass: >= 20%), "
          f"mean@4 {100 * d_acc:+.1f} points (spec pass: within 1.5). Generated tokens count every sampled "
          "completion token (QLPO: all K = 16 per prompt); update tokens are those in the trained batch (M = 8).\n\n"
          "## Contrasts (differences of seed means at step " + str(step) + ")\n\n" + contrasts(cells) +
          "\n## Held-out curves (seed-mean mean@4 / length)\n\n" + curve_table(runs, step) +
          "\n## Quadrant shares of the pool (before) and of the kept group (after), means over seeds of per-step "
          "values averaged over the first and the last 10 steps\n\n" + quadrant_table(runs, step) +
          "\nPlots: `eval_curves.png` (held-out accuracy and length), `training.png`, "
          "`quadrants.png`.\n")
    (out_dir / "results.md").write_text(md)
    (out_dir / "results.json").write_text(json.dumps(cells, indent=1))
    harness.plot_curves(runs, ["eval/mean_at_k", "eval/greedy_acc", "eval/len_mean", "eval/len_correct_mean"],
                        out_dir / "eval_curves.png")
    harness.plot_curves(runs, ["reward/correct_frac", "rollout/completion_len_mean"], out_dir / "training.png")
    plot_quadrants(runs, out_dir / "quadrants.png")
    return md


def ensure_baseline(seeds: list[int], jobs: int = 1, steps: int = STEPS) -> list[Path]:
    """Train the grpo arm's missing seeds (``steps`` steps, the comparison point) under a file lock, so
    experiments/acoer.py, which shares these runs, can call it too without two processes writing one run;
    returns the run directories."""
    import argparse
    import fcntl

    harness.OUT.joinpath("qlpo").mkdir(parents=True, exist_ok=True)
    with (harness.OUT / "qlpo" / ".grpo.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        args = argparse.Namespace(seeds=seeds, jobs=jobs, steps=steps, out="", report_only=False)
        return harness.run_arms("qlpo", RECIPE, {"grpo": [*COMMON, *ARMS["grpo"]]}, args)["grpo"]


SMOLLM2_RECIPE, SMOLLM2_STEPS = "recipes/smollm2_math.yaml", 50
SMOLLM2_GRPO = harness.OUT / "smollm2"  # experiments/smollm2.py's committed GRPO runs, read at step 50
SMOLLM2_QLPO = ["trainer.steps=50", "eval.every=0", "eval.before=false", "trainer.save_every=0",
                "trainer.sinks=[jsonl]", "rollout.group_size=16",
                "rollout.transforms=[{name: qlpo, keep: 8, alpha: 0.3333333333333333}]"]
# keys allowed to differ from the GRPO runs besides those ``comparable`` drops: the arm's own, the eval and save
# cadence, and micro-batching (same gradient, pinned by tests)
SMOLLM2_FREE = {"rollout.group_size", "rollout.transforms", "trainer.save_every", "eval.every", "eval.before",
                "optim.micro_batch_tokens"}


def flat(cfg: dict, prefix: str = "") -> dict:
    """Dotted keys -> values, down to the config's sections' fields (lists and transform dicts kept whole)."""
    out = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and not prefix:
            out.update(flat(v, f"{key}."))
        else:
            out[key] = v
    return out


def check_smollm2(qlpo: list[Path], grpo: list[Path]) -> str:
    """Fail unless each QLPO run's ``comparable`` config equals its GRPO seed's outside SMOLLM2_FREE; returns the
    keys that differ, for the report."""
    diff: set[str] = set()
    for q, g in zip(qlpo, grpo):
        a, b = flat(comparable(resolved(q))), flat(comparable(resolved(g)))
        for key in sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)):
            if key not in SMOLLM2_FREE:
                raise SystemExit(f"{q}: {key} = {a.get(key)!r} but the GRPO run {g} has {b.get(key)!r}")
            diff.add(key)
    return ", ".join(sorted(diff | {"trainer.steps"}))


def smollm2(args) -> None:
    """The real-model setting (see the module docstring): one QLPO arm against the committed GRPO runs."""
    out_dir = Path(args.out) if args.out else harness.OUT / "qlpo_smollm2"
    qlpo = harness.run_arms("qlpo_smollm2", SMOLLM2_RECIPE, {"qlpo": SMOLLM2_QLPO}, args)["qlpo"]
    grpo = [SMOLLM2_GRPO / f"grpo_lora-s{s}" for s in args.seeds]
    freed = check_smollm2(qlpo, grpo)
    step = SMOLLM2_STEPS
    keys = ("eval/mean_at_k", "eval/greedy_acc", "eval/len_mean", "eval/len_correct_mean", "eval/format_frac")
    cells = {"warm start (GRPO runs' step 0)": {k: harness.agg([eval_at(d, 0)[k] for d in grpo]) for k in keys},
             f"grpo (G = 8), step {step}": {k: harness.agg([eval_at(d, step)[k] for d in grpo]) for k in keys},
             f"qlpo (16 -> 8, alpha 1/3), step {step}": {k: harness.agg([eval_at(d, step)[k] for d in qlpo])
                                                         for k in keys}}
    for label, dirs in ((f"grpo (G = 8), step {step}", grpo), (f"qlpo (16 -> 8, alpha 1/3), step {step}", qlpo)):
        cells[label] |= {
            "zero-variance groups (trained)": harness.agg([statistics.fmean(
                r["adv/zero_std_group_frac"] for r in rows(d, step)) for d in dirs]),
            "generated tokens (k)": harness.agg([rows(d, step)[-1]["perf/gen_tokens_total"] / 1e3 for d in dirs]),
            "update tokens (k)": harness.agg([sum(r["update/loss_tokens"] for r in rows(d, step)) / 1e3
                                              for d in dirs])}
    cols = [*keys, "zero-variance groups (trained)", "generated tokens (k)", "update tokens (k)"]
    paired = "; ".join(
        f"seed {s}: mean@4 {100 * (eval_at(q, step)['eval/mean_at_k'] - eval_at(g, step)['eval/mean_at_k']):+.1f}, "
        f"length {100 * (eval_at(q, step)['eval/len_mean'] / eval_at(g, step)['eval/len_mean'] - 1):+.1f}%"
        for s, q, g in zip(args.seeds, qlpo, grpo))
    runs = {"grpo": grpo, "qlpo": qlpo}
    md = (f"# QLPO on the real model (SmolLM2-135M-Instruct, LoRA)\n\n`{SMOLLM2_RECIPE}` "
          f"{' '.join(SMOLLM2_QLPO)}; seeds {args.seeds}; GRPO: experiments/smollm2.py's runs "
          f"({SMOLLM2_GRPO.name}/grpo_lora-s*) read at their step-{step} eval. Keys that differ from them: "
          f"{freed}. Held-out: 200 problems, mean@4 at T = 1 and greedy. Cells: mean ± std [min, max] over "
          "seeds; training columns over steps 1-" + str(step) + ".\n\n" + harness.table(cells, cols) +
          f"\nPaired QLPO − GRPO per seed: {paired}.\n\n"
          "Quadrant shares of the pool of 16 (before) and of the kept 8 (after), first and last 10 steps:\n\n"
          + quadrant_table({"qlpo": qlpo}, step) + "\n")
    (out_dir / "results.md").write_text(md)
    harness.plot_curves(runs, ["reward/correct_frac", "adv/zero_std_group_frac", "rollout/completion_len_mean"],
                        out_dir / "training.png")
    print(md)


def main() -> None:
    args = harness.cli_args(__doc__.splitlines()[0], lambda p: p.add_argument(
        "--setting", choices=["lab", "smollm2"], default="lab"))
    if args.setting == "smollm2":
        return smollm2(args)
    out_dir = Path(args.out) if args.out else harness.OUT / "qlpo"
    if args.out and not args.report_only:
        raise SystemExit("--out is not supported for training: the grpo baseline lives in experiments/out/qlpo")
    runs = {"grpo": ensure_baseline(args.seeds, args.jobs, args.steps or STEPS) if not args.report_only
            else [out_dir / f"grpo-s{s}" for s in args.seeds]}
    # baseline seeds already trained for longer are kept and read at their step-(--steps) eval
    arms = {a: [*COMMON, *ov] for a, ov in ARMS.items() if a != "grpo"}
    runs.update(harness.run_arms("qlpo", RECIPE, arms, args))
    print(report(runs, out_dir, args.steps or STEPS))


if __name__ == "__main__":
    main()
