"""Faults injected from outside, as a user would (issue "Trust what you see", section 2): each test failed
before its fix (the docstring says how) and pins the behaviour that replaced it."""

import json
import math
import types

import pytest
import support
import torch

from groupwise.cli import main
from groupwise.loop.stats import group_metrics
from groupwise.registry import ConfigError
from groupwise.standard.grpo import GRPOConfig, grpo
from groupwise.types import Group, Problem, Sample


def batch(rewards, dtype=torch.float64):
    r = torch.tensor(rewards, dtype=dtype)
    return types.SimpleNamespace(rewards=r, mask=torch.ones_like(r, dtype=torch.bool))


def scored(reward):
    z = torch.zeros(1, dtype=torch.long)
    s = Sample(prompt_ids=z, completion_ids=z, rollout_logprobs=torch.zeros(1),
               loss_mask=torch.ones(1, dtype=torch.bool), finish_reason="stop", text="7")
    s.reward, s.correct, s.scored = reward, True, True
    return s


# ------------------------------------------------------------------------------- 5: non-finite rewards
def test_step_metrics_do_not_crash_on_a_non_finite_reward():
    """Before: ``statistics.pstdev`` raised AttributeError after the update, so every --resume died there."""
    m = group_metrics([Group(Problem("p", "q", "7"), [scored(math.inf), scored(0.0)])])
    assert math.isnan(m["reward/std"]) and m["reward/mean"] == math.inf
    assert group_metrics([Group(Problem("p", "q", "7"), [scored(1.0), scored(0.0)])])["reward/std"] == 0.5


