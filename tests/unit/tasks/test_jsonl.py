import dataclasses
import json
import random
import sys
import time
import types

import math_verify
import pytest

from groupwise.standard.jsonl import SAMPLE_PATH, DataError, JsonlConfig, JsonlTask, resolve_path
from groupwise.standard.math_answers import AnswerTooCostly
from groupwise.tasks import TASKS

SAMPLE = dict(train_path=SAMPLE_PATH, reference_key="solution", difficulty_key="level", id_key="id")


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_registered_with_its_config():
    entry = TASKS.get("jsonl")
    assert entry.config is JsonlConfig
    task = entry.obj(JsonlConfig(**SAMPLE), types.SimpleNamespace(seed=3))
    assert isinstance(task, JsonlTask) and task.name == "jsonl" and task.seed == 3


def test_sample_file_loads_with_canonical_answers():
    task = JsonlTask(JsonlConfig(**SAMPLE))
    problems = {p.id: p for p in [*task.train, *task.test]}
    assert len(problems) == 12 and len(task.test) == 2  # ceil(0.1 * 12)
    assert problems["gsm-1"].answer == "12"  # "#### 12"
    assert problems["gsm-5"].answer == "-7"
    assert problems["math-1"].answer == "\\frac{1}{2}"
    assert problems["math-5"].answer == "\\frac{3}{5}"  # "\boxed{\frac{3}{5}}"
    assert problems["gsm-3"].difficulty == 2  # an integer column
    assert problems["math-2"].difficulty == 2  # "Level 2"
    assert problems["gsm-1"].prompt.startswith("A baker makes 24 muffins")
    assert problems["gsm-1"].meta["source"].endswith("sample_math.jsonl:1")


def test_every_sample_reference_verifies_and_a_wrong_answer_does_not():
    task = JsonlTask(JsonlConfig(**SAMPLE))
    for p in [*task.train, *task.test]:
        assert task.verify(p, p.reference), p.id
        assert task.format_ok(p.reference), p.id
        assert not task.verify(p, "<answer>999</answer>"), p.id


def test_task_extraction_api():
    task = JsonlTask(JsonlConfig(**SAMPLE))
    assert task.extract_answer("<think>x</think><answer> \u22127 </answer>") == "-7"
    assert task.extract_answer("I think it is 7") is None
    assert not task.format_ok("I think it is 7")
    lenient = JsonlTask(JsonlConfig(**SAMPLE, last_number=True))
    assert lenient.extract_answer("I think it is 7") == "7"


