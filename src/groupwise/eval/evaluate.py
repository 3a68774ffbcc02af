"""Evaluate a policy on held-out problems: k samples at the eval temperature plus one greedy sample each.

Returns (metrics, records). Metrics, all prefixed ``eval/``: ``mean_at_k`` (Mean@k, the average correctness
of the k samples), ``pass_at_1``, ``pass_at_k``, ``maj_at_k``, ``greedy_acc``, ``format_frac``,
``len_mean``, ``len_median``, ``len_p90``, ``len_correct_mean``, ``truncated_frac``, ``verifier_error_frac``
(verifier exceptions and timeouts, which score incorrect), and per difficulty d
``mean_at_k/d<d>`` and ``len_mean/d<d>``. Records are one dict per sample (problem id, difficulty, greedy flag,
text, answer, correct, length, finish reason, and the prompt form where the task has several) for
method-specific diagnostics.

``forced_prefix`` (``eval.forced_prefix``) is prefilled after every prompt, greedy included; like a training
prefix its tokens are part of the completion (the record's ``text`` starts with it, ``length`` counts it, and
it counts toward ``max_tokens``). "" (the default) asks the generator exactly what it was asked before.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import torch

from groupwise.eval.metrics import majority_correct, pass_at_k
from groupwise.registry import ConfigError
from groupwise.rewards.stage import call_with_timeout, verdict
from groupwise.rollout.base import Request, SamplingParams
from groupwise.seeding import stable_seed
from groupwise.types import Problem


def _correct(verify, problem: Problem, text: str) -> tuple[bool, bool]:
    """(correct, verifier_error): a crashing or timed-out verifier scores the sample incorrect, counted."""
    try:
        return verify(problem, text), False
    except (Exception, SystemExit):  # noqa: BLE001 - counted in eval/verifier_error_frac, never fatal
        return False, True


def _form(problem: Problem) -> dict[str, str]:
    return {"form": problem.meta["form"]} if "form" in problem.meta else {}


def forced_prefix_ids(tokenizer, text: str, max_tokens: int) -> tuple[int, ...]:
    """The token ids of ``eval.forced_prefix``; refused (one line naming the key) when they do not decode back
    to ``text`` (unknown characters, special tokens that decoding drops) or leave no token to generate."""
    ids = tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()
    back = tokenizer.decode(list(ids), skip_special_tokens=True)
    if ids and back != text:
        raise ConfigError(f"eval.forced_prefix={text!r}: its tokens decode to {back!r}; use text the tokenizer keeps")
    if len(ids) >= max_tokens:
        raise ConfigError(f"eval.forced_prefix={text!r}: {len(ids)} tokens leave none of the eval's {max_tokens} "
                          "completion tokens to generate")
    return ids


def evaluate(generator, tokenizer, task, problems: list[Problem], encode, *, k: int, temperature: float,
             max_tokens: int, greedy: bool = True, seed: int = 0, verify=None, timeout_s: float = 5.0,
             forced_prefix: str = ""):
    """``verify(problem, text) -> bool`` (raising on failure) is the run's (``RewardStage.check``); without one,
    ``task.verify`` under a ``timeout_s`` alarm, its verdict required to be a bool."""
    if verify is None:
        verify = lambda p, t: verdict(call_with_timeout(lambda: task.verify(p, t), timeout_s))  # noqa: E731
    prefix = forced_prefix_ids(tokenizer, forced_prefix, max_tokens)
    prompts = [encode(p) for p in problems]
    rng = torch.Generator().manual_seed(stable_seed("eval", seed))
    records = []
    passes = [("sampled", k, SamplingParams(max_tokens, temperature))]
    if greedy:
        passes.append(("greedy", 1, SamplingParams(max_tokens, 0.0)))
    for kind, n, params in passes:
        reqs = [Request(pr, prefix, problem=p) for pr, p in zip(prompts, problems) for _ in range(n)]
        outs = generator.generate(reqs, params, rng)
        for i, p in enumerate(problems):
            for c in outs[i * n:(i + 1) * n]:
                text = tokenizer.decode(c.completion_ids.tolist(), skip_special_tokens=True)
                correct, error = _correct(verify, p, text)
                records.append({"id": p.id, "difficulty": p.difficulty, "greedy": kind == "greedy", "text": text,
                                "answer": task.extract_answer(text), "correct": correct, "verifier_error": error,
                                "format": bool(task.format_ok(text)), "length": int(c.completion_ids.numel()),
                                "finish_reason": c.finish_reason, **_form(p)})
    return summarize(records, k), records


def summarize(records: list[dict], k: int) -> dict[str, float]:
    sampled = [r for r in records if not r["greedy"]]
    by_problem: dict[str, list[dict]] = defaultdict(list)
    for r in sampled:
        by_problem[r["id"]].append(r)
    m: dict[str, float] = {}
    if sampled:
        lengths = sorted(r["length"] for r in sampled)
        correct_lengths = [r["length"] for r in sampled if r["correct"]]
        m["eval/mean_at_k"] = statistics.fmean(r["correct"] for r in sampled)
        m["eval/pass_at_1"] = statistics.fmean(pass_at_k(len(v), sum(r["correct"] for r in v), 1)
                                               for v in by_problem.values())
        m["eval/pass_at_k"] = statistics.fmean(pass_at_k(len(v), sum(r["correct"] for r in v), min(k, len(v)))
                                               for v in by_problem.values())
        m["eval/maj_at_k"] = statistics.fmean(majority_correct([r["answer"] for r in v], [r["correct"] for r in v])
                                              for v in by_problem.values())
        m["eval/format_frac"] = statistics.fmean(r["format"] for r in sampled)
        m["eval/len_mean"] = statistics.fmean(lengths)
        m["eval/len_median"] = float(statistics.median(lengths))
        m["eval/len_p90"] = float(lengths[min(len(lengths) - 1, int(0.9 * len(lengths)))])
        m["eval/len_correct_mean"] = statistics.fmean(correct_lengths) if correct_lengths else 0.0
        m["eval/truncated_frac"] = statistics.fmean(r["finish_reason"] == "length" for r in sampled)
        m["eval/verifier_error_frac"] = statistics.fmean(r.get("verifier_error", False) for r in records)
        for d in sorted({r["difficulty"] for r in sampled}):
            rows = [r for r in sampled if r["difficulty"] == d]
            m[f"eval/mean_at_k/d{d}"] = statistics.fmean(r["correct"] for r in rows)
            m[f"eval/len_mean/d{d}"] = statistics.fmean(r["length"] for r in rows)
    greedy = [r for r in records if r["greedy"]]
    if greedy:
        m["eval/greedy_acc"] = statistics.fmean(r["correct"] for r in greedy)
    return m


def evaluate_run(p, problems, **overrides):
    """``evaluate`` on a built pipeline ``p`` with its run's eval settings (``eval.k``, ``temperature``,
    ``greedy``, ``forced_prefix``, the token cap) and its verifier; ``overrides`` replace any of them."""
    e = p.cfg.eval
    kw = dict(k=e.k, temperature=e.temperature, greedy=e.greedy, seed=p.cfg.seed, verify=p.reward.check,
              max_tokens=e.max_completion_tokens or p.cfg.rollout.max_completion_tokens, forced_prefix=e.forced_prefix)
    return evaluate(p.generator, p.tokenizer, p.task, list(problems), p.encode, **{**kw, **overrides})