def test_grpo_does_not_overflow_on_huge_finite_rewards():
    """Before: std(1e300, 0, 0, 0) overflowed to inf and every advantage was silently 0."""
    # mean = 0.25e300, deviations (0.75, -0.25, -0.25, -0.25)e300, var (ddof 1) = 0.75e600 / 3, std = 0.5e300
    # A = dev / std = (1.5, -0.5, -0.5, -0.5); eps = 1e-4 is negligible next to 0.5e300
    # second group: mean 0, |dev| = c = 1.7e308, std = sqrt(4c²/3) = 2c/√3, A = ±√3/2 (c² alone overflows)
    adv = grpo(batch([[1e300, 0.0, 0.0, 0.0], [1.7e308, -1.7e308, 1.7e308, -1.7e308]]), GRPOConfig())
    h = math.sqrt(3) / 2
    expected = torch.tensor([[1.5, -0.5, -0.5, -0.5], [h, -h, h, -h]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=1e-12, atol=0)
    adv32 = grpo(batch([[1e30, 0.0, 0.0, 0.0]], torch.float32), GRPOConfig())  # float32 squares: inf at ~1e19
    torch.testing.assert_close(adv32, expected[:1].to(adv32.dtype), rtol=1e-6, atol=0)


def test_grpo_is_bit_identical_on_ordinary_rewards():
    """The scale-safe path must not touch ordinary groups: the unscaled formula, reproduced, bit for bit."""
    from groupwise.advantages.stats import group_centred, group_constant, group_std

    g = torch.Generator().manual_seed(0)
    magnitudes = 10.0 ** torch.arange(-8, 8).repeat(4)[:, None]  # [64, 1]: 1e-8 .. 1e7
    r = torch.cat([torch.rand(64, 8, generator=g, dtype=torch.float64) * magnitudes,
                   torch.tensor([[0.1] * 8, [1e140, 0, 0, 0, 0, 0, 0, 1]], dtype=torch.float64)])
    b = batch(r.tolist())
    for cfg in (GRPOConfig(), GRPOConfig(eps=0.0, ddof=0)):
        centred, std = group_centred(b.rewards, b.mask), group_std(b.rewards, b.mask, cfg.ddof)
        spread = ~group_constant(b.rewards, b.mask) & (std > 0)
        old = torch.where(spread, centred / (std + cfg.eps).clamp(min=1e-300), torch.zeros_like(centred))
        assert torch.equal(grpo(b, cfg), old)


# ------------------------------------------------------------------------- 6: non-finite weights
def two_rows():
    samples = [Sample(prompt_ids=torch.tensor([5, 6, 7]), completion_ids=torch.tensor([8, 9 + i]),
                      rollout_logprobs=torch.zeros(2), loss_mask=torch.ones(2, dtype=torch.bool),
                      finish_reason="stop") for i in range(2)]
    return support.rows(samples, [torch.ones(2), torch.ones(2)])


def test_a_step_that_makes_the_weights_non_finite_is_undone_and_counted(tiny_model, tokenizer, capsys):
    """Before: the overflowing step was kept: with float16 weights (max 65504) an update of lr = 1e5 (finite,
    so a valid lr) left them ±inf, and the run went on training and checkpointing NaN with normal-looking
    metrics (``update/nonfinite_skipped`` only looks at the gradient, which was finite)."""
    model = tiny_model.half()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    learner = support.learner(model, tokenizer, ["optim.lr=1e5", "optim.grad_clip=0"])
    m = learner.step(two_rows())
    assert m["update/grad_norm"] > 0 and m["update/nonfinite_restored"] == 1.0
    assert m["update/nonfinite_skipped"] == 1.0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert "the pre-step weights were restored" in capsys.readouterr().err


def test_the_stop_policy_keeps_no_copy_and_stops_with_one_line(tiny_model, tokenizer):
    from groupwise.update import NonFiniteWeights

    model = tiny_model.half()
    learner = support.learner(model, tokenizer, ["optim.lr=1e5", "optim.grad_clip=0", "optim.nonfinite=stop"])
    with pytest.raises(NonFiniteWeights, match="non-finite .* the last checkpoint is intact"):
        learner.step(two_rows())


def test_an_ordinary_step_is_not_undone(tiny_model, tokenizer):
    before = [p.detach().clone() for p in tiny_model.parameters()]
    m = support.learner(tiny_model, tokenizer, ["optim.grad_clip=0"]).step(two_rows())
    assert m["update/nonfinite_restored"] == 0.0 and m["update/nonfinite_skipped"] == 0.0
    assert not all(torch.equal(p, b) for p, b in zip(tiny_model.parameters(), before))
    assert all(bool(torch.isfinite(p).all()) for p in tiny_model.parameters())


# ---------------------------------------------------------- 11, 12: errors reach the user as one line
def test_a_data_error_is_one_line_from_the_cli(tmp_path, capsys):
    """Before: the DataError's message was the last line of a ~25-line traceback."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "q1", "answer": 1}\n{"question": "q2", "answer": NaN}\n')
    code = main(["train", "recipes/jsonl_math.yaml", f"task.train_path={data}", f"out_dir={tmp_path}/runs",
                 "task.reference_key=", "trainer.steps=0", "model.warm_start=false"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"error: {data}:2: column 'answer' is nan; allowed: a finite number or a string\n"


def test_config_file_errors_are_one_line_from_the_cli(tmp_path, capsys):
    """Before: IsADirectoryError and UnicodeDecodeError tracebacks."""
    assert main(["config", str(tmp_path)]) == 2
    bad = tmp_path / "r.yaml"
    bad.write_bytes(b"seed: 1\n\xff: 2\n")
    assert main(["config", str(bad)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"error: recipe {tmp_path}: not a file (a directory?); allowed: a YAML file",
                     f"error: {bad}:2: not UTF-8 text (byte 0xff); allowed: a UTF-8 YAML file"]


def test_a_model_directory_with_a_bad_config_json_is_a_config_error(tmp_path):
    """Before: transformers' OSError / ValueError traceback."""
    from groupwise.models.load import load_pretrained

    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=rf"^model.path: '{tmp_path}' does not load as a Hugging Face "
                                          r"causal LM \(OSError: .*\); allowed: a model directory"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ConfigError, match=r"does not load as a Hugging Face causal LM"):
        load_pretrained(tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_a_config_error():
    """Before: model.to('cuda') raised 'Torch not compiled with CUDA enabled' deep in the build."""
    from groupwise.config import load
    from groupwise.models.load import load_model

    with pytest.raises(ConfigError, match=r"^model.device='cuda': no cuda device on this machine; "
                                          r"allowed: cpu$"):
        load_model(load(None, ["model.device=cuda"]).model)
