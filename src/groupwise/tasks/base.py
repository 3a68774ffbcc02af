"""The Task protocol: problems with gold answers, an exact verifier, and (optionally) reference traces.

A task owns no reward logic beyond ``verify``: rewards live in ``groupwise.rewards``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from groupwise.types import Problem


@runtime_checkable
class Task(Protocol):
    """What every task provides.

    ``train`` and ``test`` are indexable; a procedural task may have a huge ``train`` generated on
    access. ``verify`` returns True iff ``completion`` answers ``problem`` correctly; it may raise (the
    scorer catches, counts and zeroes). ``format_ok`` checks the answer structure only.
    ``sft_examples`` returns (problem, completion text) pairs for a warm start, or raises
    NotImplementedError when the task has no reference traces.
    """

    name: str
    train: Sequence[Problem]
    test: Sequence[Problem]

    def verify(self, problem: Problem, completion: str) -> bool: ...

    def format_ok(self, completion: str) -> bool: ...

    def extract_answer(self, completion: str) -> str | None: ...

    def sft_examples(self, rng: random.Random, n: int) -> list[tuple[Problem, str]]: ...


FewShot = tuple[tuple[str, str], ...]
"""Worked examples shown before a task's question: (user, assistant) pairs, as earlier chat turns."""


def chat_prompt(question: str, system: str = "", few_shot: FewShot = ()) -> str | tuple[dict[str, str], ...]:
    """A problem's prompt: the bare question (plain text) when there is neither a system prompt nor worked
    examples, else chat messages: the system prompt (if any), each example as a user turn and an assistant
    turn, then the question as the last user turn."""
    if not system and not few_shot:
        return question
    shots = [{"role": r, "content": c} for user, reply in few_shot
             for r, c in (("user", user), ("assistant", reply))]
    return (*([{"role": "system", "content": system}] if system else []), *shots,
            {"role": "user", "content": question})


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptForm:
    """One way of asking a task's question: a system prompt, worked examples as earlier chat turns, and a template
    for the question's own text (``{question}``: the dataset's question). ``train: false`` keeps the form out of
    training (a held-out form: a gain there is not a gain from learning one prompt)."""

    name: str
    system_prompt: str = ""
    few_shot: FewShot = ()
    template: str = "{question}"
    train: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: required (a short label such as 'worked' or 'plain')")
        check_few_shot(self.few_shot)
        if "{question}" not in self.template:
            raise ValueError(f"template={self.template!r}: must contain {{question}}")
        try:
            self.template.format(question="")
        except (IndexError, KeyError, ValueError) as e:
            raise ValueError(f"template={self.template!r}: not a valid template ({e}); write literal braces "
                             "as {{ and }}") from None

    def prompt(self, question: str) -> str | tuple[dict[str, str], ...]:
        return chat_prompt(self.template.format(question=question), self.system_prompt, self.few_shot)


def check_prompt_forms(forms: tuple[PromptForm, ...], eval_form: str) -> None:
    names = [f.name for f in forms]
    if len(set(names)) != len(names):
        raise ValueError(f"prompt_forms: names must be unique, got {names}")
    if forms and not any(f.train for f in forms):
        raise ValueError("prompt_forms: at least one form must have train: true")
    if eval_form and not forms:
        raise ValueError(f"eval_form={eval_form!r}: names one of prompt_forms, and there are none; allowed: ''")
    if eval_form and eval_form not in names:
        raise ValueError(f"eval_form={eval_form!r}: allowed '' (cycle every form) or one of {', '.join(names)}")


def check_few_shot(few_shot: FewShot) -> None:
    for i, pair in enumerate(few_shot):
        if len(pair) != 2 or not all(isinstance(x, str) and x.strip() for x in pair):
            raise ValueError(f"few_shot.{i}: allowed a [question, worked answer] pair of non-empty strings")


def render_prompt(problem: Problem, tokenizer, use_chat_template: bool = True, tools: list[dict] | None = None) -> str:
    """The prompt text fed to the model: the chat template when the tokenizer has one (``tools``: the OpenAI-style
    schemas of the tools it may call, ``rollout.tools.protocol: chat``), else plain text."""
    msgs = problem.prompt if isinstance(problem.prompt, tuple | list) else (
        {"role": "user", "content": problem.prompt},)
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(msgs), tools=tools, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in msgs) + "\n"


@runtime_checkable
class Episode(Protocol):
    """One rollout's live environment (``EpisodeTask.open_episode``). ``respond(reply)`` gets the text of each model
    turn that called no tool and returns the messages the model sees next (``[{"role": "user", "content": ...}]``),
    or None when the episode is over; ``close(text)`` ends it, told the completion's text (the sample's ``text``), and
    returns what the sample's ``meta`` keeps of it (the environment's rewards, ...). Both may raise or hang: the
    multi-turn loop bounds them (``rollout.tools.timeout_s``) and counts them (``tool_errors`` / ``tool_timeouts``),
    and an episode whose environment failed ends there."""

    def respond(self, reply: str) -> list[dict[str, str]] | None: ...

    def close(self, text: str) -> dict[str, Any]: ...


@runtime_checkable
class EpisodeTask(Protocol):
    """A task whose rollouts are episodes with an environment (an OpenEnv server, a verifiers multi-turn env): the
    multi-turn loop (``rollout.tools`` with ``protocol: chat``, ``loop/tools.py``) opens one per rollout."""

    def open_episode(self, problem: Problem) -> Episode: ...


@runtime_checkable
class EnvironmentRewards(Protocol):
    """A task whose environment scores its own episodes (a verifiers rubric, an OpenEnv environment's step rewards):
    ``episode_rewards(problem, sample)`` gives each of the environment's rewards by name as (score, weight); weight 0
    marks a metric. It may raise (that sample's failure, counted). The reward term ``environment`` reads it."""

    def episode_rewards(self, problem: Problem, sample: Any) -> dict[str, tuple[float, float]]: ...
