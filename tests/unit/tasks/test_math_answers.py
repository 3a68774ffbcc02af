import threading
import time

import pytest

from groupwise.tasks.math_answers import answers_match, extract_answer, gold_answer, is_correct, too_costly

EXTRACT = [
    # (completion, last_number, expected extraction)
    ("<think>2+2</think><answer>4</answer>", False, "4"),
    ("<answer>3</answer> wait <answer>5</answer>", False, "5"),
    ("<answer><answer>6</answer>", False, "6"),
    ("<answer>\\boxed{9}</answer>", False, "9"),
    ("<answer>  </answer> so \\boxed{3}", False, None),  # an empty last answer tag decides
    ("\\boxed{3} no, \\boxed{\\frac{1}{2}}", False, "\\frac{1}{2}"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", False, "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{\\boxed{7}}", False, "7"),
    ("\\boxed{\\{1, 2\\}}", False, "\\{1, 2\\}"),
    ("\\fbox{8}", False, "8"),
    ("\\boxed 7 apples", False, "7"),
    ("\\boxed{5} then \\boxed{6", False, None),  # truncated last box: the earlier box does not count
    ("\\boxed{5} then \\boxed{6", True, None),
    ("so she has 12.\n#### 1,000", False, "1000"),
    ("#### 72\n(end)", False, "72"),
    ("#### 1\n#### 2", False, "2"),
    ("The answer is 42.", False, None),
    ("The answer is 42.", True, "42"),
    ("it costs \u22123.5 dollars", True, "-3.5"),
    ("a total of 1{,}000 apples", True, "1000"),
    ("<answer>$\\$18.00$</answer>", False, "18.00"),
    ("<answer>\\(\u22125\\).</answer>", False, "-5"),
    ("<answer>18 dollars</answer>", False, "18"),
    ("<answer>50\\%</answer>", False, "50"),
    ("<answer>5 or 7</answer>", False, "5 or 7"),
    ("", False, None),
    ("no answer at all", True, None),
]


@pytest.mark.parametrize("completion,last_number,expected", EXTRACT)
def test_extract_answer(completion, last_number, expected):
    assert extract_answer(completion, last_number=last_number) == expected


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("#### 42", "42"),
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
        ("\\boxed{\\frac{3}{5}}", "\\frac{3}{5}"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("$-2$", "-2"),
        ("1,234", "1234"),
        ("Monday", "Monday"),
    ],
)
def test_gold_answer(raw, expected):
    assert gold_answer(raw) == expected


CORRECT = [
    # (gold, completion, expected)
    ("#### 42", "<answer>42</answer>", True),
    ("Tom has 5+7=12 apples.\n#### 12", "<answer>12</answer>", True),
    ("42", "<answer>42.0</answer>", True),
    ("3", "<answer>3.</answer>", True),
    ("\\frac{1}{2}", "<answer>0.5</answer>", True),
    ("0.5", "\\boxed{\\frac{1}{2}}", True),
    ("\\frac{1}{2}", "<answer>\\frac12</answer>", True),
    ("\\frac{3}{5}", "<answer>\\dfrac{3}{5}</answer>", True),
    ("\\frac{3}{5}", "<answer>3/5</answer>", True),
    ("\\frac{1}{3}", "<answer>0.33</answer>", False),
    ("-5", "<answer>\u22125</answer>", True),
    ("5", "<answer>\u22125</answer>", False),
    ("1000", "<answer>1,000</answer>", True),
    ("1000", "<answer>1,000,000</answer>", False),
    ("\\boxed{3\\sqrt{2}}", "<answer>\\sqrt{18}</answer>", True),
    ("18", "<answer>$18</answer>", True),
    ("18", "<answer>\\$18.00.</answer>", True),
    ("50", "<answer>50%</answer>", True),
    ("3", "<answer>x = 3</answer>", True),
    ("-7", "so -7.\n#### -7", True),
    ("7", "\\boxed{7} wait, actually \\boxed{8}", False),
    ("8", "\\boxed{7} wait, actually \\boxed{8}", True),
    ("7", "<answer>7</answer> hmm <answer>9</answer>", False),
    ("7", "<answer>5 or 7</answer>", False),
    ("7", "<answer>7, 9</answer>", False),
    ("6", "<answer>16</answer>", False),
    ("2", "<answer>12</answer>", False),
    ("12", "The answer is 12", False),  # no answer marker and last_number is off
    ("5", "", False),
    ("5", "<answer>garbage !! }{</answer>", False),
    ("5", "\\boxed{\\frac{", False),
    ("5", "<answer>\\frac{</answer>", False),
    ("5", "<answer>}{}{\\left(\x00</answer>", False),
    ("0", "<answer>\\frac{1}{0}</answer>", False),
    ("5", None, False),
]


@pytest.mark.parametrize("gold,completion,expected", CORRECT)
def test_is_correct(gold, completion, expected):
    assert is_correct(completion, gold) is expected


def test_last_number_fallback_is_opt_in():
    assert is_correct("so the total is 1,200 apples.", "1200", last_number=True)
    assert not is_correct("so the total is 1,200 apples.", "1200")


def test_answers_match_is_symmetric_on_plain_numbers():
    assert answers_match("12", "12.0") and answers_match("12.0", "12")
    assert not answers_match("", "") and not answers_match("5", "")


@pytest.mark.parametrize(
    "answer",
    [
        "10^{10^{10}}",  # a 10-billion-digit integer: uninterruptible big-int arithmetic
        "(10^{10})^{10^{10}}",
        "9^{9^{9}}",
        "10^{10000000000}",
        "99999999!",
        "\\binom{10^{9}}{10^{5}}",
        "(" * 40 + "1" + ")" * 40,  # latex2sympy time grows exponentially with nesting
        "1" * 301,
    ],
)
def test_too_costly_guards_inputs_that_stall_sympy(answer):
    assert too_costly(answer)


@pytest.mark.parametrize(
    "answer", ["e^{x^2}", "2^{10}", "\\binom{6}{2}", "5!", "\\frac{\\sqrt{3}}{2}", "x^2+2x+1"]
)
def test_too_costly_lets_ordinary_answers_through(answer):
    assert not too_costly(answer)


def test_guarded_input_is_rejected_quickly():
    t = time.perf_counter()
    assert not is_correct("<answer>" + "(" * 40 + "1" + ")" * 40 + "</answer>", "1")
    assert time.perf_counter() - t < 1.0


def test_works_outside_the_main_thread():
    # math-verify's default timeouts use signal.alarm, which raises in any non-main thread
    out: list[object] = []

    def run():
        try:
            out.append(is_correct("<answer>\\frac{2}{4}</answer>", "0.5"))
        except Exception as e:  # pragma: no cover - the assertion below reports it
            out.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    assert out == [True]
