"""Rewards: verifier correctness, format, and method-specific shaping, combined by weight.

Registry signature: ``factory(cfg, task) -> RewardTerm``; a RewardTerm is called as
``term(groups, step) -> list[list[float]]`` (one value per sample, group-major) after the verifier has
set ``Sample.correct``. Stateful terms also expose ``state_dict()`` / ``load_state_dict()`` (checkpointed).
"""

from groupwise.registry import Registry

REWARDS = Registry("reward", "factory(cfg, task) -> term(groups, step) -> list[list[float]]")

from groupwise.rewards import acoer, basic, length_penalty, rouge_l, think_mode  # noqa: E402,F401  (registration)
