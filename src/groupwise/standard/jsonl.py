"""A task read from a JSONL or Parquet file of problems with GSM8K- or MATH-style gold answers.

Each row needs a prompt column and an answer column (names configurable); the answer may be a number, a
GSM8K ``... #### 42`` solution or LaTeX (``\\frac{1}{2}``, ``\\boxed{...}``) and is stored in canonical form
(``Problem.answer == "42"``). Verification is ``math_answers.is_correct`` (see that module for the
extraction order, the equivalence rules and the ``boxed``/``truncated_box``/``percent`` options). It raises
on a verifier failure (``AnswerTooCostly`` or a math-verify exception), so the scorer counts it in
``reward/verifier_error_frac`` rather than it silently scoring the sample wrong. Without ``test_path`` a
deterministic ``test_fraction`` of the rows is held out: the rows whose prompt hashes lowest
(``stable_seed``), independent of the run seed, so every seed is evaluated on the same problems; rows with
a held-out prompt never appear in ``train``. Every other column of a row is kept in
``Problem.meta["columns"]`` (a ``python`` reward term passes them as keyword arguments, as TRL passes dataset
columns). A path ``groupwise:data/sample_math.jsonl`` names a file shipped inside the package.

Every problem with the data (a missing or unreadable file, bytes that are not UTF-8, a garbage Parquet file,
a malformed row, a non-finite numeric answer, a prompt over ``max_prompt_chars``) raises ``DataError``, one
line naming the file and line or row; ``groupwise`` prints it as ``error: <message>``. A UTF-8 byte-order
mark at the start of a JSONL file is accepted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from groupwise.seeding import stable_seed
from groupwise.standard import math_answers
from groupwise.tasks import TASKS
from groupwise.tasks.base import FewShot, chat_prompt, check_few_shot
from groupwise.types import Problem

SAMPLE_PATH = "groupwise:data/sample_math.jsonl"
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_LEVEL = re.compile(r"(?:[A-Za-z]+[ :_-]*)?(-?\d+)")


class DataError(ValueError):
    """A problem with a task's data file; the message is one line naming the file:line (or row) and the
    fix."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class JsonlConfig:
    train_path: str = ""
    """Required: a .jsonl/.ndjson/.json (one object per line) or .parquet file, or ``groupwise:<path>``."""
    test_path: str = ""
    """Held-out file; empty = hold out ``test_fraction`` of ``train_path`` deterministically."""
    test_fraction: float = 0.1
    prompt_key: str = "question"
    answer_key: str = "answer"
    reference_key: str = ""
    """Column with a worked solution (the SFT target); empty = the task has no reference traces."""
    difficulty_key: str = ""
    """Column with an integer difficulty (``"Level 5"`` reads as 5); empty = difficulty 0."""
    id_key: str = ""
    """Column with a unique id; empty = ``<file stem>/<row index>``."""
    system_prompt: str = ""
    """If set (or ``few_shot`` is), prompts are chat messages (system, user); else plain text."""
    few_shot: FewShot = ()
    """Worked examples, ``[[question, answer], ...]``, shown as earlier chat turns before every question (e.g.
    to show a small model the ``\\boxed{}`` format)."""
    max_rows: int = 0
    """Read at most this many rows of each file (0 = all)."""
    max_prompt_chars: int = 20000
    """A row whose prompt is longer is an error naming the row (a 10 MB prompt would be tokenised and run)."""
    last_number: bool = False
    """Fall back to the last number of a completion when it has no <answer>, \\boxed or #### answer."""
    boxed: math_answers.Boxed = "last"
    """Which top-level boxes answer: ``last`` (the final attempt) or ``all`` (every box, as math-verify)."""
    truncated_box: math_answers.TruncatedBox = "no_answer"
    """An unterminated last box: ``no_answer``, or ``previous`` (the boxes before it, as math-verify)."""
    percent: math_answers.Percent = "either"
    """How ``v%`` is read: v or v/100 (``either``, as math-verify), v (``strip``) or v/100 (``fraction``)."""

    def __post_init__(self) -> None:
        if not self.train_path:
            raise ValueError("train_path: required (a .jsonl or .parquet file of problems)")
        for f in ("train_path", "test_path"):
            path = getattr(self, f)
            if path and not path.lower().endswith(_JSONL_SUFFIXES + _PARQUET_SUFFIXES):
                raise ValueError(
                    f"{f}={path!r}: allowed suffixes {', '.join(_JSONL_SUFFIXES + _PARQUET_SUFFIXES)}"
                )
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction={self.test_fraction}: allowed 0 < test_fraction < 1")
        if not self.prompt_key or not self.answer_key:
            raise ValueError("prompt_key and answer_key: must be non-empty column names")
        if self.max_rows < 0:
            raise ValueError(f"max_rows={self.max_rows}: allowed >= 0 (0 = all rows)")
        check_few_shot(self.few_shot)
        if self.max_prompt_chars < 1:
            raise ValueError(f"max_prompt_chars={self.max_prompt_chars}: allowed >= 1")
        for f, allowed in (
            ("boxed", math_answers.BOXED),
            ("truncated_box", math_answers.TRUNCATED_BOX),
            ("percent", math_answers.PERCENT),
        ):
            if getattr(self, f) not in allowed:
                raise ValueError(f"{f}={getattr(self, f)!r}: allowed {', '.join(allowed)}")


