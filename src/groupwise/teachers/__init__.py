"""Teachers: token log-probs of a (possibly privileged) teacher on the student's own completions.

Registry signature: ``factory(cfg, policy, tokenizer) -> Teacher | None``. A Teacher implements
``logprobs(samples: list[Sample], problems: list[Problem]) -> Tensor[B, T]`` (teacher-forced, no grad),
which the update places in ``LossInputs.teacher_logprobs`` for distillation terms; and
``on_step(step, policy)`` to refresh snapshots. ``none`` (the default) costs nothing.
"""

from __future__ import annotations

from groupwise.registry import NoConfig, Registry

TEACHERS = Registry("teacher", "factory(cfg, policy, tokenizer) -> Teacher | None")


@TEACHERS.register("none", config=NoConfig)
def none(cfg: NoConfig, policy, tokenizer) -> None:
    return None
