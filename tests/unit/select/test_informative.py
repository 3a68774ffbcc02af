import types

import pytest
import torch

from groupwise.config import load
from groupwise.loop.setup import build
from groupwise.loop.trainer import rl_step
from groupwise.registry import BuildEnv
from groupwise.select import SELECTORS
from groupwise.standard.informative_selector import InformativeConfig, InformativeSelector, zero_variance
from groupwise.standard.random_selector import RandomSelector
from groupwise.types import Group, Problem, Sample


class Procedural:
    """A procedural split (more items than ``random`` permutes): item i has difficulty 1 + i % 2."""

    def __len__(self):
        return 10**8

    def __getitem__(self, i):
        return Problem(id=f"p{i}", prompt="x", answer="0", difficulty=1 + i % 2)


def task(finite: bool = False):
    train = [Problem(id=f"p{i}", prompt="x", answer="0", difficulty=1 + i % 2) for i in range(50)]
    return types.SimpleNamespace(train=train if finite else Procedural())


def group(difficulty: int, rewards: list[float], pid: str = "q") -> Group:
    s = [Sample(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.zeros(1),
                torch.ones(1, dtype=torch.bool), "stop", reward=r) for r in rewards]
    return Group(Problem(id=pid, prompt="x", answer="0", difficulty=difficulty), s)


def test_zero_variance_and_the_moving_average_pinned():
    assert zero_variance(group(1, [1.0, 1.0])) and zero_variance(group(1, [0.0, 0.0]))
    assert not zero_variance(group(1, [0.0, 1.0]))
    sel = InformativeSelector(InformativeConfig(decay=0.1, min_groups=3), task(), seed=0)
    sel.observe([group(1, [1.0, 1.0])])  # the first group sets z: 1
    assert sel.z["1"] == 1.0 and sel.skip_probability(Problem("a", "x", "0", 1)) == 0.0  # 1 group < min_groups
    sel.observe([group(1, [0.0, 1.0])])  # 0.9 * 1 + 0.1 * 0 = 0.9
    sel.observe([group(1, [0.0, 0.0])])  # 0.9 * 0.9 + 0.1 * 1 = 0.91
    assert sel.z["1"] == pytest.approx(0.91, abs=1e-12) and sel.seen["1"] == 3
    assert sel.skip_probability(Problem("a", "x", "0", 1)) == pytest.approx(0.9)  # capped at max_skip
    assert sel.skip_probability(Problem("b", "x", "0", 2)) == 0.0  # a level never observed
    by_id = InformativeSelector(InformativeConfig(key="problem", min_groups=1), task(), seed=0)
    by_id.observe([group(1, [1.0, 1.0], pid="q7")])
    assert by_id.z == {"q7": 1.0}


@pytest.mark.parametrize("finite", [False, True])
def test_max_skip_zero_draws_exactly_what_random_draws(finite):
    t = task(finite)
    ref, sel = RandomSelector(t, seed=3), InformativeSelector(InformativeConfig(max_skip=0.0, min_groups=1), t, 3)
    sel.observe([group(1, [1.0] * 4), group(2, [0.0] * 4)])  # every level predicted zero-variance
    for step in range(5):
        assert [p.id for p in sel.next(step, 7)] == [p.id for p in ref.next(step, 7)]
    assert sel.metrics()["select/skipped"] == 0


def test_a_level_that_never_varies_is_mostly_skipped():
    sel = InformativeSelector(InformativeConfig(max_skip=0.9, min_groups=4), task(), seed=0)
    sel.observe([group(1, [1.0] * 8) for _ in range(4)] + [group(2, [0.0, 1.0] * 4) for _ in range(4)])
    got = [p for step in range(25) for p in sel.next(step, 8)]
    assert len(got) == 200
    share = sum(p.difficulty == 1 for p in got) / len(got)
    # level 1 kept with probability 0.1: its expected share 0.5·0.1 / (0.5·0.1 + 0.5) = 0.091 (binomial SE 0.02)
    assert 0.03 < share < 0.16
    m = sel.metrics()  # the last step's: its skipped candidates, and the returned problems' mean prediction
    assert m["select/forced"] == 0 and m["select/predicted_zero_var"] == pytest.approx(
        sum(1.0 for p in got[-8:] if p.difficulty == 1) / 8)


def test_when_the_draws_run_out_the_skipped_fill_the_rest():
    sel = InformativeSelector(InformativeConfig(max_skip=0.9, min_groups=1, max_draws=1), task(), seed=0)
    sel.observe([group(1, [1.0] * 4), group(2, [1.0] * 4)])  # everything skipped with probability 0.9
    got = sel.next(0, 20)
    m = sel.metrics()
    # one draw per problem: the 20 candidates are all there is, so every skipped one comes back (none counts as
    # skipped) and the step gets exactly random's 20 problems, the kept ones first
    assert m["select/forced"] > 10 and m["select/skipped"] == 0
    assert sorted(p.id for p in got) == sorted(p.id for p in RandomSelector(task(), seed=0).next(0, 20))


def test_a_restored_selector_draws_what_the_original_draws():
    a = InformativeSelector(InformativeConfig(min_groups=1), task(), seed=1)
    a.observe([group(1, [1.0] * 4), group(2, [0.0, 1.0])])
    a.next(0, 8)
    b = InformativeSelector(InformativeConfig(min_groups=1), task(), seed=1)
    b.load_state_dict(a.state_dict())
    assert [p.id for p in a.next(1, 8)] == [p.id for p in b.next(1, 8)]


def test_bad_settings_are_refused_in_one_line():
    for kw, key in (({"max_skip": 1.0}, "select.max_skip"), ({"decay": 0.0}, "select.decay"),
                    ({"min_groups": 0}, "select.min_groups")):
        with pytest.raises(ValueError, match=key):
            InformativeConfig(**kw)


def test_the_rollout_stage_shows_the_selector_every_scored_group():
    cfg = load("recipes/informative_lab.yaml", ("model.warm_start=false", "trainer.threads=1", "trainer.steps=2",
                                                 "rollout.prompts_per_step=3", "rollout.group_size=2",
                                                 "rollout.max_completion_tokens=4", "eval.before=false",
                                                 "eval.after=false"))
    c = build(cfg)
    assert isinstance(c.selector, InformativeSelector)
    metrics = [rl_step(c, step) for step in range(2)]
    assert sum(c.selector.seen.values()) == 6  # 3 groups a step, each observed once
    entry = SELECTORS.get("informative")
    assert "select/skipped" in metrics[-1] and entry.stateful and entry.reports
    assert isinstance(entry.build(InformativeConfig(), BuildEnv(run=cfg, seed=0, task=task())), InformativeSelector)
