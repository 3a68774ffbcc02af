"""Tasks: problems, references and verifiers.

Registry signature: ``factory(cfg, seed: int) -> Task``.
"""

from groupwise.registry import Registry

TASKS = Registry("task", "factory(cfg, seed) -> Task")

from groupwise.tasks import lab  # noqa: E402,F401  (registers "lab")
from groupwise.tasks.gym import GymConfig  # noqa: E402,F401  (registers "reasoning_gym")
from groupwise.tasks.jsonl import JsonlConfig  # noqa: E402,F401  (registers "jsonl")

