"""PivotTrace's premise, checked apart from training: does attention pivot density track errors, and does the
pivot detector see reflection episodes at all? (issue 14; arXiv:2606.04503)

On the lab's training setting (``checks``) the triage probes gave Spearman(pivot density, error) ≈ 0 while
mean token entropy gave 0.61 (docs/results.md). That failure can be the lab's or the method's:

Hypothesis (written before this script ran). The lab's errors are silent: a wrap slip is one wrong digit in
an otherwise fluent step, with no reflection episode next to it, so a detector of metacognitive pivots has
nothing to find and density is flat in the error rate (the lab's fault). On a lab whose traces carry an
explicit, error-linked reflection episode -- ``drift``: the 1500-step warm start of recipes/dash_drift_lab.yaml
(p_drift 0.3: a correct ``so X.`` followed by ``wait``, a botched step and a wrong ``so Y.``) -- a working
detector must (1) place pivots at the ``wait`` episodes more often than at random positions (lift > 1.5,
pivots within ±WINDOW tokens of a ``wait`` token against the share of all completion positions within
±WINDOW of one), and then (2) per-problem pivot density should correlate with the error rate (Spearman > 0.2).
Reading, fixed in advance: (1) and (2) hold -> the lab's fault; (1) fails -> the method's (our reconstruction
of the detector does not see explicit reflection at this model size); (1) holds but (2) fails -> pivots see
reflection, but reflection is not where this model's errors come from.

Post hoc (added after the drift result, so not part of the pre-registered test): ``drift_floor0`` is drift with
the detector's ``min_shift`` floor (our addition to the spec's robust threshold, default 0.02) set to 0, to see
whether the floor is what keeps the detector from firing.

Headroom lab (issue 30, "PivotTrace if its premise holds there"; written 2026-12-05 before this setting ran):
``headroom`` is the third setting's warm start (chains of 2-12 additions, SFT on 2-6 only, wrap slips, 0-2 ``chk``
re-checks, 128 tokens). Its errors are of two kinds: the silent wrap slip (as in ``checks``) and, on k >= 7, traces
that break (steps dropped or operands miscopied past the SFT lengths), a structural failure that an attention-shift
detector might see. The cue is ``chk`` (the only reflection-like episode there; it follows the commitment, so it is
not linked to errors). Premise, as above: per-problem pivot density must track the error rate (Spearman > 0.2 for
the default ``js`` scorer, mean over seeds, with no seed below 0). Expected: it does not (the error rate is driven by
the chain length, 0.9 at k >= 7, and pivot density per token has no reason to follow it; mean token entropy, which
rises on the broken long traces, should track it as on ``checks``). If the premise fails, PivotTrace is not run on
the headroom lab and its row says so; if it holds, the triage experiment (experiments/pivottrace.py) is the next run.

Calibration pass (the spec's "check the premise first", the pass experiments/pivottrace.py skipped for
cost on ``checks``): CALIB_POOL pool problems x CALIB_SAMPLES probe traces from the warm start, both attention
scorers (js, the default; lookback) on the same traces (the probe's generator seed depends only on
(seed, step, stage)), per setting. No RL step runs. Seeds 0, 1, 2 (a seed changes the probe traces; the warm
start is the same cached one).

    PYTHONPATH=src python experiments/pivottrace_premise.py    # -> experiments/out/pivottrace_premise/
    PYTHONPATH=src python experiments/pivottrace_premise.py --settings headroom
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
from pivottrace import CALIB_POOL, CALIB_SAMPLES, HEADROOM, RECIPE, calibration_probes  # noqa: E402

SETTINGS = {  # setting -> task / model / rollout overrides of the recipe
    "checks": ["task.max_checks=6", "task.check_correct_bonus=1", "rollout.max_completion_tokens=112"],
    "drift": ["task.p_wrap_slip=0.0", "task.p_drift=0.3", "model.warm_start_steps=1500",
              "rollout.max_completion_tokens=64"],
}
SETTINGS["drift_floor0"] = [*SETTINGS["drift"], "select.min_shift=0.0"]  # post hoc, see the docstring
SETTINGS["headroom"] = HEADROOM  # the headroom lab's third setting, the one experiments/pivottrace.py trains on
CUES = {"checks": "chk", "drift": "wait", "drift_floor0": "wait", "headroom": "chk"}
WINDOW = 2


def near(positions: list[int], marks: set[int], window: int) -> int:
    return sum(any(abs(p - m) <= window for m in marks) for p in positions)


def premise(setting: str, seed: int) -> dict:
    from groupwise.methods.pivottrace.selector import auroc, cue_positions, spearman

    out: dict = {"setting": setting, "seed": seed, "n_problems": CALIB_POOL, "samples": CALIB_SAMPLES,
                 "cue": CUES[setting], "window": WINDOW}
    for scorer, _, probes, err, dens, ent, wrong, tok in calibration_probes([*SETTINGS[setting], f"seed={seed}"]):
        # trace level: where the pivots sit relative to the cue tokens, and the cue's link to errors
        piv_near = piv_all = pos_near = pos_all = cue_hit = 0
        dens_cue, dens_none, cue_wrong, nocue_wrong, trace_dens, trace_wrong = [], [], [], [], [], []
        for p in probes:
            for piv, ids, ok in zip(p.pivots, p.completions, p.correct):
                if not ids:
                    continue
                marks = cue_positions([tok.decode([t]) for t in ids], (CUES[setting],))
                d = 100.0 * len(piv) / len(ids)
                trace_dens.append(d)
                trace_wrong.append(not ok)
                if marks:
                    cue_hit += near(piv, marks, WINDOW) > 0
                    piv_near += near(piv, marks, WINDOW)
                    piv_all += len(piv)
                    pos_near += near(list(range(len(ids))), marks, WINDOW)
                    pos_all += len(ids)
                    dens_cue.append(d)
                    cue_wrong.append(not ok)
                else:
                    dens_none.append(d)
                    nocue_wrong.append(not ok)
        share_piv = piv_near / piv_all if piv_all else float("nan")
        share_pos = pos_near / pos_all if pos_all else float("nan")
        out |= {"error_rate": statistics.fmean(err), "spearman_entropy_err": spearman(ent, err),
                "auroc_entropy_majority_wrong": auroc(ent, wrong),
                "cue_trace_frac": len(dens_cue) / len(trace_dens),
                "error_rate_cue_traces": statistics.fmean(cue_wrong) if cue_wrong else float("nan"),
                "error_rate_other_traces": statistics.fmean(nocue_wrong) if nocue_wrong else float("nan"),
                f"{scorer}/spearman_pivot_err": spearman(dens, err),
                f"{scorer}/auroc_pivot_majority_wrong": auroc(dens, wrong),
                f"{scorer}/trace_auroc_pivot_wrong": auroc(trace_dens, trace_wrong),
                f"{scorer}/mean_density": statistics.fmean(dens),
                f"{scorer}/density_cue_traces": statistics.fmean(dens_cue) if dens_cue else float("nan"),
                f"{scorer}/density_other_traces": statistics.fmean(dens_none) if dens_none else float("nan"),
                f"{scorer}/pivots_near_cue_share": share_piv, f"{scorer}/positions_near_cue_share": share_pos,
                f"{scorer}/lift": share_piv / share_pos if pos_all and piv_all else float("nan"),
                f"{scorer}/cue_recall": cue_hit / len(dens_cue) if dens_cue else float("nan"),
                f"{scorer}/traces_with_pivot": statistics.fmean(d > 0 for d in trace_dens),
                "mean_length": statistics.fmean(len(ids) for p in probes for ids in p.completions)}
    return out


KEYS = ["error_rate", "cue_trace_frac", "error_rate_cue_traces", "error_rate_other_traces",
        "spearman_entropy_err", "auroc_entropy_majority_wrong",
        *(f"{s}/{k}" for s in ("js", "lookback") for k in
          ("spearman_pivot_err", "auroc_pivot_majority_wrong", "trace_auroc_pivot_wrong", "mean_density",
           "density_cue_traces", "density_other_traces", "pivots_near_cue_share", "positions_near_cue_share", "lift",
           "cue_recall", "traces_with_pivot")), "mean_length"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["drift", "checks"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    out_dir = harness.OUT / "pivottrace_premise"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = {}
    for setting in args.settings:
        per_seed = []
        for seed in args.seeds:
            path = out_dir / f"{setting}-s{seed}.json"
            if not path.exists():
                path.write_text(json.dumps(premise(setting, seed), indent=1))
            per_seed.append(json.loads(path.read_text()))
        rows[setting] = {k: harness.agg([r[k] for r in per_seed]) for k in KEYS
                         if not any(math.isnan(r[k]) for r in per_seed)}  # NaN: e.g. no problem's majority is wrong
    lines = [f"# PivotTrace premise check\n\nRecipe `{RECIPE}`; settings: "
             + "; ".join(f"`{s}`: {' '.join(SETTINGS[s])} (cue `{CUES[s]}`)" for s in args.settings)
             + f". {CALIB_POOL} pool problems x {CALIB_SAMPLES} probe traces from the warm start, seeds {args.seeds}; "
             f"cells: mean ± std [min, max] over seeds. Lift: share of pivots within ±{WINDOW} tokens of a cue token "
             f"over the share of all completion positions that are (traces with a cue only); cue_recall: share of the "
             f"traces with a cue that have a pivot within ±{WINDOW} tokens of one.\n\n",
             "| metric | " + " | ".join(args.settings) + " |\n", "|---|" + "---|" * len(args.settings) + "\n"]
    for k in KEYS:
        lines.append(f"| {k} | " + " | ".join(harness.fmt(rows[s][k], 3) if k in rows[s] else "n/a"
                                              for s in args.settings) + " |\n")
    (out_dir / "results.md").write_text("".join(lines))
    print("".join(lines))


if __name__ == "__main__":
    main()
