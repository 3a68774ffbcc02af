import sys

import pytest
import torch

from groupwise.config import load
from groupwise.methods.lampo.rouge_l import RougeLConfig, rouge_l, scorer
from groupwise.registry import ConfigError
from groupwise.types import Group, Problem, Sample


def f1(units, a, b):
    return scorer(units).score(a, b)["rougeL"].fmeasure


def test_identical_disjoint_and_symmetric():
    for units in ("words", "chars"):
        assert f1(units, "the cat sat on 3 mats", "the cat sat on 3 mats") == 1.0
        assert f1(units, "abc", "xyz") == 0.0
        assert f1(units, "the cat sat down", "a cat sat") == f1(units, "a cat sat", "the cat sat down")


def test_pinned_values():
    # words: reference "the cat sat" vs "the cat": LCS 2, P = 2/2, R = 2/3 → F = 2·1·(2/3)/(5/3) = 0.8
    assert f1("words", "the cat sat", "the cat") == pytest.approx(0.8, abs=1e-12)
    # chars on lab traces: "1+2=3;" vs "1-2=9;": LCS "12=;" = 4 of 6 each → F = 4/6
    assert f1("chars", "1+2=3;", "1-2=9;") == pytest.approx(4 / 6, abs=1e-12)
    # the word tokenizer keeps only [a-z0-9]+ words: "1+2" and "1-2" are both "1 2"; chars tells them apart
    assert f1("words", "1+2", "1-2") == 1.0 and f1("chars", "1+2", "1-2") == pytest.approx(2 / 3, abs=1e-12)


def test_reward_term_on_groups(lab):
    term = rouge_l(RougeLConfig(units="chars"), lab)
    p = lab.test[0]
    blank = Problem(id="b", prompt="1+1", answer="2")
    mk = lambda text: Sample(prompt_ids=torch.tensor([1]), completion_ids=torch.tensor([2]),  # noqa: E731
                             rollout_logprobs=torch.zeros(1), loss_mask=torch.ones(1, dtype=torch.bool),
                             finish_reason="stop", text=text)
    out = term([Group(p, [mk(p.reference), mk("")]), Group(blank, [mk("<answer>2</answer>")])], 0)
    assert out == [[1.0, 0.0], [0.0]]  # exact copy, empty text, no reference


def test_missing_package_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "rouge_score", None)
    with pytest.raises(ImportError, match=r"^reward 'rouge_l' needs rouge-score: pip install groupwise\[rouge\]$"):
        scorer("words")


def test_config_validation():
    cfg = load(None, ["reward.terms=[correctness, {name: rouge_l, weight: 0.1, units: chars}]"])
    assert cfg.reward.terms[1].weight == 0.1 and cfg.reward.terms[1].cfg == RougeLConfig(units="chars")
    with pytest.raises(ConfigError, match="units"):
        load(None, ["reward.terms=[{name: rouge_l, units: bytes}]"])
