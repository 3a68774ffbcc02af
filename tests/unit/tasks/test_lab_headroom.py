"""The headroom lab's setting (recipes/headroom_lab.yaml, issue 30): the properties it promises by construction.

Lengths spread over 4x (difficulty 2..12 and 0..2 droppable re-checks), difficulty stratified in the held-out set,
every reference verified, the flaw's rate growing with difficulty, deterministic problems, and one-line errors for
step counts outside 1..12."""

import dataclasses
import random
import statistics
from pathlib import Path

import pytest

from groupwise.config import load
from groupwise.models import tiny
from groupwise.registry import BuildEnv
from groupwise.standard.lab import Lab, LabConfig

ROOT = Path(__file__).parents[3]


@pytest.fixture(scope="module")
def headroom() -> Lab:
    cfg = load(ROOT / "recipes" / "headroom_lab.yaml")
    return cfg.task.build(BuildEnv(run=cfg, seed=0))


@pytest.fixture(scope="module")
def tokenizer():
    return tiny.build_tokenizer()


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False)) + 1  # + EOS, as the generator counts


def test_the_recipe_is_the_documented_setting(headroom):
    c = headroom.cfg
    assert ((c.ops, c.min_steps, c.max_steps, c.p_wrap_slip, c.max_checks, c.privileged_frac)
            == ("+", 2, 12, 0.6, 2, 0.3))
    m = load(ROOT / "recipes" / "headroom_lab.yaml").model  # lr 2e-3 never learned the addition table (results.md)
    assert (m.path, m.warm_start_steps, m.warm_start_lr, m.warm_start_batch) == ("embedded:lab-tiny", 1200, 1e-3, 64)


@pytest.mark.parametrize("method", ["distil_headroom_lab", "dash_opsd_headroom_lab", "graphpo_headroom_lab"])
def test_the_re_tests_run_on_the_third_settings_task_warm_start_and_budget(method):
    a, b = (load(ROOT / "recipes" / f"{n}.yaml") for n in ("headroom_unseen_lab", method))
    r = lambda c: (c.rollout.prompts_per_step, c.rollout.group_size, c.rollout.max_completion_tokens)  # noqa: E731
    assert (a.task, a.model, a.optim, r(a), a.trainer.steps, a.eval) == \
        (b.task, b.model, b.optim, r(b), b.trainer.steps, b.eval)


@pytest.mark.parametrize("method, flaw", [("think_modes_headroom_lab", {"modes": True}),
                                          ("dash_drift_headroom_lab", {"p_drift": 0.3})])
def test_the_pathology_re_tests_change_only_the_flaw_of_the_third_setting(method, flaw):
    """Think modes and DASH drift get their own warm start: the third setting's task with the slip and the
    privileged examples swapped for the method's pathology; model, budget and eval stay."""
    a, b = (load(ROOT / "recipes" / f"{n}.yaml") for n in ("headroom_unseen_lab", method))
    swapped = dataclasses.replace(a.task.cfg, p_wrap_slip=0.0, privileged_frac=0.0, **flaw)
    r = lambda c: (c.rollout.prompts_per_step, c.rollout.group_size, c.rollout.max_completion_tokens)  # noqa: E731
    assert (b.task.cfg, b.model, b.optim, r(b), b.trainer.steps, b.eval) == \
        (swapped, a.model, a.optim, r(a), a.trainer.steps, a.eval)


def test_the_think_modes_short_cap_admits_two_to_four_additions(tokenizer):
    """recipes/think_modes_headroom_lab.yaml's cap_sh 27: a clean <SH> trace (tokens after the tag, EOS included)
    fits for k = 2..4 and not from k = 5; <NT> (4 tokens) fits its cap 8 at every k."""
    cfg = load(ROOT / "recipes" / "think_modes_headroom_lab.yaml")
    lab = cfg.task.build(BuildEnv(run=cfg, seed=0))
    builder = cfg.rollout.builder.cfg
    rng = random.Random(0)
    for p in lab.test[:132]:
        sh = n_tokens(tokenizer, lab.trace(p, rng, "<SH>").removeprefix("<SH>"))
        nt = n_tokens(tokenizer, lab.trace(p, rng, "<NT>").removeprefix("<NT>"))
        assert (sh <= builder.cap_sh) == (p.difficulty <= 4), (p.difficulty, sh)
        assert nt == 4 <= builder.cap_nt


