"""Tasks: problems, references and verifiers (protocol ``tasks.base.Task``).

Registry form: ``factory(cfg, env) -> Task`` (``env.seed`` is the run seed).
"""

from groupwise.registry import Registry
from groupwise.tasks.base import Task

TASKS = Registry("task", Task, "factory", ("cfg", "env"))

