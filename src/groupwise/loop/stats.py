"""Per-step metrics computed from the step's groups (rollout and reward stages) and advantages.

Metrics never raise: the reward stage keeps rewards finite, and should a non-finite reward reach here anyway
(a component that sets ``Sample.reward`` itself) its statistics are NaN in the log, not a crash after the
update (which a ``--resume`` would repeat at the same step)."""

from __future__ import annotations

import math
import statistics

from torch import Tensor

from groupwise.filter import has_variance
from groupwise.types import Group


def group_metrics(groups: list[Group]) -> dict[str, float]:
    samples = [s for g in groups for s in g.samples]
    if not samples:
        return {}
    lengths = [s.length for s in samples]
    m = {
        "reward/mean": statistics.fmean(s.reward for s in samples),
        "reward/std": _pstdev([s.reward for s in samples]),
        "reward/correct_frac": statistics.fmean(s.correct for s in samples),
        "reward/verifier_error_frac": statistics.fmean(s.verifier_error for s in samples),
        "rollout/completion_len_mean": statistics.fmean(lengths),
        "rollout/completion_len_max": float(max(lengths)),
        "rollout/truncated_frac": statistics.fmean(s.finish_reason == "length" for s in samples),
        "rollout/groups": float(len(groups)),
        "rollout/samples": float(len(samples)),
        "adv/zero_std_group_frac": statistics.fmean(not has_variance(g) for g in groups),
    }
    if "tool_calls" in samples[0].meta:  # multi-turn tool episodes (loop/tools.py): per-rollout means
        for key in ("turns", "tool_calls", "tool_errors", "tool_timeouts"):
            m[f"rollout/{key}"] = statistics.fmean(s.meta.get(key, 0) for s in samples)
        m["rollout/tool_token_frac"] = sum(s.meta.get("tool_tokens", 0) for s in samples) / max(sum(lengths), 1)
    for name in samples[0].reward_terms:  # a term's mean over the samples it applies to (not None / NaN)
        values = [v for s in samples if not math.isnan(v := s.reward_terms.get(name, math.nan))]
        if values:
            m[f"reward/{name}"] = statistics.fmean(values)
        if len(values) < len(samples):
            m[f"reward/{name}_none_frac"] = 1.0 - len(values) / len(samples)
    return m


def _pstdev(values: list[float]) -> float:
    """Population std; NaN if a value is not finite (``statistics.pstdev`` raises on NaN / inf)."""
    return statistics.pstdev(values) if all(map(math.isfinite, values)) else math.nan


def advantage_metrics(adv: Tensor, mask: Tensor) -> dict[str, float]:
    """Over the fresh samples that reach the update (replayed rows keep their stored advantages)."""
    if not bool(mask.any()):
        return {}
    return {"adv/abs_mean": float(adv.abs()[mask].mean())}
