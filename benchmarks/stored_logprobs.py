#!/usr/bin/env python
"""The current policy's pass over stored samples (``Pipeline.policy_logprobs``: what replay, HDR, RLCSD, RREDCoT
and DistIL call), before and after it became the learner's pass, side by side in one process.

    PYTHONPATH=src python benchmarks/stored_logprobs.py                                  # the real model
    PYTHONPATH=src python benchmarks/stored_logprobs.py --recipe recipes/grpo_lab.yaml   # lab-tiny
    PYTHONPATH=src python benchmarks/stored_logprobs.py optim.shared_prefix=false        # config overrides

``before``: one plain teacher-forced pass per 64 rows, every row with its whole prompt (the code up to commit
3a9bfec). ``after``: ``Learner.logprobs`` under the recipe's ``optim`` and the overrides given (its micro-batches;
each distinct prompt once with ``optim.shared_prefix``, the default). The rows are ``--prompts`` training
problems x ``--group`` completions each, each completion ``c = c. The final answer is \\boxed{c}.`` with c the
reference answer: the worked examples' form and length (the pass's cost does not depend on which tokens they are).
Rounds alternate before / after; reported: the median seconds of each, their ratio, and the largest
|difference| between the two results (float summation order only).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from groupwise.config import load
from groupwise.loop.setup import build
from groupwise.models.forward import completion_logprobs, pack
from groupwise.types import Sample


@torch.no_grad()
def before(pipe, samples: list[Sample]) -> list[torch.Tensor]:
    pipe.policy.eval()
    out = []
    for i in range(0, len(samples), 64):
        chunk = samples[i:i + 64]
        packed = pack([s.prompt_ids for s in chunk], [s.completion_ids for s in chunk], pipe.learner.settings.pad_id)
        lp = completion_logprobs(pipe.policy, packed, pipe.cfg.rollout.temperature).logprobs
        out += [lp[k, :s.length] for k, s in enumerate(chunk)]
    pipe.policy.train()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="recipes/smollm2_math.yaml")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. optim.shared_prefix=false")
    args = ap.parse_args()
    cfg = load(args.recipe, ["trainer.threads=1", "trainer.progress=false", "trainer.save_every=0", *args.overrides])
    pipe = build(cfg, io=False)
    tok = pipe.tokenizer
    samples = []
    for p in pipe.task.train[:args.prompts]:
        text = f"{p.answer} = {p.answer}. The final answer is \\boxed{{{p.answer}}}."
        ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        samples += [Sample(prompt_ids=pipe.encode(p), completion_ids=ids, rollout_logprobs=torch.zeros(len(ids)),
                           loss_mask=torch.ones(len(ids), dtype=torch.bool), finish_reason="stop")
                    for _ in range(args.group)]
    times: dict[str, list[float]] = {"before": [], "after": []}
    diff = 0.0
    for r in range(args.rounds + 1):  # round 0 warms up
        got = {}
        for name in (("before", "after") if r % 2 else ("after", "before")):
            t0 = time.perf_counter()
            got[name] = before(pipe, samples) if name == "before" else pipe.policy_logprobs(samples)
            if r:
                times[name].append(time.perf_counter() - t0)
        diff = max(diff, max(float((x - y).abs().max()) for x, y in zip(got["before"], got["after"])))
    o = cfg.optim
    b, a = statistics.median(times["before"]), statistics.median(times["after"])
    prompt = statistics.fmean(s.prompt_ids.numel() for s in samples)
    comp = statistics.fmean(s.length for s in samples)
    print(f"{args.recipe}: {len(samples)} rows ({args.prompts} prompts x {args.group}), prompt {prompt:.0f} tokens, "
          f"completion {comp:.0f}; optim.shared_prefix={o.shared_prefix}, micro_batch_tokens={o.micro_batch_tokens}; "
          f"{args.rounds} rounds, 1 thread")
    print(f"before {b:.3f} s   after {a:.3f} s   before/after {b / a:.2f}x   max |diff| {diff:.1e}")


if __name__ == "__main__":
    main()
