"""Answer extraction and equivalence for GSM8K- and MATH-style answers, on top of ``math-verify``.

The last answer attempt decides: the last ``<answer>...</answer>``, else the top-level ``\\boxed{}``
boxes, else the last ``#### X``, else (``last_number=True``) the last number. ``normalize`` canonicalises
the string (unicode minus, ``$`` wrappers, ``1,000``, trailing ``.``/unit word; a trailing ``%`` becomes
``\\%`` after a number and is dropped after anything else); ``answers_match`` compares by string, then by
math-verify (symbolic, numeric to 6 places).

Three rules where math-verify (0.9) judges differently are options (``JsonlConfig`` has the same fields):

- ``boxed``: ``"last"`` (default) takes the last top-level box: the final attempt counts, as the verl and
  Qwen-math evaluators do, so ``\\boxed{7} wait, \\boxed{8}`` answers 8. ``"all"``: every top-level box
  forms the answer (a repeated value counts once), as math-verify, so two different boxed values are a
  set that matches neither value, only a gold equal to that set.
- ``truncated_box``: ``"no_answer"`` (default): an unterminated last box extracts nothing, because
  crediting an earlier box would reward a completion cut off mid-revision. ``"previous"``: the complete
  boxes before it decide, as math-verify.
- ``percent``: ``"either"`` (default, to agree with math-verify): a number with a percent sign, ``v\\%``,
  matches the other side read as v or as v/100 (math-verify allows v only when both are integers);
  ``"strip"``: v only; ``"fraction"``: v/100 only. When both sides carry the sign their values compare.

Failures are left to the caller (the scorer counts them in ``reward/verifier_error_frac``), never turned
into False here: math-verify runs with ``raise_on_error=True``, so its parser and verifier exceptions
propagate, and an answer that ``too_costly`` flags (a shape that stalls sympy in uninterruptible
big-integer arithmetic, which only a process-based timeout could stop) raises ``AnswerTooCostly`` before
parsing. An answer that parses to nothing is simply wrong (False). math-verify runs with its signal.alarm
timeouts off (they raise outside the main thread); the scorer bounds the time.
"""

from __future__ import annotations

