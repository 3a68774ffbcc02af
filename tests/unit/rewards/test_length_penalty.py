import random

import pytest
import torch

from groupwise.config import load
from groupwise.methods.acoer.length_penalty import LengthPenaltyConfig, length_penalty
from groupwise.registry import ConfigError, NoConfig
from groupwise.standard.rewards import correctness
from groupwise.types import Group, Problem, Sample


def group(lengths, correct) -> Group:
    return Group(Problem("p", "1+1", "2"), [
        Sample(prompt_ids=torch.zeros(2, dtype=torch.long), completion_ids=torch.zeros(n, dtype=torch.long),
               rollout_logprobs=torch.zeros(n), loss_mask=torch.ones(n, dtype=torch.bool), finish_reason="stop",
               correct=c) for n, c in zip(lengths, correct)])


def test_pinned():
    # r = c - 0.2 l / 100: correct l=50 -> 0.9; incorrect l=50 -> -0.1; correct l=100 -> 0.8; l=150 -> 1 - 0.3
    term = length_penalty(LengthPenaltyConfig(coef=0.2, max_length=100), None)
    out = term([group([50, 50, 100, 150], [True, False, True, True])], 0)[0]
    assert out == pytest.approx([0.9, -0.1, 0.8, 0.7], abs=1e-12)


def test_penalises_incorrect_answers_too():
    # unlike ACOER, wrong answers of different lengths get different rewards (the failure mode's source)
    out = length_penalty(LengthPenaltyConfig(coef=0.2, max_length=112), None)([group([30, 60], [False] * 2)], 0)[0]
    assert out[0] > out[1] and out[0] < 0


def test_zero_coef_equals_correctness():
    rng = random.Random(0)
    groups = [group([rng.randint(1, 99) for _ in range(8)], [rng.random() < 0.5 for _ in range(8)]) for _ in range(4)]
    assert length_penalty(LengthPenaltyConfig(coef=0.0), None)(groups, 0) == correctness(NoConfig(), None)(groups, 0)


def test_config_validated_at_load():
    cfg = load(None, ["reward.terms=[{name: length_penalty, coef: 0.1, max_length: 48}]"])
    assert cfg.reward.terms[0].cfg == LengthPenaltyConfig(coef=0.1, max_length=48)
    with pytest.raises(ConfigError, match="need coef >= 0 and max_length >= 1"):
        load(None, ["reward.terms=[{name: length_penalty, max_length: 0}]"])
    with pytest.raises(ConfigError, match="need coef >= 0"):
        load(None, ["reward.terms=[{name: length_penalty, coef: -0.1}]"])
