"""The Task protocol: problems with gold answers, an exact verifier, and (optionally) reference traces.

A task owns no reward logic beyond ``verify``: rewards live in ``groupwise.rewards``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

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


def stable_seed(*parts: object) -> int:
    """A 63-bit seed derived from any printable parts; identical across processes and platforms."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little") >> 1


def render_prompt(problem: Problem, tokenizer, use_chat_template: bool = True) -> str:
    """The prompt text fed to the model: the chat template when the tokenizer has one, else plain text."""
    msgs = problem.prompt if isinstance(problem.prompt, tuple | list) else (
        {"role": "user", "content": problem.prompt},)
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(msgs), tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in msgs) + "\n"