import functools
import logging
import re
from decimal import Decimal
from typing import Any, Literal, get_args

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
_NUMBER = re.compile(r"[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_MINUS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_UNIT_WORD = re.compile(r"([+-]?[\d,]*\d(?:\.\d+)?)\s+[A-Za-z]{3,}")
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_PLAIN_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
_BRACE = re.compile(r"[{}]")
_TOKEN = re.compile(r"[^\s$]+")

# The values of the three options in the module docstring (``JsonlConfig`` fields of the same names)
Boxed = Literal["last", "all"]
TruncatedBox = Literal["no_answer", "previous"]
Percent = Literal["either", "strip", "fraction"]
BOXED: tuple[str, ...] = get_args(Boxed)
TRUNCATED_BOX: tuple[str, ...] = get_args(TruncatedBox)
PERCENT: tuple[str, ...] = get_args(Percent)

MAX_ANSWER_CHARS = 300
"""Longer extracted answers are not parsed: they raise ``AnswerTooCostly`` unless string-equal to the gold."""
MAX_NESTING = 8
"""Deeper bracket nesting is not parsed: latex2sympy's time grows exponentially with depth (~1 s at 8)."""


class AnswerTooCostly(ValueError):
    """An answer ``too_costly`` refuses to parse; the one-line message names the guard that tripped."""


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


def boxed_answer(
    text: str, *, boxed: Boxed = "last", truncated_box: TruncatedBox = "no_answer"
) -> str | None:
    """The answer held by the top-level ``\\boxed{}``/``\\fbox{}`` boxes of ``text``; None if there is none.

    ``boxed="last"``: the last box's content. ``"all"``: the normalised contents of every box, each value
    once, joined by ``", "`` (a set to math-verify). An unterminated box ends the scan: the answer is None
    (``truncated_box="no_answer"``) or comes from the complete boxes before it (``"previous"``)."""
    contents: list[str] = []
    end = 0
    for m in _BOX.finditer(text):
        if m.start() < end:  # nested inside the previous top-level box
            continue
        got = _box_content(text, m.start())
        if got is None:
            if truncated_box == "no_answer":
                return None
            break
        contents.append(got[0])
        end = got[1]
    if not contents:
        return None
    if boxed == "last":
        return contents[-1]
    return ", ".join(dict.fromkeys(v for v in map(normalize, contents) if v)) or None


def extract_answer(
    text: str, *, last_number: bool = False, boxed: Boxed = "last", truncated_box: TruncatedBox = "no_answer"
) -> str | None:
    """The normalised final answer of a completion (or of a gold string), or None when there is none.

    ``boxed`` and ``truncated_box`` apply to the boxes of the completion or of its last ``<answer>``."""
    if not isinstance(text, str):
        return None
    tags = _ANSWER_TAG.findall(text)
    if tags:
        raw: str | None = tags[-1]
        if _BOX.search(raw):
            raw = boxed_answer(raw, boxed=boxed, truncated_box=truncated_box)
    elif _BOX.search(text):
        raw = boxed_answer(text, boxed=boxed, truncated_box=truncated_box)
    elif "####" in text:
        raw = _GSM8K.findall(text)[-1]
    elif last_number:
        nums = _NUMBER.findall(text.replace("{,}", ","))
        raw = nums[-1] if nums else None
    else:
        raw = None
    out = normalize(raw) if raw is not None else ""
    return out or None


def gold_answer(raw: str, *, boxed: Boxed = "last", truncated_box: TruncatedBox = "no_answer") -> str:
    """A gold answer in canonical form: ``#### 42``, ``\\boxed{...}`` or ``<answer>`` wrappers removed.

    Empty when ``raw`` has an answer marker with nothing usable behind it (``"####"``, ``"\\boxed{"``)."""
    got = extract_answer(raw, boxed=boxed, truncated_box=truncated_box)
    if got is not None:
        return got
    return "" if "####" in raw or "<answer>" in raw or _BOX.search(raw) else normalize(raw)


def normalize(s: str) -> str:
    """String-level normalisation shared by predictions and gold answers (idempotent).

    A box still left in ``s`` is unwrapped with the default rules (last box; unterminated = empty). A
    trailing ``%``, ``\\%`` or `` percent`` becomes ``\\%`` after a plain number and is dropped otherwise."""
    s = s.strip()
    if "<answer>" in s:  # ``<answer><answer>5</answer>`` matches lazily from the first tag
        s = s.rsplit("<answer>", 1)[1].strip()
    s = _unbox(s)
    s = s.translate(_MINUS)
    for _ in range(3):  # ``$5$.``, ``$5.$`` and ``\(\$5\)`` need more than one pass
        s = _strip_trailing_dots(s)
        for left, right in _WRAPPERS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
                break
    s = s.replace("\\$", "").replace("{,}", ",").strip()
    if s.startswith("$") and "$" not in s[1:]:  # a currency sign, not math mode
        s = s[1:].strip()
    s, percent = _strip_percent(s)
    m = _UNIT_WORD.fullmatch(s)
    if m:
        s = m.group(1)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = s.rstrip(".").strip()  # s has no trailing newline here, so this is the old ``re.sub(r"\.+$", "", s)``
    return s + "\\%" if percent and _PLAIN_NUMBER.fullmatch(s) else s


def _unbox(s: str) -> str:
    """``while _BOX.search(s): s = boxed_answer(s).strip()`` ("" once a box is unterminated), in linear time.

    Each pass takes the last top-level box of the current span; the spans are slices of ``s`` and the braces
    are matched once (``_brace_pairs``), so ``\\boxed{`` nested 4000 deep costs one scan, not 4000 (12 s)."""
    if not _BOX.search(s):
        return s
    pairs = _brace_pairs(s)
    a, b = 0, len(s)
    while (m := _BOX.search(s, a, b)) is not None:
        span = None
        while m is not None:  # the top-level boxes of s[a:b], left to right, jumping over their contents
            got = _box_span(s, m.end(), b, pairs)
            if got is None:
                return ""
            span = got[:2]
            m = _BOX.search(s, got[2], b)
        a, b = span
        while a < b and s[a].isspace():
            a += 1
        while b > a and s[b - 1].isspace():
            b -= 1
    return s[a:b]


def _brace_pairs(s: str) -> dict[int, int]:
    """Each unescaped ``{`` of ``s`` -> the unescaped ``}`` that closes it (``_box_content``'s depth rule)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE.finditer(s):
        j = m.start()
        if j and s[j - 1] == "\\":
            continue
        if s[j] == "{":
            stack.append(j)
        elif stack:
            pairs[stack.pop()] = j
    return pairs


def _box_span(s: str, i: int, b: int, pairs: dict[int, int]) -> tuple[int, int, int] | None:
    """``_box_content`` on ``s[:b]`` for the box command ending at ``i``: (content start, content end, index
    after the box), or None if it is unterminated within ``b``."""
    while i < b and s[i] == " ":
        i += 1
    if i >= b:
        return None
    if s[i] != "{":  # ``\boxed 5``: a single token argument
        m = _TOKEN.match(s, i, b)
        return (i, m.end(), m.end()) if m else None
    j = pairs.get(i)
    return (i + 1, j, j + 1) if j is not None and j < b else None


def _strip_trailing_dots(s: str) -> str:
    r"""``s`` without its trailing run of whitespace and dots, in linear time (``re.sub(r"[\s.]+$", "", s)``
    retries the run from each of its positions: quadratic, 19 s for a 20k-character ``"1 . . . x"``)."""
    end = len(s)
    while end and (s[end - 1] == "." or s[end - 1].isspace()):
        end -= 1
    return s[:end]


def _strip_percent(s: str) -> tuple[str, bool]:
    """``s`` without its trailing percent signs (``%``, ``\\%``, `` percent``) and whether it had any."""
    had = False
    while True:
        if s.endswith("%"):
            s = s[:-1].removesuffix("\\").rstrip()
        elif s.lower().endswith(" percent"):
            s = s[: -len(" percent")].rstrip()
        else:
            return s, had
        had = True


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


def cost_guard(s: str) -> str | None:
    """The guard an answer trips because it can stall sympy (long, deep nesting, numeric exponent towers,
    huge factorials), as a short phrase; None if it is cheap to parse."""
    if len(s) > MAX_ANSWER_CHARS:
        return f"length {len(s)} > MAX_ANSWER_CHARS={MAX_ANSWER_CHARS}"
    if _nesting(s) > MAX_NESTING:
        return f"bracket nesting {_nesting(s)} > MAX_NESTING={MAX_NESTING}"
    for exp in _exponents(s):
        symbolic = re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", exp))
        if ("^" in exp and not symbolic) or re.search(r"\d{7,}", exp):
            return "numeric exponent tower or 7+ digit exponent"  # a 10-billion-digit integer
    huge = "^" in s or re.search(r"\d{6,}", s) is not None
    if huge and ("!" in s or re.search(r"\\[dt]?binom|\\choose", s)):
        return "factorial or binomial of a power or 6+ digit number"
    return None


def too_costly(s: str) -> bool:
    """True if an answer can stall sympy (``cost_guard`` names the reason)."""
    return cost_guard(s) is not None


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
    config = [mv.LatexExtractionConfig()]
    return tuple(mv.parse(text, extraction_config=config, parsing_timeout=None, raise_on_error=True))


def _hundredth(v: str) -> str:
    """``v / 100`` as an exact decimal string (``12.5`` -> ``0.125``, ``50`` -> ``0.5``)."""
    out = format(Decimal(v).scaleb(-2), "f")
    return out.rstrip("0").rstrip(".") if "." in out else out


def _readings(s: str, percent: Percent) -> tuple[str, ...]:
    """The values a normalised answer stands for: itself, or for ``v\\%`` v and/or v/100 (``percent``)."""
    if not s.endswith("\\%"):
        return (s,)
    v = s[: -len("\\%")]
    return {"strip": (v,), "fraction": (_hundredth(v),), "either": (v, _hundredth(v))}[percent]


def _equivalent(gold: str, pred: str) -> bool:
    if gold == pred:
        return True
    gp, pp = _parse(gold), _parse(pred)
    if not gp or not pp:  # nothing parsed: a wrong answer, not an error
        return False
    return bool(_math_verify().verify(list(gp), list(pp), timeout_seconds=None, raise_on_error=True))


def answers_match(gold: str, pred: str, *, percent: Percent = "either") -> bool:
    """True iff the extracted ``pred`` equals ``gold`` as a string or mathematically (math-verify).

    Raises ``AnswerTooCostly`` for an answer ``cost_guard`` refuses (unless string-equal), and whatever
    math-verify raises; ``percent`` says how ``v\\%`` is read (see the module docstring)."""
    g, p = normalize(gold), normalize(pred)
    if not g or not p:
        return False
    if g == p:
        return True
    for side, s in (("gold", g), ("answer", p)):
        guard = cost_guard(s)
        if guard is not None:
            raise AnswerTooCostly(f"{side} not parsed ({guard}): {s[:40]!r}")
    if g.endswith("\\%") and p.endswith("\\%"):  # both percentages: compare the values
        return _equivalent(g[:-2], p[:-2])
    return any(_equivalent(a, b) for a in _readings(g, percent) for b in _readings(p, percent))


def is_correct(
    completion: str,
    gold: str,
    *,
    last_number: bool = False,
    boxed: Boxed = "last",
    truncated_box: TruncatedBox = "no_answer",
    percent: Percent = "either",
) -> bool:
    """Extract the completion's final answer and compare it with the gold answer (raw or ``#### n`` form).

    Raises like ``answers_match``: a verifier failure is the caller's to count, not a wrong answer."""
    pred = extract_answer(completion, last_number=last_number, boxed=boxed, truncated_box=truncated_box)
    if pred is None:
        return False
    return answers_match(gold_answer(gold, boxed=boxed, truncated_box=truncated_box), pred, percent=percent)