def test_verifier_failures_reach_the_scorer(monkeypatch):
    # the scorer counts an exception out of verify in reward/verifier_error_frac; False would hide it
    task = JsonlTask(JsonlConfig(**SAMPLE))
    p = task.train[0]
    with pytest.raises(AnswerTooCostly, match="MAX_NESTING"):
        task.verify(p, "<answer>" + "(" * 40 + "1" + ")" * 40 + "</answer>")
    monkeypatch.setattr(math_verify.grader, "sympy_expr_eq", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        task.verify(dataclasses.replace(p, answer="0.5"), "<answer>\\frac{1}{2}</answer>")


def test_answer_options_reach_verify_and_extraction(tmp_path):
    hedged, truncated = "\\boxed{3} or maybe \\boxed{5}", "so \\boxed{5}. final \\boxed{3"
    default = JsonlTask(JsonlConfig(**SAMPLE))
    p5 = dataclasses.replace(default.train[0], answer="5")
    assert default.verify(p5, hedged) and not default.verify(p5, truncated)
    assert default.extract_answer(truncated) is None and not default.format_ok(truncated)
    strict = JsonlTask(JsonlConfig(**SAMPLE, boxed="all", truncated_box="previous"))
    assert not strict.verify(p5, hedged) and strict.verify(p5, truncated)
    assert strict.extract_answer(hedged) == "3, 5" and strict.format_ok(truncated)
    rows = [{"question": "q1", "answer": "35%"}, {"question": "q2", "answer": "\\boxed{2} and \\boxed{3}"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    completions = ("<answer>35</answer>", "\\boxed{3}", "\\boxed{2} \\boxed{3}")
    for cfg, answers, verdicts in [
        (dict(), ["35\\%", "3"], [True, True, True]),
        (dict(percent="strip"), ["35\\%", "3"], [True, True, True]),
        (dict(percent="fraction", boxed="all"), ["35\\%", "2, 3"], [False, False, True]),
    ]:
        task = JsonlTask(JsonlConfig(train_path=path, test_path=path, **cfg))
        assert [p.answer for p in task.train] == answers, cfg
        got = [task.verify(p, c) for p, c in zip([task.train[0], task.train[1], task.train[1]], completions)]
        assert got == verdicts, cfg


def test_held_out_split_is_pinned_deterministic_and_disjoint():
    a = JsonlTask(JsonlConfig(**SAMPLE), seed=0)
    b = JsonlTask(JsonlConfig(**SAMPLE), seed=123)
    assert [p.id for p in a.test] == ["math-4", "math-6"]  # lowest stable_seed of the prompt text
    assert [p.id for p in b.test] == [p.id for p in a.test]
    assert [p.id for p in a.train] == [p.id for p in b.train]
    assert {p.prompt for p in a.train}.isdisjoint({p.prompt for p in a.test})
    half = JsonlTask(JsonlConfig(**SAMPLE, test_fraction=0.5))
    assert len(half.test) == 6 and {p.id for p in a.test} <= {p.id for p in half.test}


def test_duplicate_prompts_never_straddle_the_split(tmp_path):
    rows = [{"question": f"q{i % 5}", "answer": str(i)} for i in range(20)]  # each prompt 4 times
    task = JsonlTask(JsonlConfig(train_path=write_jsonl(tmp_path / "d.jsonl", rows), test_fraction=0.1))
    assert {p.prompt for p in task.train}.isdisjoint({p.prompt for p in task.test})
    assert len(task.test) % 4 == 0 and len(task.test) >= 4


def test_column_remapping_and_system_prompt(tmp_path):
    rows = [
        {"problem": "What is 2+3?", "final": 5, "uid": "a", "work": "2+3=5. \\boxed{5}", "lvl": "Level 3"},
        {"problem": "What is 10-4?", "final": "#### 6", "uid": "b", "work": "#### 6", "lvl": 1},
    ]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", rows[:1])
    cfg = JsonlConfig(
        train_path=train,
        test_path=test,
        prompt_key="problem",
        answer_key="final",
        id_key="uid",
        reference_key="work",
        difficulty_key="lvl",
        system_prompt="Be brief.",
    )
    task = JsonlTask(cfg)
    assert [p.id for p in task.train] == ["a", "b"] and [p.id for p in task.test] == ["a"]
    a = task.train[0]
    assert a.prompt == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
    )
    assert (a.answer, a.difficulty, a.reference) == ("5", 3, "2+3=5. \\boxed{5}")
    assert task.train[1].answer == "6"


def test_few_shot_turns_precede_the_question_and_leave_the_split_alone(tmp_path):
    rows = [{"question": f"What is {i}+1?", "answer": i + 1} for i in range(40)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    plain = JsonlTask(JsonlConfig(train_path=path, test_fraction=0.25))
    shots = (("What is 1+1?", "1+1=2. \\boxed{2}"),)
    task = JsonlTask(JsonlConfig(train_path=path, test_fraction=0.25, few_shot=shots))
    assert [p.id for p in task.test] == [p.id for p in plain.test]  # the split hashes the question only
    assert task.test[0].prompt == (
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "1+1=2. \\boxed{2}"},
        {"role": "user", "content": plain.test[0].prompt},
    )
    with pytest.raises(ValueError, match=r"few_shot\.0: allowed a \[question, worked answer\] pair"):
        JsonlConfig(train_path=path, few_shot=(("only a question",),))


def test_default_ids_and_max_rows(tmp_path):
    rows = [{"question": f"q{i}", "answer": i} for i in range(10)]
    task = JsonlTask(
        JsonlConfig(train_path=write_jsonl(tmp_path / "d.jsonl", rows), max_rows=4, test_fraction=0.25)
    )
    assert sorted(p.id for p in [*task.train, *task.test]) == ["d/0", "d/1", "d/2", "d/3"]
    assert len(task.test) == 1


BAD_ROWS = [
    ('{"question": "q", "answer": ', "invalid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ({"answer": "1"}, "missing column 'question' (columns: answer)"),
    ({"question": "q"}, "missing column 'answer'"),
    ({"question": 3, "answer": "1"}, "column 'question' must be a non-empty string"),
    ({"question": "  ", "answer": "1"}, "column 'question' must be a non-empty string"),
    ({"question": "q", "answer": ""}, "empty answer"),
    ({"question": "q", "answer": "####  "}, "empty answer"),
    ({"question": "q", "answer": None}, "column 'answer' must be a string or number"),
    ({"question": "q", "answer": True}, "column 'answer' must be a string or number"),
]


@pytest.mark.parametrize("bad,message", BAD_ROWS)
def test_malformed_row_names_file_and_line(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "ok", "answer": "1"}, "", bad])  # line 2 is blank
    with pytest.raises(DataError) as e:  # the CLI prints a DataError as one line (was a bare ValueError)
        JsonlTask(JsonlConfig(train_path=path))
    assert f"{path}:3: " in str(e.value) and message in str(e.value)
    assert "\n" not in str(e.value)


def test_malformed_difficulty_and_duplicate_id(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "a", "answer": "1", "lvl": "hard"}])
    with pytest.raises(ValueError, match=r"d\.jsonl:1: column 'lvl' must be an integer"):
        JsonlTask(JsonlConfig(train_path=path, prompt_key="q", difficulty_key="lvl"))
    # a difficulty_key naming a text column (here the question itself) is refused, not read as its first
    # integer
    path = write_jsonl(tmp_path / "q.jsonl", [{"q": "What is 12 + 30?", "answer": "42"}])
    with pytest.raises(ValueError, match=r"q\.jsonl:1: column 'q' must be an integer \(or text like 'Level 3'"):
        JsonlTask(JsonlConfig(train_path=path, prompt_key="q", difficulty_key="q"))
    for text, level in (("Level 5", 5), ("grade: 2", 2), (" 7 ", 7), ("Level-3", 3), ("-2", -2)):
        path = write_jsonl(tmp_path / "l.jsonl", [{"q": "a", "answer": "1", "lvl": text}])
        task = JsonlTask(JsonlConfig(train_path=path, test_path=path, prompt_key="q", difficulty_key="lvl"))
        assert task.test[0].difficulty == level
    path = write_jsonl(
        tmp_path / "e.jsonl", [{"q": "a", "answer": "1", "k": 7}, {"q": "b", "answer": "2", "k": 7}]
    )
    with pytest.raises(ValueError, match=r"e\.jsonl:2: duplicate id '7' \(first at .*e\.jsonl:1\)"):
        JsonlTask(JsonlConfig(train_path=path, prompt_key="q", id_key="k"))