def resolve_path(path: str) -> Path:
    """A filesystem path; ``groupwise:<relative path>`` names a file inside the installed package."""
    if path.startswith("groupwise:"):
        return Path(str(resources.files("groupwise").joinpath(path.split(":", 1)[1])))
    return Path(path)


# ----------------------------------------------------------------------------------------- reading
def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        with path.open(encoding="utf-8-sig") as f:  # -sig: a leading byte-order mark is not part of line 1
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
                except ValueError as e:  # e.g. an integer of more than 4300 digits
                    raise DataError(f"{where}: invalid JSON ({e})") from None
                yield where, row
    except UnicodeDecodeError as e:
        raise DataError(f"{_first_bad_line(path)}: not UTF-8 text (byte 0x{e.object[e.start]:02x}); allowed: "
                        "a UTF-8 JSONL file (re-encode it, e.g. iconv -t utf-8)") from None


def _first_bad_line(path: Path) -> str:
    """``file:line`` of the first line that is not valid UTF-8 (read again only on that error)."""
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return f"{path}:{lineno}"
    return str(path)


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"{path}: reading Parquet needs pyarrow: pip install 'groupwise[data]'") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DataError(f"{path}: not a readable Parquet file ({first})") from None
    for i, row in enumerate(rows):
        yield f"{path} row {i}", row


def _difficulty(value: Any, where: str, key: str) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return int(value)
    # a number, optionally after one word ("Level 5", "grade 3"): not any text that contains a number, so a
    # difficulty_key naming a text column (the question) is refused instead of reading its first integer
    m = _LEVEL.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise DataError(
            f"{where}: column '{key}' must be an integer (or text like 'Level 3'), got {value!r:.60}"
        )
    return int(m.group(1))


def _problem(cfg: JsonlConfig, where: str, row: Any, default_id: str) -> Problem:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in (cfg.prompt_key, cfg.answer_key, cfg.reference_key, cfg.difficulty_key, cfg.id_key):
        if key and key not in row:
            raise DataError(
                f"{where}: missing column '{key}' (columns: {', '.join(map(str, row)) or 'none'})"
            )
    prompt = row[cfg.prompt_key]
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"{where}: column '{cfg.prompt_key}' must be a non-empty string, got {prompt!r:.60}")
    if len(prompt) > cfg.max_prompt_chars:
        raise DataError(f"{where}: column '{cfg.prompt_key}' has {len(prompt)} characters; allowed <= "
                        f"max_prompt_chars={cfg.max_prompt_chars} (raise task.max_prompt_chars if intended)")
    raw = row[cfg.answer_key]
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise DataError(f"{where}: column '{cfg.answer_key}' must be a string or number, got {raw!r:.60}")
    if isinstance(raw, float) and not math.isfinite(raw):
        raise DataError(f"{where}: column '{cfg.answer_key}' is {raw!r}; allowed: a finite number or a "
                        "string")
    answer = math_answers.gold_answer(str(raw), boxed=cfg.boxed, truncated_box=cfg.truncated_box)
    if not answer:
        raise DataError(f"{where}: empty answer in column '{cfg.answer_key}' ({raw!r:.60})")
    reference = row[cfg.reference_key] if cfg.reference_key else ""
    if not isinstance(reference, str):
        raise DataError(f"{where}: column '{cfg.reference_key}' must be a string, got {reference!r:.60}")
    return Problem(
        id=str(row[cfg.id_key]) if cfg.id_key else default_id,
        prompt=chat_prompt(prompt, cfg.system_prompt, cfg.few_shot),
        answer=answer,
        difficulty=_difficulty(row[cfg.difficulty_key], where, cfg.difficulty_key)
        if cfg.difficulty_key
        else 0,
        reference=reference,
        meta={"source": where, "columns": {k: v for k, v in row.items() if k != cfg.prompt_key}},
    )


