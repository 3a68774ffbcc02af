"""Losses: per-token terms, weighted and summed; ``reduce.py`` is the only place denominators live.

Registry signature: ``fn(inp: LossInputs, cfg) -> LossTerms`` (a [B, T] per-token loss + metrics).
A term's config may declare ``needs = ("ref",)`` or ``("teacher",)``; the update then computes reference or
teacher log-probs (and only then: a zero-weight term is skipped and loads nothing).
"""

from groupwise.registry import Registry

LOSSES = Registry("loss", "fn(inp: LossInputs, cfg) -> LossTerms")

from groupwise.losses import kl, paft, ppo_clip  # noqa: E402,F401  (registration)
