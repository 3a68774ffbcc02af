"""Any reasoning-gym dataset as a task: ``reasoning_gym.create_dataset(name, seed=, size=, **dataset_args)``.

Each entry's ``question`` becomes the prompt, its ``answer`` the gold answer, and the whole entry is kept in
``Problem.meta["entry"]`` because the dataset's own ``score_answer(answer, entry)`` is the verifier: a
completion is correct iff that score is >= ``min_score``. The default scorer gives partial credit
``len(oracle) / len(answer)`` when the oracle is a substring of the answer (oracle "6", answer "16" scores
0.5), so the default ``min_score`` is 1.0. The answer is the last ``<answer>...</answer>`` (reasoning-gym's
``extract_answer``); a completion without one is wrong. The test split comes from a seed that depends only
on the dataset name, the train split from one that also depends on the run seed; a train item whose
question is in the test split is replaced by the same index of a reseeded copy (best effort: a tiny problem
space can exhaust the retries). reasoning-gym is an optional extra (``pip install 'groupwise[gym]'``).

``scorer: math_verify`` scores real-format math instead: the completion's final answer is read as the jsonl
task reads it (the last ``<answer>``, else the last top-level ``\\boxed{}``, else ``#### x``:
``math_answers.extract_answer``) and compared with the gold answer by ``math_answers.answers_match``
(string, then math-verify), all or nothing: no substring credit. ``few_shot`` puts worked examples before
every question as earlier chat turns (both tasks have it: ``tasks/base.py``); ``prompt_forms`` asks in several
forms, one or more held out of training. ``reference: running_totals`` gives + / - chains a worked reference (the
SFT target of ``sft_examples`` and a privileged teacher's ``{reference}``).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import random
import re
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from groupwise.seeding import stable_seed
from groupwise.standard import math_answers
from groupwise.tasks import TASKS
from groupwise.tasks.base import FewShot, PromptForm, chat_prompt, check_few_shot, check_prompt_forms
from groupwise.types import Problem

DEFAULT_SYSTEM_PROMPT = (
    "Solve the problem. Think step by step, then give only the final answer inside <answer></answer> tags, "
    "for example <answer>42</answer>."
)
_RESEED_TRIES = 8
MODES = ("<NT>", "<SH>", "<LG>")  # the think_modes builder's tags

Scalar = bool | int | float | str


def _gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError(
            "the reasoning_gym task needs reasoning-gym: pip install 'groupwise[gym]'"
        ) from None
    return reasoning_gym


def _registered() -> dict[str, tuple[type, type]]:
    from reasoning_gym.factory import DATASETS

    return DATASETS


def _check_dataset(name: str, args: dict[str, Any]) -> None:
    """Raise a one-line ValueError for an unknown dataset name or a bad dataset_args key or value."""
    _gym()
    datasets = _registered()
    if name not in datasets:
        close = difflib.get_close_matches(name, datasets, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        examples = ", ".join(
            n
            for n in ("basic_arithmetic", "chain_sum", "countdown", "gsm_symbolic", "products")
            if n in datasets
        )
        raise ValueError(
            f"dataset={name!r}: unknown reasoning_gym dataset{hint}; e.g. {examples} "
            f"({len(datasets)} in all, see reasoning_gym.factory.DATASETS)"
        )
    allowed = sorted(f.name for f in dataclasses.fields(datasets[name][1]) if f.name not in ("seed", "size"))
    for key in args:
        if key not in allowed:
            raise ValueError(
                f"dataset_args.{key}: not a {name} option (seed and size are set by the task); "
                f"allowed: {', '.join(allowed)}"
            )
    try:  # reasoning-gym validates with assert; a dataset config is cheap to build
        config = datasets[name][1](**args)
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"dataset_args for {name!r}: {e or type(e).__name__}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GymConfig:
    dataset: str = "basic_arithmetic"
    """A name in ``reasoning_gym.factory.DATASETS``."""
    size: int = 1000
    """Train problems (a lazily generated sequence)."""
    test_size: int = 100
    dataset_args: dict[str, Scalar | tuple[Scalar, ...]] = dataclasses.field(default_factory=dict, hash=False)
    """The dataset's own config fields, e.g. ``{max_digits: 1, operators: ['+', '-']}``. YAML integers and
    floats arrive as int/float and YAML lists as tuples (reasoning-gym accepts both)."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """Empty (and no ``few_shot``) = the prompt is the bare question (plain text) instead of chat messages."""
    few_shot: FewShot = ()
    """Worked examples, ``[[question, answer], ...]``, shown as earlier chat turns before every question."""
    prompt_forms: tuple[PromptForm, ...] = ()
    """Several ways of asking (``tasks/base.py`` ``PromptForm``: name, system_prompt, few_shot, template, train)
    instead of ``system_prompt`` and ``few_shot``: train problem i is asked in a training form drawn from
    (run seed, i); test problem i in the form ``eval_form`` names."""
    eval_form: str = ""
    """The held-out problems' form: a ``prompt_forms`` name, or "" = problem i in form i mod (every form,
    held-out ones included), so one eval covers every form (each record's form: ``Problem.meta["form"]``)."""
    scorer: Literal["dataset", "math_verify"] = "dataset"
    """``dataset``: the dataset's own ``score_answer`` on the last ``<answer>``; ``math_verify``: the final
    answer (``<answer>``, ``\\boxed{}`` or ``####``) equal to the gold by math-verify (module docstring)."""
    min_score: float = 1.0
    """Correct iff the dataset's ``score_answer`` >= min_score (substrings get partial credit); ``dataset``
    scorer only."""
    difficulty_key: str = "difficulty"
    """Metadata key read as ``Problem.difficulty`` when its value is a number (e.g. ``num_terms``), else 0."""
    reference: Literal["none", "running_totals", "running_totals_check"] = "none"
    """``running_totals``: each problem's ``reference`` (the SFT target of ``sft_examples``, a privileged teacher's
    ``{reference}``) is its chain worked left to right, ``"8 + 6 = 14. 14 - 3 = 11. The final answer is
    \\boxed{11}."``, built from the entry's ``metadata.expression`` (integers joined by ``+`` and ``-``: e.g.
    ``basic_arithmetic`` without parentheses or ``chain_sum``); an entry of another form is refused.
    ``running_totals_check``: the same with the last step written again before the answer (``"... 14 - 3 = 11.
    Check: 14 - 3 = 11. The final answer is ..."``), redundant tokens that a length method can learn to drop."""
    modes: bool = False
    """Mode-tagged warm-up traces for adaptive think modes (the ``think_modes`` builder): each ``sft_examples``
    trace starts with a tag drawn uniformly, then a space: ``<NT>`` the answer alone (``"<NT> The final answer is
    \\boxed{11}."``), ``<SH>`` two operations a sentence (``"<SH> 8 + 6 - 3 = 11. The final answer is ..."``),
    ``<LG>`` the ``running_totals_check`` trace (one operation a sentence, the last re-checked). Needs ``reference:
    running_totals_check``; ``Problem.reference`` stays the untagged trace (what a teacher reads)."""

    def __post_init__(self) -> None:
        if not self.dataset:
            raise ValueError("dataset: required (a reasoning_gym dataset name such as 'basic_arithmetic')")
        if self.size < 1 or self.test_size < 1:
            raise ValueError(f"size={self.size}, test_size={self.test_size}: both must be >= 1")
        check_few_shot(self.few_shot)
        check_prompt_forms(self.prompt_forms, self.eval_form)
        if self.prompt_forms and self.few_shot:
            raise ValueError("few_shot: give worked examples inside each of prompt_forms, not beside them")
        if self.scorer not in ("dataset", "math_verify"):
            raise ValueError(f"scorer={self.scorer!r}: allowed dataset, math_verify")
        if not 0.0 < self.min_score <= 1.0:
            raise ValueError(f"min_score={self.min_score}: allowed 0 < min_score <= 1")
        if self.reference not in ("none", "running_totals", "running_totals_check"):
            raise ValueError(f"reference={self.reference!r}: allowed none, running_totals, running_totals_check")
        if self.modes and self.reference != "running_totals_check":
            raise ValueError(f"modes=true needs reference: running_totals_check (its <LG> trace), "
                             f"got {self.reference!r}")
        # Names and option keys are checked here when reasoning-gym is installed, so a recipe fails at load
        # time with its file:line; without it, building the task raises the install hint instead.
        if importlib.util.find_spec("reasoning_gym") is not None:
            _check_dataset(self.dataset, self.dataset_args)


class _TrainSeq(Sequence[Problem]):
    """Item i is the train dataset's entry i, or the first reseeded copy's entry i not in the test split."""

    def __init__(self, task: GymTask, n: int):
        self._task, self._n = task, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._task._train_item(j) for j in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._task._train_item(i % self._n)

    def __iter__(self) -> Iterator[Problem]:
        return (self._task._train_item(i) for i in range(self._n))


class GymTask:
    """A reasoning-gym dataset scored by its own ``score_answer`` (see the module docstring)."""

    def __init__(self, cfg: GymConfig, seed: int = 0):
        _check_dataset(cfg.dataset, cfg.dataset_args)
        self.cfg = cfg
        self.seed = seed
        self.name = f"reasoning_gym/{cfg.dataset}"
        self._spares: dict[int, Any] = {}
        test_ds = self._dataset(stable_seed("reasoning_gym-test", cfg.dataset) % 2**32, cfg.test_size)
        self._scorer = test_ds
        self.test = [self._problem("test", i, test_ds[i]) for i in range(cfg.test_size)]
        self._test_questions = {p.meta["entry"]["question"] for p in self.test}
        self.train = _TrainSeq(self, cfg.size)

    def _dataset(self, seed: int, size: int) -> Any:
        try:
            return _gym().create_dataset(self.cfg.dataset, seed=seed, size=size, **self.cfg.dataset_args)
        except (AssertionError, TypeError, ValueError) as e:  # reasoning-gym validates with assert
            raise ValueError(f"dataset_args for {self.cfg.dataset!r}: {e or type(e).__name__}") from None

    def _spare(self, k: int) -> Any:
        if k not in self._spares:
            self._spares[k] = self._dataset(
                stable_seed("reasoning_gym-train", self.cfg.dataset, self.seed, k) % 2**32, self.cfg.size
            )
        return self._spares[k]

    def _train_item(self, i: int) -> Problem:
        for k in range(_RESEED_TRIES + 1):
            entry = self._spare(k)[i]
            if entry["question"] not in self._test_questions:
                break
        return self._problem("train", i, entry)

    def _form(self, split: str, i: int) -> PromptForm | None:
        forms, name = self.cfg.prompt_forms, self.cfg.eval_form
        if not forms:
            return None
        if split == "test":
            return next(f for f in forms if f.name == name) if name else forms[i % len(forms)]
        train = [f for f in forms if f.train]
        return train[stable_seed("prompt-form", self.seed, i) % len(train)]

    def _problem(self, split: str, i: int, entry: dict[str, Any]) -> Problem:
        question = str(entry["question"])
        difficulty = entry.get("metadata", {}).get(self.cfg.difficulty_key)
        number = isinstance(difficulty, int | float) and not isinstance(difficulty, bool)
        form = self._form(split, i)
        reference = ("" if self.cfg.reference == "none" else
                     running_totals(entry, self.cfg.dataset, check=self.cfg.reference == "running_totals_check"))
        return Problem(
            id=f"{self.name}/{split}/{i}",
            prompt=form.prompt(question) if form else chat_prompt(question, self.cfg.system_prompt,
                                                                  self.cfg.few_shot),
            answer=str(entry["answer"]),
            reference=reference,
            difficulty=int(difficulty) if number else 0,
            meta={"entry": entry} | ({"form": form.name} if form else {}),
        )

    # ---------------------------------------------------------------------------------- verifier
    def extract_answer(self, completion: str) -> str | None:
        if self.cfg.scorer == "math_verify":
            return math_answers.extract_answer(completion)
        from reasoning_gym.utils import extract_answer

        return extract_answer(completion)

    def format_ok(self, completion: str) -> bool:
        return bool(self.extract_answer(completion))

    def score(self, problem: Problem, completion: str) -> float:
        """The dataset's own score in [0, 1] for the extracted answer; 0 when there is no answer."""
        answer = self.extract_answer(completion)
        if not answer:
            return 0.0
        if self.cfg.scorer == "math_verify":  # raises on a verifier failure: the scorer counts it
            return float(math_answers.answers_match(math_answers.gold_answer(problem.answer), answer))
        entry = problem.meta.get("entry") or {
            "question": _question(problem),
            "answer": problem.answer,
            "metadata": {},
        }
        return float(self._scorer.score_answer(answer, entry))

    def verify(self, problem: Problem, completion: str) -> bool:
        return self.score(problem, completion) >= self.cfg.min_score

    def sft_examples(self, rng: random.Random, n: int) -> list[tuple[Problem, str]]:
        """(problem, reference) pairs of random train problems, with ``reference: running_totals``."""
        if self.cfg.reference == "none":
            raise NotImplementedError(
                f"reasoning_gym task {self.cfg.dataset!r} has no reference solutions to warm start from "
                "(reference: running_totals builds them for + / - chains); or use the lab task or a jsonl task "
                "with reference_key"
            )
        problems = [self.train[rng.randrange(len(self.train))] for _ in range(n)]
        if not self.cfg.modes:
            return [(p, p.reference) for p in problems]
        out = []
        for p in problems:
            mode = rng.choice(MODES)
            if mode == "<NT>":
                trace = f"The final answer is \\boxed{{{p.answer}}}."
            elif mode == "<SH>":
                trace = running_totals(p.meta["entry"], self.cfg.dataset, per_sentence=2)
            else:
                trace = p.reference
            out.append((p, f"{mode} {trace}"))
        return out


_TERM = re.compile(r"\s*([+-])\s*(\d+)")


def running_totals(entry: dict[str, Any], dataset: str, check: bool = False, per_sentence: int = 1) -> str:
    """The chain in ``entry["metadata"]["expression"]`` worked left to right, ``per_sentence`` operations to a
    sentence ending in the running total (with ``check``, the last sentence written again after "Check:"), and the
    boxed result (which must equal the entry's answer)."""
    expr = str(entry.get("metadata", {}).get("expression", ""))
    first = re.match(r"\s*(-?\d+)", expr)
    terms = _TERM.findall(expr[first.end():]) if first else []
    if not first or not terms or "".join(f"{op}{n}" for op, n in terms) != re.sub(r"\s", "", expr[first.end():]):
        raise ValueError(f"reference=running_totals: {dataset} expression {expr!r} is not integers joined by + and -")
    total, steps = int(first.group(1)), []
    for i in range(0, len(terms), per_sentence):
        start = total
        for op, n in terms[i:i + per_sentence]:
            total = total + int(n) if op == "+" else total - int(n)
        ops = " ".join(f"{op} {n}" for op, n in terms[i:i + per_sentence])
        steps.append(f"{start} {ops} = {total}.")
    if str(total) != str(entry["answer"]).strip():
        raise ValueError(f"reference=running_totals: {expr!r} gives {total}, the entry's answer is {entry['answer']!r}")
    if check:
        steps.append(f"Check: {steps[-1]}")
    return " ".join(steps) + f" The final answer is \\boxed{{{total}}}."


def _question(p: Problem) -> str:
    return p.prompt if isinstance(p.prompt, str) else p.prompt[-1]["content"]


@TASKS.register("reasoning_gym", config=GymConfig)
def reasoning_gym(cfg: GymConfig, env) -> GymTask:
    return GymTask(cfg, env.seed)
