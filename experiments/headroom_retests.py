"""Re-tests on the headroom lab's third setting (issue 30) against the setting's own GRPO runs: DistIL, OPSD /
DASH-OPSD, GARL / PAFT, the three length methods (QLPO, ACOER, DRE), HDR, LamPO and RLCSD.

Written before any run of these arms (2026-12-05). Setting: ``recipes/headroom_unseen_lab.yaml`` (chains of 2-12
additions mod 10; the warm start imitates a wrap slip and was taught chains of 2-6 only), its RL budget unchanged
for every arm (80 steps x 16 prompts x 8 samples, 128 tokens, lr 1e-4, eval at steps 0 / 40 / 80 on 132 held-out
problems, 12 per k, mean@8 and pass@8 at T = 1, greedy): equal samples. Seeds 0, 1, 2. The ``grpo`` arm is the
setting's GRPO runs (``experiments/headroom_lab.py --recipe recipes/headroom_unseen_lab.yaml``: 0.155 -> 0.280 +-
0.125 mean@8, pass@8 0.495 -> 0.535, k >= 7 at chance), reused key by key where the resolved config is the arm's.
The teacher in every distillation arm is the frozen warm start shown the problem's reference in ``<ref>`` tags.

What the teacher knows here (``experiments/headroom_lab.py --recipe recipes/headroom_unseen_lab.yaml
--teacher-check``, measured before any run; 132 problems x 8 samples): shown the reference, mean@8 0.98-1.00 at
k = 2-6, 1.00 / 1.00 / 0.92 / 0.92 at k = 7-10 and 0.43 / 0.52 at k = 11 / 12, where the student stops after six
steps or loops. So unlike on the first lab, the teacher holds exactly what GRPO cannot find: the seventh step.
Divergence on the student's samples: forward KL 1.96 nats / token unclipped, 0.0077 clipped (r_t, OPSD's and DASH's
divergence); the gate input g_t = r_t - r̄ has std 0.044 (p10 -0.014, p90 0.043).

``--method distil`` (``recipes/distil_headroom_lab.yaml``; arms grpo, reverse_kl, distil). Claim (arXiv:2606.05152,
qualitative): DistIL beats RLVR and self-distillation with better pass@N. The first lab could not test pass@N (1.0
for every arm). Expectations: (1) both teacher arms end above GRPO on held-out mean@8 at step 80, the gain mostly on
k >= 7 (GRPO 0.07-0.14 there); (2) DistIL's pass@8 >= reverse-KL's and >= GRPO's (the claim; the spec's reading:
forward cross-entropy is mode-covering); (3) reverse KL has the lowest entropy at the end. (1) is held with some
confidence (dense signal where GRPO has none), (2) weakly: on the first lab reverse KL matched or beat DistIL on
pass@1. A difference is called clear only where the seed ranges do not overlap.

``--method dash_opsd`` (``recipes/dash_opsd_headroom_lab.yaml``; arms grpo, opsd, dash). Claim (arXiv:2608.06243):
DASH beats vanilla OPSD with no extra forward pass. On the first lab the gate was flat (λ ≈ 0.5 everywhere at
κ = 5) and DASH = OPSD within noise. Here κ is scaled to the measured spread before the runs: κ·std(g) = 2, κ = 45
(λ from ~0.13 at p90 to ~0.66 at p10). ``opsd`` is the same divergence with λ ≡ 0 (β = 0, clip 0.05). Expectations:
(1) both above GRPO at step 80, the gain on k >= 7, as for DistIL; (2) DASH >= OPSD on mean@8 (the claim), with no
direction held with confidence; (3) equal forwards per step (no extra pass). The first lab's OPSD rose for 50 steps
and then fell below its warm start by step 300, so a fall after step 40 is possible; both evals are reported.

``--method garl`` (``recipes/headroom_unseen_lab.yaml`` itself; arms grpo, garl_q075; written 2026-12-05 before
any run of the arm). Claim (arXiv:2604.25907): GARL q = 0.75 escapes a cold start where GRPO stalls. The first lab
had no setting where it could show (no arm escaped its cold start in 200 steps). Here the chains of 7-12 are a
cold start inside a warm one: GRPO's held-out mean@8 there stays at 0.07-0.14, about chance (a guess mod 10).
The arm: leave-one-out advantage amplified per prompt by max(P̂, 1/8)^(-0.75) (``advantage=rloo``, the ``garl``
transform at q = 0.75, as recipes/garl_lab.yaml), nothing else changed. One success in 8 gets advantage
1 · 8^0.75 ≈ 4.8 against GRPO's std-normalised ≈ 2.5, so GARL pushes rare successes about twice as hard.
Expectations: (1) mean@8 on k >= 7 does not rise above GRPO's: a success there is mostly a lucky guess (pass@8 on
those k is ~1 - 0.9^8), and pushing a lucky guess harder teaches no seventh step; the claim is read as reproduced
only if GARL's k >= 7 range lies above GRPO's. (2) Overall mean@8 within GRPO's seed range (0.162-0.411); the
larger advantages may make it less stable, not more. Held with moderate confidence. ``rloo`` alone (q = 0) is the
control to add if GARL differs from GRPO.

``paft_q075`` (added to ``--method garl`` after its other arms had run; written 2026-12-05 before its runs): the
paper's warm-start claim, PAFT q = 0.75 is the stable choice from a warm start and beats GRPO there (HotPotQA
+14.4 maj@16). The arm: ``advantage={name: paft, q: 0.75}``, the ``paft`` loss (SFT on resampled successes,
weighted P̂^(1-q)), as recipes/paft_lab.yaml. Expectations: PAFT only imitates its own successes, so it learns
the k <= 6 chains where successes are skill and leaves k >= 7 at chance like every arm; mean@8 and maj@8 within
GRPO's seed range (GRPO's spread, 0.162-0.411, is too wide for 3 seeds to show a 14-point gain unless the
ranges separate); read as reproduced only if PAFT's mean@8 range lies above GRPO's.

Seeds 3-5 for grpo, garl_q075 and rloo (added 2026-12-05 after seeds 0-2 of all four arms, before these runs): the
q-ordering seen on seeds 0-2 (rloo 0.378 > grpo 0.280 > garl 0.243 mean@8, ranges overlapping) is checked on three
fresh seeds; it is read as holding only if the six-seed means keep that order and rloo - garl is positive in at
least five of the six seeds. ``--seeds 3 4 5 --arms grpo garl_q075 rloo``; every seed is reported.

``--method length`` (``recipes/headroom_unseen_lab.yaml``; arms grpo, qlpo, acoer, dre; written 2026-12-05 before
any run of these three arms). The three methods that cut length on the first lab (QLPO -32% at +1.3 points mean@4,
ACOER -33% at -1.6, DRE's post-answer tail -98% and length -33% at equal accuracy), where GRPO ends at 0.90 and
the only slack is 0-7 re-checks. Here accuracy has headroom and the slack is of two kinds: 0-2 re-checks after the
commitment (``chk <last step>;``, 10 tokens each, about one per answer at the warm start, never changing the
answer) and loops to the 128-token cap at k >= 10 (19% of warm-start samples, always wrong). The arms, each the
method's lab recipe carried over with nothing tuned: ``qlpo`` samples 16 per prompt and keeps 8 by quadrant,
alpha = 1/3 (``recipes/qlpo_lab.yaml``: equal trained samples, twice the generation, the paper's comparison);
``acoer`` is ``recipes/acoer_lab.yaml``'s reward with its budget starting at this setting's cap (128 tokens, the
spec's "budget starts at the completion cap"); ``dre`` is ``recipes/dre_lab.yaml``'s transform (text detector,
tau_abs 4, so any re-check is an editable tail). Read at step 80 on the held-out set: mean@8, k >= 7, pass@8, and
the length table (all samples, correct samples, the post-answer tail of correct answers as ``experiments/dre.py``
reads it, the share cut off at the cap). GRPO's length spreads 44-98 tokens over seeds (its loops), so the
correct answers' length and tail are the primary length readings. A difference is called clear only where the
seed ranges do not overlap; mean@8 is also given per seed (same seed: same warm-start eval, same first prompts).
Expectations: (1) DRE: the tail of correct answers at least 50% below GRPO's (the spec's bar), held with
confidence; loops untouched (DRE edits only rollouts where a correct answer emerges, and a loop commits to none),
so the capped share is GRPO's within noise; mean@8 within GRPO's seed range. (2) ACOER: correct answers shorter
than GRPO's, by the tail; loops are wrong and score 0 as under GRPO, so the capped share is GRPO's; mean@8 within
GRPO's range, possibly below its mean (a length term beside a correctness still being learned; -1.6 on the first
lab). Held moderately. (3) QLPO: correct answers shorter than GRPO's (long-correct samples are the quadrant it
drops); loops are long-incorrect, the quadrant it keeps, so no fewer loops than GRPO; mean@8 at or above GRPO's
mean (16 samples find more successes on the long chains, and the kept 8 include them), held weakly. No method is
expected to teach the seventh step: k >= 7 near chance for every arm.

Seeds 3-5 for all four arms of ``--method length`` (added 2026-12-05 after seeds 0-2, before these runs). On seeds
0-2 every method ended above GRPO in every seed (mean@8 qlpo 0.339, acoer 0.352, dre 0.390 against GRPO's 0.246,
whose seed 2 fell below its warm start), against expectations (1)-(3), which put them within GRPO's range. A
method's gain is read as holding only if its six-seed mean@8 is above GRPO's and its paired difference (same
seed) is positive in at least five of the six seeds; the tail and length readings are redone on six seeds too.
``--seeds 3 4 5 --arms grpo qlpo acoer dre``; every seed is reported.

``length_penalty`` (added to ``--method length`` 2026-12-05 after the six-seed runs, before its own): ACOER's second
claim, that a length penalty on every answer collapses where ACOER does not. The arm is
``recipes/length_penalty_lab.yaml``'s reward carried over: r = c - 0.2 * len / 128 on every answer (kappa 0.2 keeps
every correct answer above every wrong one). On the first lab it could not collapse until a short wrong answer was
reachable (``task.p_early_exit``); here one is: a trace that skips steps and commits early (DistIL's answers fell
to 24.5 tokens that way on this setting). Half of a batch is k >= 7, mostly all-wrong groups, where std
normalisation turns length differences alone into full-size advantages. The collapse signature, fixed here: at step
80 fewer than half of the warm start's share of held-out traces write all k steps (``whole traces`` < 0.23,
warm start 0.457), or held-out mean@8 below the warm start's. By it GRPO collapsed in 1 of 6 seeds (seed 2: whole
traces 0.076) and ACOER in 0 of 6. Expectation: the penalty arm collapses in at least 2 of 3 seeds (seeds 0-2),
with its length below GRPO's; held moderately (the penalty is small, 0.2 over 128 tokens, and 80 steps are few).
``--arms length_penalty``.

``--method replay`` (``recipes/headroom_unseen_lab.yaml``; arms grpo, grpo24, fifo, hdr; written 2026-12-05 before
any run of these arms). Claim (arXiv:2609.03941): Headroom-Drift Replay reaches the quality of a larger fresh
batch at lower generation cost. On the first lab (150 steps) HDR 0.885 against grpo24 0.898 and grpo16 0.872,
with naive replay as good as HDR. The case for replay is stronger here: a success on a long chain is rare, and a
stored group holding one has headroom, so replaying it trains on it again. Arms, with the first lab's knobs and
nothing re-tuned: ``grpo24`` 24 fresh prompts per step (1.5x the generation); ``fifo`` 16 fresh groups plus up to 8
stored ones, first in first out (capacity 64); ``hdr`` 16 fresh plus up to 8 stored, ranked by headroom and
admitted only at drift <= tau = 1e-3 (the first lab's pre-registered sweep; not re-swept). 80 steps each.
Expectations: (1) grpo24's mean@8 at or above GRPO's mean, not clear at 3 seeds given GRPO's spread; (2) HDR's
mean@8 within grpo24's seed range at 2/3 of its generated tokens (the claim), held moderately; (3) HDR = fifo
within noise, as on the first lab; a gain of HDR over fifo is the selection's own and is called only if the seed
ranges are disjoint; (4) k >= 7 near chance in every arm: replaying a lucky guess teaches no seventh step.

Seeds 3-5 for grpo24, fifo and hdr (added 2026-12-05 after seeds 0-2, before these runs; grpo's seeds 3-5 are
``--method length``'s, the same config). On seeds 0-2 fifo ended highest (0.438, range disjoint from grpo24's),
HDR between (0.348), grpo24 0.294, GRPO 0.246. A difference between two arms is read as holding only if its
six-seed mean keeps its sign and the paired difference (same seed) has that sign in at least five of six seeds.
``--seeds 3 4 5 --arms grpo24 fifo hdr``; every seed is reported.

``fifo_all`` (added to ``--method replay`` 2026-12-05 after the six-seed runs, before its own; seeds 0-5): a test of
the reading given for fifo's gain (0.444 +- 0.025 against grpo24's 0.341): fifo stores only mixed-reward groups,
so all 8 replayed groups carry a signal, where about half of the fresh groups carry none (zero-variance share
0.49 -> 0.51). The arm is fifo with ``ingress: all``: every fresh group is stored, so the 8 most recent are the
previous step's last 8, about half of them uniform (zero advantage, loss tokens only). Per step it trains about 12
groups with a signal out of 24 (grpo24: about 12 of 24, all fresh; fifo: about 16 of 24). Expectation, held
weakly: fifo_all's mean@8 falls between grpo24's and fifo's, and fifo − fifo_all is positive in at least five of
six seeds (the reading holds). If fifo − fifo_all is positive in three or fewer seeds, the reading is refuted: the
gain comes from training the recent groups again, not from choosing which ones. ``--arms fifo_all``.

``grpo_2ep`` (added to ``--method replay`` 2026-12-05 after fifo_all's runs, before its own; seeds 0-5). fifo_all
came out between the two readings: 0.422 +- 0.056, above grpo24 and GRPO in 6/6 seeds, below fifo in 4/6 (so
most of replay's gain over grpo24 does not come from storing only groups with a signal). The question left: is it
that each sample is trained on more than once? The arm is GRPO with ``optim.ppo_epochs=2``: every step's batch
gives two optimizer steps (the second at a ratio off 1, clipped as usual), so every sample is trained on twice,
at once, where fifo_all trains half of them a second time one step later. Generation is GRPO's (16 x 8). Expectation,
held weakly: grpo_2ep's mean@8 is above grpo24's in at least five of six seeds and within fifo_all's seed range
(more optimisation per generated sample is the gain). If it is above grpo24 in three or fewer seeds, that reading
fails, and what replay adds is its one-step delay or its mix of two steps' samples. ``--arms grpo_2ep``.

``grpo_lr2`` (added to ``--method replay`` 2026-12-05 after grpo_2ep's runs, before its own; seeds 0-5). grpo_2ep
came out as expected: 0.420 +- 0.050, above grpo24 in 5/6 seeds, equal to fifo_all (3/6). Under Adam two
optimizer steps per batch move the weights about twice as far as one, so the question left is whether the
samples' reuse matters at all, or only the step size. The arm is GRPO at lr 2e-4 (one epoch, GRPO's generation).
Expectation, held weakly: grpo_lr2 is above grpo24 in at least five of six seeds and the paired difference
grpo_lr2 − grpo_2ep is split (four or fewer of one sign): the setting's GRPO is simply under-stepped at lr 1e-4 for
80 steps. If grpo_lr2 is below grpo_2ep in five or six seeds (or collapses where grpo_2ep does not: the collapse
signature above), a second pass over the same samples is worth more than a larger step. ``--arms grpo_lr2``.

``--method lampo`` (``recipes/headroom_unseen_lab.yaml``; arms grpo, rloo, lampo_b5; written 2026-12-05 before any
run of these arms). Claim (arXiv:2605.21235, withdrawn): the pairwise decomposed advantage with confidence
weights beats GRPO. On the first lab (graded reward, 200 steps) no accuracy gain; it reached 0.80 one eval sooner
and had the lowest spread. Here the reward stays the setting's binary correctness (the first lab's graded
``step_credit`` would reward the seventh step's running value, a different task), so a pair counts only where
one sample is right and the other wrong, and its weight grows when the wrong one had the higher length-normalised
log-prob. Arms: ``lampo_b5`` (beta 5, score mean, as ``recipes/lampo_lab.yaml``) and ``rloo`` (beta = 0 is
leave-one-out without std, the control). Expectations: lampo_b5's mean@8 within GRPO's and RLOO's seed ranges
(no gain, as on the first lab), with a smaller spread over seeds than GRPO's, held weakly; k >= 7 at chance.

``--method rlcsd`` (``recipes/headroom_unseen_lab.yaml``; arms grpo, rlcsd; written 2026-12-05 before any run of
the arm). Claim (arXiv:2606.11709): contrastive on-policy self-distillation keeps length stable where one-sided
self-distillation drifts, at accuracy >= GRPO's. The arm: ``recipes/rlcsd_lab.yaml``'s transform and credit (a
correct sibling's solution as the hint in ``<ref>`` tags, the context the warm start saw on 30% of its SFT
examples; the official constants) with the official default ``drop_uncontrasted: true``, which the first lab's
runs did not use (they kept such rows as GRPO rows): rows without a contrast leave the update. Besides uniform
groups (zero advantage anyway), that drops the lone success of a group, the typical success on a long chain, a
lucky guess. Expectations: (1) mean@8 at or above GRPO's mean, held weakly: on k <= 6 a correct sibling writes
the sums without the slip and wrong ones slip, so the contrast points at the slip; on k >= 7 a correct sibling is
as broken as the wrong ones, and the lone-success rows that carry GRPO's noise there are dropped; (2) k >= 7 at
chance; (3) length within GRPO's seed range (no style drift is built into this setting, so the length claim has
nothing to show); (4) a step costs one extra teacher-forced pass of the policy (the hinted contexts).

Not here: GraphPO (needs a tree-width calibration at this warm start for the equal budget), think modes, DASH
drift and PivotTrace (each needs its own warm-start pathology, one build each).

Usage: PYTHONPATH=src python experiments/headroom_retests.py --method distil|dash_opsd|garl|length|replay|lampo|rlcsd
       --jobs 1 [--report-only]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from dre import tails  # noqa: E402
from headroom_lab import _STEP, by_difficulty  # noqa: E402

GRPO_RUNS = harness.OUT / "headroom_unseen_lab"  # experiments/headroom_lab.py --recipe recipes/headroom_unseen_lab.yaml
COMMON = ["trainer.save_every=0", "trainer.sinks=[jsonl]"]
NO_TEACHER = ["teacher=none", "rollout.transforms=[]", "credit=[]"]
METHODS = {  # method -> (recipe, arms)
    "distil": ("recipes/distil_headroom_lab.yaml", {
        "grpo": ["loss.terms=[ppo_clip]", *NO_TEACHER],
        "reverse_kl": ["loss.terms=[{name: opsd, beta: 1.0, token_clip: .inf, support: vocab}]",
                       "rollout.transforms=[]", "credit=[]"],
        "distil": [],
        # added after the three arms above had run (a test of the length reading, not a tuned setting): the
        # cost-to-go on ℓ_t − H(π_T), so a state where the teacher is unsure costs nothing
        "distil_kl": ["rollout.transforms=[{name: distil, cost: kl, chunk: 64}]"]}),
    "dash_opsd": ("recipes/dash_opsd_headroom_lab.yaml", {
        "grpo": ["loss.terms=[ppo_clip]", *NO_TEACHER],
        "opsd": ["loss.terms=[{name: opsd, beta: 0.0, token_clip: 0.05, support: vocab}]"],  # DASH's r_t, λ ≡ 0
        "dash": []}),
    "garl": ("recipes/headroom_unseen_lab.yaml", {
        "grpo": [],
        "garl_q075": ["advantage=rloo", "advantage_transforms=[{name: garl, q: 0.75}]"],
        # added after garl_q075 had run (its k = 5-6 fell below GRPO's): GARL at q = 0, leave-one-out without std
        "rloo": ["advantage=rloo", "advantage_transforms=[]"],
        "paft_q075": ["advantage={name: paft, q: 0.75}", "advantage_transforms=[]", "loss.terms=[paft]"]}),
    "length": ("recipes/headroom_unseen_lab.yaml", {
        "grpo": [],
        "qlpo": ["rollout.group_size=16", "rollout.transforms=[{name: qlpo, keep: 8, alpha: 0.3333333333333333}]"],
        "acoer": ["reward.terms=[{name: acoer, warmup_steps: 20, window: 10, ema_span: 5, alpha_up: 1.2189944, "
                  "alpha_down: 0.5987369, budget_init: 128, budget_min: 16}]"],
        "dre": ["rollout.transforms=[{name: dre, tau_abs: 4, tau_rel: 0.1, mode: replace}]"],
        "length_penalty": ["reward.terms=[{name: length_penalty, coef: 0.2, max_length: 128}]"]}),
    "replay": ("recipes/headroom_unseen_lab.yaml", {
        "grpo": [],
        "grpo24": ["rollout.prompts_per_step=24"],
        "fifo": ["replay={name: fifo, capacity: 64, replay_groups: 8}"],
        "fifo_all": ["replay={name: fifo, capacity: 64, replay_groups: 8, ingress: all}"],  # added after fifo had run
        "grpo_2ep": ["optim.ppo_epochs=2"],  # added after fifo_all had run
        "grpo_lr2": ["optim.lr=2.0e-4"],  # added after grpo_2ep had run
        "hdr": ["replay={name: hdr, capacity: 64, replay_groups: 8, tau: 0.001}"]}),
    "lampo": ("recipes/headroom_unseen_lab.yaml", {
        "grpo": [],
        "rloo": ["advantage=rloo"],
        "lampo_b5": ["advantage={name: lampo, beta: 5.0, score: mean}"]}),
    "rlcsd": ("recipes/headroom_unseen_lab.yaml", {
        "grpo": [],
        "rlcsd": ['rollout.transforms=[{name: rlcsd, context: "{prompt}\\n<ref>{hint}</ref>", positive: self_rollout, '
                  'k_max: 4}]', "credit=[{name: rlcsd, tau: 0.02, beta: 1.0, lam: 0.5, delta: 0.02, eta: 1.0}]"]}),
}
LONG = range(7, 13)  # the chains the warm start never saw
TRAINING = ("loss/opsd_div", "loss/dash_gate_mean", "loss/dash_weight_mean", "teacher/forwards",  # where logged
            "replay/groups", "replay/accept_rate", "replay/token_share", "rollout/rlcsd_targets",
            "rollout/rlcsd_teacher_rows", "adv/zero_std_group_frac")


def long_mean(run: Path, when: str = "after") -> float:
    """Held-out mean@8 over k = 7..12 ``before`` or ``after`` training (equal problems per k)."""
    return statistics.fmean(harness.summary(run)[when][f"eval/mean_at_k/d{k}"] for k in LONG)


def whole_traces(run: Path, step: int) -> float:
    """Share of the held-out samples at ``step`` whose trace writes all k steps before its commitment ``so``."""
    rows = harness.eval_samples(run, step)
    return statistics.fmean(len(_STEP.findall(r["text"].split("so ", 1)[0])) == r["difficulty"] for r in rows)


def length_cells(run: Path, step: int) -> dict[str, float]:
    """Held-out lengths at ``step``: all samples, correct ones, the post-answer tail of correct answers (as
    ``experiments/dre.py`` reads it) and the share cut off at the completion cap."""
    recs = harness.eval_samples(run, step)
    correct = [r["length"] for r in recs if r["correct"]]
    return {"length": statistics.fmean(r["length"] for r in recs),
            "length correct": statistics.fmean(correct) if correct else float("nan"),
            "tail correct": tails(recs)["tail"],
            "capped": statistics.fmean(r["finish_reason"] == "length" for r in recs)}


def final(run: Path, step: int) -> dict[str, float]:
    """One run's readings at ``step`` that the report pairs by seed: mean@8, whole traces, the length cells, and
    whether it shows the collapse signature (whole traces below half its own warm start's, or mean@8 below it)."""
    s = harness.summary(run)
    out = {"mean@8": harness.eval_at(run, step), "whole traces": whole_traces(run, step), **length_cells(run, step)}
    out["collapsed"] = float(out["whole traces"] < whole_traces(run, 0) / 2
                             or s["after"]["eval/mean_at_k"] < s["before"]["eval/mean_at_k"])
    return out


def paired(finals: dict[str, dict[int, dict[str, float]]], key: str, a: str, b: str, digits: int = 3) -> str:
    """``a`` − ``b`` in ``key`` seed by seed (the seeds both arms ran), and in how many ``a`` is above."""
    seeds = sorted(finals[a].keys() & finals[b].keys())
    d = [finals[a][s][key] - finals[b][s][key] for s in seeds]
    return (f"- {a} − {b} `{key}`: " + ", ".join(f"{x:+.{digits}f}" for x in d)
            + f" (above in {sum(x > 0 for x in d)}/{len(d)}, below in {sum(x < 0 for x in d)}/{len(d)})\n")


def main() -> None:
    def own(p):
        p.add_argument("--method", choices=list(METHODS), required=True)
        p.add_argument("--arms", nargs="+", default=[], help="run only these arms (two lanes); report what exists")

    args = harness.cli_args(__doc__.splitlines()[0], own)
    recipe, arms = METHODS[args.method]
    experiment = f"{args.method}_headroom"
    out_dir = Path(args.out) if args.out else harness.OUT / experiment
    arms = {k: [*COMMON, *v] for k, v in arms.items()}
    if args.arms:
        harness.run_arms(experiment, recipe, {k: arms[k] for k in args.arms}, args)
        args.report_only = True
    for s in args.seeds if not args.steps else []:
        if not harness.reuse(GRPO_RUNS / f"grpo-s{s}", recipe, [*arms["grpo"], f"seed={s}"], out_dir / f"grpo-s{s}"):
            print(f"grpo-s{s}: no reusable run in {GRPO_RUNS}; it runs here", flush=True)
    runs = harness.run_arms(experiment, recipe, arms, args)
    runs = harness.finished(runs)
    start = runs["grpo"]  # every arm's step-0 eval is the warm start's on the same seed
    rows = {"warm start (step 0)": {
        **{k: harness.agg([harness.summary(d)["before"][f"eval/{k}"] for d in start])
           for k in ("mean_at_k", "pass_at_k", "maj_at_k", "greedy_acc", "len_mean")},
        "mean@8 k>=7": harness.agg([long_mean(d, "before") for d in start]),
        "whole traces": harness.agg([whole_traces(d, 0) for d in start])}}
    lengths = {"warm start (step 0)": {k: harness.agg([length_cells(d, 0)[k] for d in start])
                                       for k in ("length", "length correct", "tail correct", "capped")}}
    training: dict[str, dict[str, str]] = {}
    finals: dict[str, dict[int, dict[str, float]]] = {}  # arm -> seed -> final readings
    for arm, dirs in runs.items():
        cells = harness.eval_cells(dirs, ("mean_at_k", "pass_at_k", "maj_at_k", "greedy_acc", "len_mean"))
        cells["mean@8 k>=7"] = harness.agg([long_mean(d) for d in dirs])
        last = max(r["step"] for r in harness.metrics(dirs[0]))
        finals[arm] = {harness.seed_of(d): final(d, last) for d in dirs}
        per_run = list(finals[arm].values())
        cells["whole traces"] = harness.agg([f["whole traces"] for f in per_run])
        cells["entropy(tail20)"] = harness.agg([harness.tail_mean(d, "policy/entropy") for d in dirs])
        cells["wall_s"] = harness.agg([harness.summary(d)["last"]["perf/wall_s_total"] for d in dirs])
        cells.update(harness.cost_cells(dirs))
        rows[arm] = cells
        lengths[arm] = {k: harness.agg([f[k] for f in per_run])
                        for k in ("length", "length correct", "tail correct", "capped")}
        lengths[arm]["generated tokens"] = harness.agg([harness.tail_mean(d, "perf/gen_tokens_total", 1) for d in dirs])
        for key in (k for k in TRAINING if any(k in r for r in harness.metrics(dirs[0]))):
            training.setdefault(arm, {})[key] = harness.fmt(harness.agg([harness.head_mean(d, key) for d in dirs])) \
                + " → " + harness.fmt(harness.agg([harness.tail_mean(d, key) for d in dirs]))
    cols = ["mean_at_k", "mean@8 k>=7", "whole traces", "pass_at_k", "maj_at_k", "greedy_acc", "len_mean",
            "entropy(tail20)", "forwards/step", "s/step", "wall_s"]
    png = harness.plot_curves(runs, ["eval/mean_at_k", "eval/pass_at_k", "policy/entropy"], out_dir / "curves.png")
    lines = [f"# {experiment}\n\n`{recipe}`, seeds {args.seeds}; 132 held-out problems (12 per k = 2..12), mean@8 "
             "and pass@8 at T = 1, greedy. Warm start: " + harness.fmt(harness.warm_start_eval(runs)) + " mean@8, "
             + harness.fmt(harness.warm_start_eval(runs, "eval/pass_at_k")) + " pass@8. Cells: mean ± std [min, max] "
             "over seeds.\n\n", harness.table(rows, cols),
             "\nHeld-out lengths after training (tokens; `tail correct`: after the commitment, correct answers; "
             "`capped`: share cut off at the cap):\n\n",
             harness.table(lengths, ["length", "length correct", "tail correct", "capped", "generated tokens"], 2),
             "\nMean@8 per seed after training: " + "; ".join(
                 f"{arm} " + ", ".join(f"{f['mean@8']:.3f}" for _, f in sorted(per_seed.items()))
                 for arm, per_seed in finals.items()) + "\n",
             "\nPaired by seed (the same warm start and first prompts), mean@8 for every pair of arms, lengths "
             "against grpo:\n\n",
             *[paired(finals, "mean@8", a, b) for i, b in enumerate(finals) for a in list(finals)[i + 1:]],
             *[paired(finals, k, a, "grpo", 2) for a in finals if a != "grpo"
               for k in ("length correct", "tail correct")],
             "\nCollapse signature at the end (whole traces below half the run's warm start's, or mean@8 below "
             "it): " + ", ".join(f"{arm} {sum(f['collapsed'] for f in per_seed.values()):.0f}/{len(per_seed)}"
                                for arm, per_seed in finals.items()) + "\n",
             "\nMean@8 along training:\n\n", harness.eval_curve(runs),
             "\npass@8 along training:\n\n", harness.eval_curve(runs, "eval/pass_at_k")]
    lines += ["\nTraining metrics, first 10 steps → last 20:\n\n"] if training else []
    lines += [f"- {arm} `{key}`: {v}\n" for arm, kv in training.items() for key, v in kv.items()]
    for arm, dirs in runs.items():
        lines += [f"\n{arm}: held-out mean@8 by difficulty after training:\n\n", by_difficulty(dirs, "after")]
    harness.write_report(out_dir, lines, [png])


if __name__ == "__main__":
    main()
