import dataclasses

import pytest
import torch
from support import rows

from groupwise.config import load
from groupwise.methods.think_modes.mode_token_weight import ModeTokenWeightConfig, mode_token_weight
from groupwise.registry import ConfigError
from groupwise.types import Sample


def sample(n, mode, forced, first_trained=True):
    mask = torch.ones(n, dtype=torch.bool)
    mask[0] = first_trained
    return Sample(prompt_ids=torch.tensor([3]), completion_ids=torch.arange(2, 2 + n), rollout_logprobs=torch.zeros(n),
                  loss_mask=mask, finish_reason="stop", meta={"mode": mode, "mode_forced": forced})


def batch():
    samples = [sample(4, "<SH>", False), sample(3, "<NT>", True, first_trained=False), sample(2, "invalid", False),
               sample(5, "<LG>", False)]
    return rows(samples, [torch.full((s.length,), 0.5) for s in samples])


def test_sampled_mode_tokens_get_the_weight_and_nothing_else_changes():
    b = batch()
    out = mode_token_weight(b, ModeTokenWeightConfig(mode_token_loss_weight=4.0))
    # rows 0 and 3 sampled their mode: token 0 weighs 4; row 1's mode was forced (no loss); row 2 is invalid
    expected = b.loss_weights.clone()
    expected[0, 0] = expected[3, 0] = 4.0
    assert torch.equal(out.loss_weights, expected)
    assert expected[1, 0] == 0.0 and expected[2, 0] == 1.0
    assert torch.equal(out.advantages, b.advantages) and out.samples is b.samples
    assert torch.equal(b.loss_weights[0, :4], torch.ones(4))  # the input batch is not modified


def test_a_tag_of_several_tokens_gets_the_weight_on_each():
    s = sample(6, "<LG>", False)
    s.meta["mode_len"] = 3  # SmolLM2 spells <LG> as '<', 'LG', '>'
    b = rows([s], [torch.full((6,), 0.5)])
    out = mode_token_weight(b, ModeTokenWeightConfig(mode_token_loss_weight=4.0))
    assert out.loss_weights[0, :6].tolist() == [4.0, 4.0, 4.0, 1.0, 1.0, 1.0]


def test_weight_one_is_the_identity():
    b = batch()
    assert mode_token_weight(b, ModeTokenWeightConfig()) is b
    again = mode_token_weight(b, ModeTokenWeightConfig(mode_token_loss_weight=1.0))
    assert torch.equal(again.loss_weights, b.loss_weights)


def test_config():
    with pytest.raises(ValueError, match="mode_token_loss_weight=-1"):
        ModeTokenWeightConfig(mode_token_loss_weight=-1.0)
    with pytest.raises(ConfigError, match=r"credit 'mode_token_weight' requires 'think_modes'.*"
                                          r"allowed: add group builder 'think_modes'"):
        load(None, ["credit=[{name: mode_token_weight, mode_token_loss_weight: 3}]"])
    cfg = load(None, ["rollout.builder.name=think_modes", "task.modes=true",
                      "credit=[{name: mode_token_weight, mode_token_loss_weight: 3}]"])
    assert dataclasses.asdict(cfg.credit[0].cfg) == {"mode_token_loss_weight": 3.0}
