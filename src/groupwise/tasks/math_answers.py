"""Answer extraction and equivalence for GSM8K- and MATH-style answers, on top of ``math-verify``.

The last answer attempt decides: the last ``<answer>...</answer>``, else the last top-level ``\\boxed{}``
(an unterminated one extracts nothing), else the last ``#### X``, else (``last_number=True``) the last number.
``normalize`` canonicalises the string (unicode minus, ``$`` wrappers, ``1,000``, trailing ``.``/``%``/unit
word); ``answers_match`` compares by string, then by math-verify (symbolic, numeric to 6 places).
math-verify runs with its signal.alarm timeouts off (they raise outside the main thread); the scorer bounds
the time. ``too_costly`` rejects inputs that stall sympy in uninterruptible big-integer arithmetic (only a
process-based timeout could stop those). Parser errors yield False.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
_NUMBER = re.compile(r"[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_MINUS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_UNIT_WORD = re.compile(r"([+-]?[\d,]*\d(?:\.\d+)?)\s+[A-Za-z]{3,}")
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))

MAX_ANSWER_CHARS = 300
"""Longer extracted answers are not parsed (and never match unless string-equal to the gold)."""
MAX_NESTING = 8
"""Deeper bracket nesting is not parsed: latex2sympy's time grows exponentially with depth (~1 s at 8)."""


# ------------------------------------------------------------------------------------------ extraction
def _box_content(text: str, start: int) -> tuple[str, int] | None:
    """The argument of the box command starting at ``start`` and the index after it; None if unterminated."""
    i = _BOX.match(text, start).end()  # type: ignore[union-attr]
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":  # ``\boxed 5``: a single token argument
        m = re.match(r"[^\s$]+", text[i:])
        return (m.group(0), i + m.end()) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{" and text[j - 1] != "\\":
            depth += 1
        elif text[j] == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j], j + 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last top-level ``\\boxed{}``/``\\fbox{}``; None if absent or unterminated."""
    last: str | None = None
    end = 0
    found = False
    for m in _BOX.finditer(text):
        if m.start() < end:  # nested inside the previous top-level box
            continue
        found = True
        got = _box_content(text, m.start())
        if got is None:  # a truncated final box: the last attempt is broken, earlier boxes don't count
            return None
        last, end = got
    return last if found else None


def extract_answer(text: str, *, last_number: bool = False) -> str | None:
    """The normalised final answer of a completion (or of a gold string), or None when there is none."""
    if not isinstance(text, str):
        return None
    tags = _ANSWER_TAG.findall(text)
    if tags:
        raw: str | None = tags[-1]
    elif _BOX.search(text):
        raw = last_boxed(text)
    elif "####" in text:
        raw = _GSM8K.findall(text)[-1]
    elif last_number:
        nums = _NUMBER.findall(text.replace("{,}", ","))
        raw = nums[-1] if nums else None
    else:
        raw = None
    out = normalize(raw) if raw is not None else ""
    return out or None


def gold_answer(raw: str) -> str:
    """A gold answer in canonical form: ``#### 42``, ``\\boxed{...}`` or ``<answer>`` wrappers removed.

    Empty when ``raw`` has an answer marker with nothing usable behind it (``"####"``, ``"\\boxed{"``)."""
    got = extract_answer(raw)
    if got is not None:
        return got
    return "" if "####" in raw or "<answer>" in raw or _BOX.search(raw) else normalize(raw)


def normalize(s: str) -> str:
    """String-level normalisation shared by predictions and gold answers (idempotent)."""
    s = s.strip()
    if "<answer>" in s:  # ``<answer><answer>5</answer>`` matches lazily from the first tag
        s = s.rsplit("<answer>", 1)[1].strip()
    while _BOX.search(s):
        inner = last_boxed(s)
        if inner is None:
            return ""
        s = inner.strip()
    s = s.translate(_MINUS)
    for _ in range(3):  # ``$5$.``, ``$5.$`` and ``\(\$5\)`` need more than one pass
        s = re.sub(r"[\s.]+$", "", s)
        for left, right in _WRAPPERS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
                break
    s = s.replace("\\$", "").replace("{,}", ",").strip()
    if s.startswith("$") and "$" not in s[1:]:  # a currency sign, not math mode
        s = s[1:].strip()
    s = re.sub(r"\s*\\?%$", "", s)
    m = _UNIT_WORD.fullmatch(s)
    if m:
        s = m.group(1)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return re.sub(r"\.+$", "", s).strip()


# ---------------------------------------------------------------------------------------- equivalence
def _nesting(s: str) -> int:
    depth = best = 0
    for c in s:
        if c in "({[":
            depth += 1
            best = max(best, depth)
        elif c in ")}]":
            depth -= 1
    return best


def _exponents(s: str) -> list[str]:
    """The exponent argument of every ``^`` (braced content or the next token)."""
    out = []
    for m in re.finditer(r"\^\s*", s):
        i = m.end()
        if i < len(s) and s[i] == "{":
            depth = 0
            for j in range(i, len(s)):
                depth += (s[j] == "{") - (s[j] == "}")
                if depth == 0:
                    out.append(s[i + 1 : j])
                    break
            else:
                out.append(s[i + 1 :])
        else:
            tok = re.match(r"[-\w(.]*", s[i:])
            out.append(tok.group(0) if tok else "")
    return out


def too_costly(s: str) -> bool:
    """True if an answer can stall sympy: long, deep nesting, numeric exponent towers, huge factorials."""
    if len(s) > MAX_ANSWER_CHARS or _nesting(s) > MAX_NESTING:
        return True
    for exp in _exponents(s):
        symbolic = re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", exp))
        if ("^" in exp and not symbolic) or re.search(r"\d{7,}", exp):
            return True  # 10^{10^{10}} or 10^{10000000000}: a 10-billion-digit integer
    if "!" in s or re.search(r"\\[dt]?binom|\\choose", s):
        return "^" in s or re.search(r"\d{6,}", s) is not None
    return False


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # math-verify warns once that its timeouts are off; they are off on purpose (see module docstring)
        return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def _math_verify() -> Any:
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutWarning())
    return math_verify


@functools.lru_cache(maxsize=8192)
def _parse(s: str) -> tuple[Any, ...]:
    mv = _math_verify()
    # Wrapping in $...$ parses the whole string as one LaTeX expression, so "5 or 7" is the set {5, 7} (not
    # its last number) and plain numbers, fractions and decimals all parse. A string that still holds a $
    # is text with inline math ("the answer is $5$"): let the extractor find the math.
    text = s if "$" in s else f"${s}$"
    return tuple(mv.parse(text, extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=None))


def answers_match(gold: str, pred: str) -> bool:
    """True iff the extracted ``pred`` equals ``gold`` as a string or mathematically (math-verify)."""
    g, p = normalize(gold), normalize(pred)
    if not g or not p:
        return False
    if g == p:
        return True
    if too_costly(g) or too_costly(p):
        return False
    try:
        gp, pp = _parse(g), _parse(p)
        if not gp or not pp:
            return False
        return bool(_math_verify().verify(list(gp), list(pp), timeout_seconds=None))
    except Exception:  # a crashing parser means "not verified", never a crashed scorer
        return False


def is_correct(completion: str, gold: str, *, last_number: bool = False) -> bool:
    """Extract the completion's final answer and compare it with the gold answer (raw or ``#### n`` form)."""
    pred = extract_answer(completion, last_number=last_number)
    return pred is not None and answers_match(gold_answer(gold), pred)
