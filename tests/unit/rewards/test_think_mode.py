import math

import pytest
import torch

from groupwise.config import load
from groupwise.methods.think_modes.reward import ThinkModeRewardConfig, shaped_reward, think_mode
from groupwise.registry import ConfigError
from groupwise.types import Group, Problem, Sample

CAPS = {"<NT>": 8, "<SH>": 40, "<LG>": 200}


def sample(mode, length, correct=True, over_cap=False):
    ids = torch.zeros(length, dtype=torch.long)
    return Sample(prompt_ids=torch.zeros(1, dtype=torch.long), completion_ids=ids, rollout_logprobs=torch.zeros(length),
                  loss_mask=torch.ones(length, dtype=torch.bool), finish_reason="stop", correct=correct,
                  meta={"mode": mode, "mode_cap": CAPS.get(mode, 0), "over_cap": over_cap})


def rewards(samples, cfg=None):
    term = think_mode(cfg or ThinkModeRewardConfig(), None)
    return term([Group(Problem("p", "q", "1"), samples)], step=0)[0]


def test_pinned_values():
    # L = completion length − 1 (tokens after the mode token)
    # NT, L=4: 1.5 · 1.5^(−4/8) = 1.5^0.5 = 1.2247449; SH, L=20: 1.25^(1 − 20/40) = 1.25^0.5 = 1.1180340
    # LG, L=120: 1.0; incorrect: 0
    got = rewards([sample("<NT>", 5), sample("<SH>", 21), sample("<LG>", 121), sample("<SH>", 21, correct=False)])
    assert got == pytest.approx([math.sqrt(1.5), math.sqrt(1.25), 1.0, 0.0], abs=1e-12)


def test_cap_enforcement_zero_regardless_of_answer():
    # property 1: L > cap_m gives 0; L = cap_m gives exactly 1 (property 3, cap-anchored)
    got = rewards([sample("<NT>", 10), sample("<NT>", 9), sample("<SH>", 42), sample("<SH>", 41),
                   sample("<LG>", 202), sample("<LG>", 201), sample("<LG>", 50, over_cap=True)])
    assert got == pytest.approx([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0], abs=1e-12)


def test_invalid_mode_is_a_format_failure():
    # property 7
    assert rewards([sample("invalid", 3), sample("<XX>", 3)]) == [0.0, 0.0]


def test_long_constant_short_and_nothink_non_increasing():
    # property 2
    for mode, cap in CAPS.items():
        vals = [shaped_reward(True, L, cap, {"<NT>": 1.5, "<SH>": 1.25, "<LG>": 1.0}[mode],
                              1.0 if mode == "<LG>" else 0.0) for L in range(0, cap + 1)]
        if mode == "<LG>":
            assert set(vals) == {1.0}
        else:
            assert all(a > b for a, b in zip(vals, vals[1:]))


def test_crossovers_ordered():
    # property 3: R_NT = R_SH at L* = ln(b_NT/b_SH) / (ln b_NT/cap_NT − ln b_SH/cap_SH)
    #   = 0.1823216 / (0.0506831 − 0.0055786) = 4.0422 < L*(SH, LG) = cap_SH = 40
    l_star = math.log(1.5 / 1.25) / (math.log(1.5) / 8 - math.log(1.25) / 40)
    assert l_star == pytest.approx(4.04225, abs=1e-4)
    assert shaped_reward(True, 4, 8, 1.5) > shaped_reward(True, 4, 40, 1.25)
    assert shaped_reward(True, 5, 8, 1.5) < shaped_reward(True, 5, 40, 1.25)
    assert l_star < 40 and shaped_reward(True, 39, 40, 1.25) > 1.0 > shaped_reward(True, 41, 40, 1.25)


def test_explicit_gamma_overrides_cap_anchoring():
    # b = 1.25, γ = 0.99, L = 10: 1.25 · 0.99^10 = 1.1303297
    assert shaped_reward(True, 10, 40, 1.25, 0.99) == pytest.approx(1.25 * 0.99**10, abs=1e-12)


def test_config_validation():
    with pytest.raises(ValueError, match="base_sh"):
        ThinkModeRewardConfig(base_sh=0)
    with pytest.raises(ValueError, match="gamma_nt"):
        ThinkModeRewardConfig(gamma_nt=1.5)
    with pytest.raises(ConfigError, match="think_modes"):
        load(None, ["reward.terms=[{name: think_mode}]"])  # the standard builder records no modes
