"""Per-step metrics computed from the step's groups (rollout, reward and advantage stages)."""

from __future__ import annotations

import statistics

from groupwise.filter import has_variance
from groupwise.types import Group


def group_metrics(groups: list[Group]) -> dict[str, float]:
    samples = [s for g in groups for s in g.samples]
    if not samples:
        return {}
    lengths = [s.length for s in samples]
    m = {
        "reward/mean": statistics.fmean(s.reward for s in samples),
        "reward/std": statistics.pstdev([s.reward for s in samples]),
        "reward/correct_frac": statistics.fmean(s.correct for s in samples),
        "reward/verifier_error_frac": statistics.fmean(s.verifier_error for s in samples),
        "rollout/completion_len_mean": statistics.fmean(lengths),
        "rollout/completion_len_max": float(max(lengths)),
        "rollout/truncated_frac": statistics.fmean(s.finish_reason == "length" for s in samples),
        "rollout/groups": float(len(groups)),
        "rollout/samples": float(len(samples)),
        "adv/zero_std_group_frac": statistics.fmean(not has_variance(g) for g in groups),
        "adv/abs_mean": statistics.fmean(abs(s.advantage) for s in samples),
    }
    for name in samples[0].reward_terms:
        m[f"reward/{name}"] = statistics.fmean(s.reward_terms.get(name, 0.0) for s in samples)
    return m
