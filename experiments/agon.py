"""Agon (competitive cross-model RL with implicit rival grading) against GRPO at equal generated samples.

Setting (fixed before the runs): recipes/agon_lab.yaml, the demo's lab setting (chains of three additions mod
10) from a warm start that copies a wrapping slip 60% of the time (the spec's hard split of 6-8 steps did not
learn under plain GRPO in a 30-step pilot, see docs/results.md); reward 2·correct + 0.5·format (+ the rival
term); 40 steps x 8 prompts; 48 completion tokens; lr 1e-4; held-out 128 problems, greedy pass@1. Arms:

  grpo         the single driver, 16 samples per prompt (= Agon's 2N: drafter N = 8 plus challenger N = 8)
  agon         competitive, per-rollout opponents, roles alternating (the paper)
  cooperative  the challenger reads the draft but gets no rival bonus
  fixed_roles  competitive, player A always drafts
  shared_opponent  competitive, every challenger answer of a group judged against one shared draft (added in a
               second invocation with the same settings; the spec expects it ≈ cooperative)

3 seeds. Reported:
greedy pass@1 of GRPO's policy, and for each Agon arm the two-stage cascade (drafter → challenger reads the
drafter's steps, last step and answer hidden, and answers) in both directions and their mean, each player
alone, the challenger stage's own length, generated tokens, and the rate of rival bonuses over training
(challenger samples right where their draft was wrong; in ``cooperative`` counted, not rewarded).

    PYTHONPATH=src python experiments/agon.py --jobs 1
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

EXPERIMENT, RECIPE = "agon", "recipes/agon_lab.yaml"
COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]", "trainer.record_groups=0", "eval.every=0"]
ARMS = {
    "grpo": [*COMMON, "driver=single", "rollout.group_size=16"],
    "agon": [*COMMON],
    "cooperative": [*COMMON, "driver.mode=cooperative"],
    "fixed_roles": [*COMMON, "driver.rotate_roles=false"],
    "shared_opponent": [*COMMON, "driver.mode=shared_opponent"],
}


def greedy_len(run: Path) -> float:
    """Mean length of the GRPO policy's greedy eval answers at the last step."""
    last = max((run / "eval").glob("step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))
    rows = [json.loads(x) for x in last.read_text().splitlines()]
    return statistics.fmean(r["length"] for r in rows if r["greedy"])


def cells(arm: str, run: Path, when: str = "after") -> dict[str, float]:
    m = harness.summary(run)[when]
    tokens = [r["perf/gen_tokens_total"] for r in harness.metrics(run) if "perf/gen_tokens_total" in r][-1]
    if arm == "grpo":
        acc = m["eval/greedy_acc"]
        return {"cascade (mean of 2 directions)": acc, "solo (mean of players)": acc,
                "final-stage length": greedy_len(run) if when == "after" else float("nan"),
                "gen tokens (M)": tokens / 1e6}
    return {"cascade (mean of 2 directions)": (m["eval/cascade_ab_acc"] + m["eval/cascade_ba_acc"]) / 2,
            "cascade A→B": m["eval/cascade_ab_acc"], "cascade B→A": m["eval/cascade_ba_acc"],
            "solo (mean of players)": (m["eval/solo_a_acc"] + m["eval/solo_b_acc"]) / 2,
            "solo A": m["eval/solo_a_acc"], "solo B": m["eval/solo_b_acc"],
            "final-stage length": (m["eval/cascade_ab_len"] + m["eval/cascade_ba_len"]) / 2,
            "gen tokens (M)": tokens / 1e6,
            "rival bonus rate": harness.tail_mean(run, "agon/rival_bonus_frac", 10**9) if when == "after" else 0.0}


COLUMNS = ["cascade (mean of 2 directions)", "cascade A→B", "cascade B→A", "solo (mean of players)", "solo A",
           "solo B", "final-stage length", "gen tokens (M)", "rival bonus rate"]


def main() -> None:
    args = harness.cli_args(__doc__.splitlines()[0])
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    runs = harness.run_arms(EXPERIMENT, RECIPE, ARMS, args)
    first = runs["agon"]
    rows = {"warm start (step 0)": {k: harness.agg([cells("agon", d, "before")[k] for d in first])
                                    for k in COLUMNS[:6]}}
    for arm, dirs in runs.items():
        per = [cells(arm, d) for d in dirs]
        rows[arm] = {k: harness.agg([c[k] for c in per]) for k in per[0]}
    plot = harness.plot_curves({a: d for a, d in runs.items() if a != "grpo"},
                               ["agon/draft_correct_frac", "agon/challenge_correct_frac", "agon/rival_bonus_frac"],
                               out_dir / "curves.png")
    lines = [f"# {EXPERIMENT}\n\nseeds {args.seeds}; greedy pass@1 on 128 held-out problems (chains of three "
             "additions); GRPO's cascade column is its policy alone.\n\n", harness.table(rows, COLUMNS),
             "\nPer seed, cascade (mean of 2 directions):\n\n",
             "".join(f"- {arm}: " + ", ".join(f"{cells(arm, d)['cascade (mean of 2 directions)']:.3f}" for d in dirs)
                     + "\n" for arm, dirs in runs.items())]
    harness.write_report(out_dir, lines, [plot])


if __name__ == "__main__":
    main()