def test_parquet_round_trip_matches_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in resolve_path(SAMPLE_PATH).read_text().splitlines()]
    rows = [{**r, "level": str(r["level"])} for r in rows]  # parquet columns need one type
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pq" / "sample_math.parquet")
    from_jsonl = JsonlTask(JsonlConfig(**SAMPLE))
    from_parquet = JsonlTask(
        JsonlConfig(**{**SAMPLE, "train_path": str(tmp_path / "pq" / "sample_math.parquet")})
    )
    for a, b in [(from_jsonl.train, from_parquet.train), (from_jsonl.test, from_parquet.test)]:
        assert [(p.id, p.prompt, p.answer, p.reference, p.difficulty) for p in a] == [
            (p.id, p.prompt, p.answer, p.reference, p.difficulty) for p in b
        ]


def test_parquet_malformed_row_names_file_and_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"question": "a", "answer": "1"}, {"question": "b", "answer": ""}]), path
    )
    with pytest.raises(ValueError, match=rf"^{path} row 1: empty answer"):
        JsonlTask(JsonlConfig(train_path=str(path)))


def test_missing_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ImportError, match=r"pip install 'groupwise\[data\]'"):
        JsonlTask(JsonlConfig(train_path=str(path)))


def test_sft_examples(tmp_path):
    task = JsonlTask(JsonlConfig(**SAMPLE))
    pairs = task.sft_examples(random.Random(0), 5)
    assert len(pairs) == 5 and all(text == p.reference and task.verify(p, text) for p, text in pairs)
    assert {p.id for p, _ in pairs} <= {p.id for p in task.train}
    assert task.sft_examples(random.Random(0), 5) == pairs
    with pytest.raises(NotImplementedError, match="reference_key"):
        JsonlTask(JsonlConfig(train_path=SAMPLE_PATH)).sft_examples(random.Random(0), 1)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({}, "train_path: required"),
        ({"train_path": "x.csv"}, "train_path='x.csv': allowed suffixes"),
        ({"train_path": "x.jsonl", "test_path": "y.txt"}, "test_path='y.txt'"),
        ({"train_path": "x.jsonl", "test_fraction": 0.0}, "test_fraction=0.0"),
        ({"train_path": "x.jsonl", "test_fraction": 1.0}, "test_fraction=1.0"),
        ({"train_path": "x.jsonl", "prompt_key": ""}, "prompt_key and answer_key"),
        ({"train_path": "x.jsonl", "max_rows": -1}, "max_rows=-1"),
        ({"train_path": "x.jsonl", "boxed": "first"}, "boxed='first': allowed last, all"),
        ({"train_path": "x.jsonl", "truncated_box": "x"}, "truncated_box='x': allowed no_answer, previous"),
        ({"train_path": "x.jsonl", "percent": "v"}, "percent='v': allowed either, strip, fraction"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        JsonlConfig(**kwargs)


def test_missing_file_and_too_few_rows(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        JsonlTask(JsonlConfig(train_path=str(tmp_path / "nope.jsonl")))
    with pytest.raises(ValueError, match="at least 2 rows"):
        JsonlTask(
            JsonlConfig(train_path=write_jsonl(tmp_path / "one.jsonl", [{"question": "q", "answer": 1}]))
        )


# ------------------------------------------------------------------ bad input (issue "Trust what you see")
def test_non_utf8_byte_names_file_and_line(tmp_path):
    """Before: a UnicodeDecodeError naming no file."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"question": "q1", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(DataError, match=rf"^{path}:2: not UTF-8 text \(byte 0xe9\); allowed: a UTF-8 JSONL"):
        JsonlTask(JsonlConfig(train_path=str(path)))


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    """Before: 'd.jsonl:1: invalid JSON (Unexpected UTF-8 BOM ...)'."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"question": "q1", "answer": "1"}\n{"question": "q2", "answer": "2"}\n')
    task = JsonlTask(JsonlConfig(train_path=str(path)))
    assert sorted(p.answer for p in [*task.train, *task.test]) == ["1", "2"]


def test_garbage_parquet_is_one_line_naming_the_file(tmp_path):
    """Before: a raw pyarrow ArrowInvalid traceback."""
    pytest.importorskip("pyarrow")
    path = tmp_path / "d.parquet"
    path.write_bytes(b"this is not parquet at all" * 10)
    with pytest.raises(DataError, match=rf"^{path}: not a readable Parquet file \(") as e:
        JsonlTask(JsonlConfig(train_path=str(path)))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numeric_answer_is_rejected(tmp_path, literal):
    """Before: `"answer": NaN` became the gold answer "nan"."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "q1", "answer": 1}\n{"question": "q2", "answer": ' + literal + "}\n")
    with pytest.raises(DataError, match=rf"^{path}:2: column 'answer' is -?(nan|inf); allowed: a finite"):
        JsonlTask(JsonlConfig(train_path=str(path)))


def test_prompt_over_max_prompt_chars_names_the_row(tmp_path):
    """Before: a 10 MB prompt loaded and later tried to allocate ~107 GB."""
    rows = [{"question": "q", "answer": "1"}, {"question": "x" * 20001, "answer": "2"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError, match=rf"^{path}:2: column 'question' has 20001 characters; allowed <= "
                                        r"max_prompt_chars=20000"):
        JsonlTask(JsonlConfig(train_path=path))
    task = JsonlTask(JsonlConfig(train_path=path, max_prompt_chars=30000))
    assert len(task.train) + len(task.test) == 2
    with pytest.raises(ValueError, match="max_prompt_chars=0: allowed >= 1"):
        JsonlConfig(train_path=path, max_prompt_chars=0)


def test_long_gold_answer_loads_in_linear_time(tmp_path):
    """Before: the trailing-dots regex of ``normalize`` was quadratic (20k characters: 19 s, this: 5 min)."""
    long = "1" + " ." * 50000 + "x"
    rows = [{"question": "q1", "answer": long}, {"question": "q2", "answer": "2"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    t0 = time.perf_counter()
    task = JsonlTask(JsonlConfig(train_path=path))
    assert time.perf_counter() - t0 < 2.0
    assert {p.answer for p in [*task.train, *task.test]} == {long, "2"}


def test_too_few_rows_names_the_file(tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", [{"question": "q", "answer": 1}])
    with pytest.raises(DataError, match=rf"^{path}: need at least 2 rows to hold out a test split"):
        JsonlTask(JsonlConfig(train_path=path))
