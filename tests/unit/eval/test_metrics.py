import math

import pytest

from groupwise.eval.evaluate import summarize
from groupwise.eval.metrics import majority_correct, pass_at_k


def test_pass_at_k_pinned():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25, abs=1e-12)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)
    assert pass_at_k(5, 4, 2) == 1.0
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4), abs=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_majority():
    assert majority_correct(["3", "5", "3", None], [True, False, True, False])
    assert not majority_correct(["5", "3", "5", "3"], [False, True, False, True])  # tie: earliest seen wins
    assert not majority_correct([None, None], [False, False])


def test_summarize_pinned():
    recs = [{"id": "a", "difficulty": 1, "greedy": False, "answer": x, "correct": c, "format": True, "length": n,
             "finish_reason": "stop"} for x, c, n in (("1", True, 10), ("2", False, 20))]
    recs += [{"id": "b", "difficulty": 2, "greedy": False, "answer": "9", "correct": False, "format": False,
              "length": 30, "finish_reason": "length"}] * 2
    recs += [{"id": "a", "difficulty": 1, "greedy": True, "answer": "1", "correct": True, "format": True, "length": 9,
              "finish_reason": "stop"}]
    m = summarize(recs, k=2)
    assert m["eval/mean_at_k"] == 0.25 and m["eval/pass_at_k"] == 0.5 and m["eval/pass_at_1"] == 0.25
    assert m["eval/greedy_acc"] == 1.0 and m["eval/len_mean"] == 22.5 and m["eval/len_correct_mean"] == 10
    assert m["eval/mean_at_k/d1"] == 0.5 and m["eval/mean_at_k/d2"] == 0.0 and m["eval/truncated_frac"] == 0.5
    assert m["eval/maj_at_k"] == 0.5  # a: tie 1 vs 2, earliest "1" is correct; b: "9" wrong