def test_held_out_set_holds_every_difficulty_equally(headroom):
    ks = [p.difficulty for p in headroom.test[:132]]
    assert sorted(set(ks)) == list(range(2, 13))
    assert all(ks.count(k) == 12 for k in range(2, 13))


def test_reference_traces_verify_and_their_length_is_six_tokens_per_step(headroom, tokenizer):
    for p in headroom.test:
        assert headroom.verify(p, p.reference) and headroom.format_ok(p.reference)
        assert n_tokens(tokenizer, p.reference) == 6 * p.difficulty + 11
        assert p.reference.count(";") == p.difficulty and "chk" not in p.reference


def test_warm_start_lengths_spread_over_4x_and_rechecks_are_droppable(headroom, tokenizer):
    pairs = [x for x in headroom.sft_examples(random.Random(0), 600) if "<ref>" not in x[0].prompt]
    lengths = sorted(n_tokens(tokenizer, t) for _, t in pairs)
    assert lengths[0] == 6 * 2 + 11 and lengths[-1] == 6 * 12 + 11 + 2 * 10
    assert lengths[-1] / lengths[0] >= 4.0  # 103 / 23: the "spread over at least 4x"
    assert lengths[int(0.9 * len(lengths))] / lengths[int(0.1 * len(lengths))] >= 2.4  # ~2.6 with uniform k
    for p, t in pairs:  # dropping the re-checks never changes the verdict
        body = t.split("so ", 1)
        stripped = (body[0] + "so " + body[1].split("chk", 1)[0].split("</think>")[0] + "</think>"
                    + t.split("</think>")[1])
        assert headroom.verify(p, stripped) == headroom.verify(p, t)
        assert t.count("chk ") <= 2


def test_the_flaw_grows_with_difficulty(headroom):
    pairs = [x for x in headroom.sft_examples(random.Random(1), 3000) if "<ref>" not in x[0].prompt]
    acc = {k: statistics.fmean(headroom.verify(p, t) for p, t in pairs if p.difficulty == k) for k in (2, 7, 12)}
    assert acc[2] > 0.4 > acc[7] > acc[12] and acc[12] < 0.15  # ~0.73^k: ~0.53, ~0.11, ~0.02


def test_privileged_share_and_determinism(headroom):
    pairs = headroom.sft_examples(random.Random(2), 1000)
    share = statistics.fmean("<ref>" in p.prompt for p, _ in pairs)
    assert 0.25 < share < 0.35
    again = Lab(headroom.cfg, seed=0)
    assert [p.prompt for p in again.test] == [p.prompt for p in headroom.test]
    assert again.train[123] == headroom.train[123]
    assert headroom.sft_examples(random.Random(2), 50) == pairs[:50]


def test_the_unseen_setting_hides_long_chains_from_the_warm_start_only():
    cfg = load(ROOT / "recipes" / "headroom_unseen_lab.yaml")
    unseen = cfg.task.build(BuildEnv(run=cfg, seed=0))
    seen = Lab(dataclasses.replace(unseen.cfg, sft_max_steps=0), seed=0)
    assert unseen.cfg.sft_max_steps == 6 and dataclasses.replace(unseen.cfg, sft_max_steps=0) == seen.cfg
    sft = [p.difficulty for p, _ in unseen.sft_examples(random.Random(0), 600)]
    assert set(sft) == {2, 3, 4, 5, 6}  # ~120 of each: every short length, no long one
    assert max(p.difficulty for p, _ in seen.sft_examples(random.Random(0), 600)) == 12
    rl = [unseen.train[i].difficulty for i in range(600)]  # RL and held-out problems are the second setting's
    assert rl == [seen.train[i].difficulty for i in range(600)] and max(rl) == 12
    assert [p.prompt for p in unseen.test] == [p.prompt for p in seen.test]


@pytest.mark.parametrize("kw,msg", [({"min_steps": 2, "max_steps": 13}, "max_steps=13"),
                                    ({"min_steps": 0}, "min_steps=0"),
                                    ({"max_checks": -1}, "max_checks"),
                                    ({"min_steps": 2, "max_steps": 12, "sft_max_steps": 1}, "sft_max_steps=1"),
                                    ({"min_steps": 2, "max_steps": 6, "sft_max_steps": 7}, "sft_max_steps=7")])
def test_step_counts_outside_the_range_are_one_line_errors(kw, msg):
    with pytest.raises(ValueError, match=msg) as e:
        LabConfig(**kw)
    assert "\n" not in str(e.value)
