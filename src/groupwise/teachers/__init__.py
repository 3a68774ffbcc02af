"""Teachers: token distributions of a (possibly privileged) teacher on the student's own completions.

Registry form: ``factory(cfg, env) -> Teacher | None`` (``none``, the default, builds nothing and costs
nothing). The update asks the teacher, per micro-batch and only when a loss term with non-zero weight
declares ``needs`` ``teacher`` / ``teacher_topk`` / ``teacher_vocab``, for a ``TeacherOutput`` (types.py),
and places it in ``LossInputs.teacher``; ``on_step(step, policy)`` runs after every update (an EMA teacher
moves there). Teacher forward passes are counted in ``teacher/*`` metrics. Kinds: ``standard/teachers.py``.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any, Protocol, runtime_checkable

from groupwise.registry import Registry, anything, described
from groupwise.types import Problem, Sample, TeacherOutput

PRIVILEGED_CONTEXT = "{prompt}\n<ref>{reference}</ref>"
"""The default privileged context (the lab's ``privileged_frac`` warm start shows the model the same form)."""


def privileged_problem(problem: Problem, template: str) -> Problem:
    """The problem with its (last) user message rewritten by ``template``."""
    msgs = problem.prompt if isinstance(problem.prompt, tuple | list) else None
    text = msgs[-1]["content"] if msgs else problem.prompt
    if "{reference}" in template and not problem.reference.strip():
        raise ValueError(f"teacher context uses {{reference}} but problem {problem.id!r} has none "
                         "(for the jsonl task set task.reference_key)")
    rendered = template.format(prompt=text, reference=problem.reference, answer=problem.answer)
    prompt = (*msgs[:-1], {**msgs[-1], "content": rendered}) if msgs else rendered
    return dataclasses.replace(problem, prompt=prompt)


FIELDS = ("prompt", "reference", "answer")
"""The fields a teacher's ``context`` template may name."""


def check_template(template: str) -> None:
    """Refuse a context template that is not a ``str.format`` template over ``FIELDS`` (at load: a teacher's and
    RLCSD's hinted contexts)."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"context={template!r}: not a valid template ({e})") from None
    bad = [n for n in names if n not in FIELDS]
    if bad:
        raise ValueError(f"context={template!r}: unknown field {{{bad[0]}}}; allowed: "
                         + ", ".join("{" + f + "}" for f in FIELDS))


@dataclasses.dataclass(frozen=True)
class TeacherWant:
    """What the active loss terms need beyond the sampled tokens' log-probs."""

    topk: bool = False  # the teacher's top-k support (its own ``top_k``) and tail mass
    vocab: bool = False  # the full-vocabulary log-probs


@runtime_checkable
class Teacher(Protocol):
    """``score`` runs one teacher-forced pass (no grad) over the rows' completions under the teacher's
    context and returns completion-aligned outputs (padded positions 0), whatever the context lengths."""

    def score(self, samples: list[Sample], problems: list[Problem], want: TeacherWant) -> TeacherOutput: ...

    def on_step(self, step: int, policy: Any) -> None: ...


def score_contract(out: object, samples: list, *_: object) -> str:
    """What is wrong with a teacher's ``score`` output ("" when nothing)."""
    if isinstance(out, TeacherOutput):
        return ""
    return f"returned {described(out)} for {len(samples)} samples; the contract is a TeacherOutput"


TEACHERS = Registry("teacher", Teacher, "factory", ("cfg", "env"), optional=True,
                    contract={"score": score_contract, "on_step": anything})