def load_problems(cfg: JsonlConfig, path: str) -> list[Problem]:
    """Every row of ``path`` as a Problem; a malformed row raises a one-line DataError naming file:line."""
    file = resolve_path(path)
    if not file.is_file():
        raise DataError(f"{path}: no such file")
    rows = _parquet_rows(file) if file.suffix.lower() in _PARQUET_SUFFIXES else _jsonl_rows(file)
    out: list[Problem] = []
    seen: dict[str, str] = {}
    for i, (where, row) in enumerate(rows):
        if cfg.max_rows and i >= cfg.max_rows:
            break
        p = _problem(cfg, where, row, default_id=f"{file.stem}/{i}")
        if p.id in seen:
            raise DataError(f"{where}: duplicate id {p.id!r} (first at {seen[p.id]})")
        seen[p.id] = where
        out.append(p)
    if not out:
        raise DataError(f"{path}: no rows")
    return out


def _user_text(p: Problem) -> str:
    return p.prompt if isinstance(p.prompt, str) else p.prompt[-1]["content"]


def split_holdout(problems: list[Problem], fraction: float) -> tuple[list[Problem], list[Problem]]:
    """(train, test): the ceil(fraction * n) rows whose prompt hashes lowest are held out, order kept."""
    if len(problems) < 2:
        raise DataError(f"need at least 2 rows to hold out a test split, got {len(problems)}; set test_path")
    k = min(len(problems) - 1, max(1, math.ceil(fraction * len(problems))))
    ranked = sorted(problems, key=lambda p: (stable_seed("jsonl-holdout", _user_text(p)), p.id))
    held = {_user_text(p) for p in ranked[:k]}  # a duplicated prompt goes to test, never to both splits
    test = [p for p in problems if _user_text(p) in held]
    train = [p for p in problems if _user_text(p) not in held]
    if not train:
        raise DataError("every row has a held-out prompt; set test_path or lower test_fraction")
    return train, test


# -------------------------------------------------------------------------------------------- task
class JsonlTask:
    """Problems from a file, verified by ``math_answers`` (see the module docstring)."""

    name = "jsonl"

    def __init__(self, cfg: JsonlConfig, seed: int = 0):
        self.cfg = cfg
        self.seed = seed
        problems = load_problems(cfg, cfg.train_path)
        if cfg.test_path:
            self.train, self.test = problems, load_problems(cfg, cfg.test_path)
            return
        try:
            self.train, self.test = split_holdout(problems, cfg.test_fraction)
        except DataError as e:
            raise DataError(f"{cfg.train_path}: {e}") from None

    def extract_answer(self, completion: str) -> str | None:
        cfg = self.cfg
        return math_answers.extract_answer(
            completion, last_number=cfg.last_number, boxed=cfg.boxed, truncated_box=cfg.truncated_box
        )

    def format_ok(self, completion: str) -> bool:
        return self.extract_answer(completion) is not None

    def verify(self, problem: Problem, completion: str) -> bool:
        """Raises on a verifier failure (see the module docstring); the scorer counts it."""
        cfg = self.cfg
        return math_answers.is_correct(
            completion,
            problem.answer,
            last_number=cfg.last_number,
            boxed=cfg.boxed,
            truncated_box=cfg.truncated_box,
            percent=cfg.percent,
        )

    def sft_examples(self, rng: random.Random, n: int) -> list[tuple[Problem, str]]:
        """(problem, reference) pairs drawn with replacement from train rows that have a reference."""
        if not self.cfg.reference_key:
            raise NotImplementedError(
                "jsonl task: sft_examples needs reference_key (a column of worked solutions)"
            )
        pool = [p for p in self.train if p.reference.strip()]
        if not pool:
            raise NotImplementedError(
                f"jsonl task: column '{self.cfg.reference_key}' is empty in every train row"
            )
        return [(p, p.reference) for p in (pool[rng.randrange(len(pool))] for _ in range(n))]


@TASKS.register("jsonl", config=JsonlConfig)
def jsonl(cfg: JsonlConfig, env) -> JsonlTask:
    return JsonlTask(cfg, env.seed)
