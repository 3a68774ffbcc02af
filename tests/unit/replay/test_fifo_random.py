import io
import math

import pytest
import torch
from replay_fixtures import Ctx, add, group, mixed_group, replayed_groups, sample, tag
from torch.testing import assert_close

from groupwise.config import load
from groupwise.methods.hdr.store import SimpleReplay, StoreConfig
from groupwise.replay import BUFFERS


def fifo(**kw) -> SimpleReplay:
    return BUFFERS.get("fifo").build(StoreConfig(**kw))  # as a run builds it


def ids(groups):
    return [(g.group if hasattr(g, "group") else g).problem.id for g in groups]  # Replayed or stored groups


def fill(buf, steps, per_step=2):
    for step in range(steps):
        add(buf, [mixed_group(f"s{step}g{i}", step=step) for i in range(per_step)], step)


def test_registered_names():
    assert {"none", "fifo", "random", "hdr"} <= set(BUFFERS.names())
    assert load(None, ["replay.name=random", "replay.replay_groups=3"]).replay.cfg.replay_groups == 3


def test_fifo_replays_the_most_recent_groups_from_earlier_steps():
    buf = fifo(replay_groups=3)
    fill(buf, 3)
    add(buf, [mixed_group("now")], 3)  # stored in the step being sampled: never replayed in it
    out = replayed_groups(buf.sample(3, Ctx()))
    assert ids(out) == ["s2g1", "s2g0", "s1g1"]
    assert [g.meta["replay_age"] for g in out] == [1, 1, 2] and all(g.replayed for g in out)
    assert buf.metrics()["replay/age_mean"] == pytest.approx(4 / 3)


def test_capacity_and_fifo_eviction():
    buf = fifo(replay_groups=10, capacity=3)
    fill(buf, 3)  # 6 groups offered, 3 kept: the newest, in insertion order
    assert ids(e.group for e in buf.store.entries) == ["s1g1", "s2g0", "s2g1"]
    # evicted since the last sample: 1 at step 1 (4 > 3) and 2 at step 2
    assert buf.metrics()["replay/evicted"] == 3.0 and buf.metrics()["replay/buffer_size"] == 3.0
    assert [e.index for e in buf.store.entries] == [3, 4, 5]


def test_max_age_drops_old_groups_before_sampling():
    buf = fifo(replay_groups=10, max_age=2)
    fill(buf, 4, per_step=1)
    assert ids(buf.sample(4, Ctx())) == ["s3g0", "s2g0"]  # ages 1 and 2 kept, 3 and 4 dropped
    assert len(buf.store.entries) == 2 and buf.metrics()["replay/evicted"] == 2.0


def test_ingress_and_copies():
    buf = fifo(replay_groups=2)
    flat = group([sample([-1.0], 0.0, reward=0.0), sample([-1.0], 0.0, reward=0.0)], pid="flat")
    g = mixed_group("m", pos=-0.25, neg=-0.75)
    add(buf, [flat, g], 0)
    g.samples[0].rollout_logprobs.fill_(0.0)  # the store holds its own copy
    (rep,) = buf.sample(1, Ctx())
    out = rep.group
    assert ids([out]) == ["m"] and rep.advantages.tolist() == [1.0, -1.0]  # the buffer's own record
    assert_close(out.samples[0].old_logprobs, torch.full((2,), -0.25), rtol=0, atol=0)  # π_gen
    assert_close(out.samples[1].old_logprobs, torch.full((2,), -0.75), rtol=0, atol=0)
    assert buf.store.entries[0].group.samples[0].old_logprobs is None  # replaying does not touch the store


def test_ingress_all_stores_every_group_in_order():
    buf = fifo(replay_groups=2, ingress="all")
    flat = group([sample([-1.0], 0.0, reward=0.0), sample([-1.0], 0.0, reward=0.0)], pid="flat")
    add(buf, [mixed_group("m"), flat], 0)
    assert [e.group.problem.id for e in buf.store.entries] == ["m", "flat"]
    assert buf.metrics()["replay/ingress_frac"] == 1.0
    (first, last) = buf.sample(1, Ctx())  # the most recent first: the uniform group, with its zero advantages
    assert ids([first.group, last.group]) == ["flat", "m"] and first.advantages.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="ingress='every': allowed mixed_reward, mixed_correct, all"):
        StoreConfig(ingress="every")


def test_no_model_call_unless_a_token_lacks_a_generator_logprob():
    buf = fifo(replay_groups=2)
    edited = tag([group([sample([-0.5, math.nan], 1.0), sample([-0.5, -0.5], -1.0)], pid="e")])[0]
    add(buf, [mixed_group("a"), edited], 0)
    ctx = Ctx()
    out = {g.problem.id: g for g in replayed_groups(buf.sample(1, ctx))}
    assert [[s.meta["pid"] for s in call] for call in ctx.calls] == [["e"]]  # only the sample with a NaN
    assert_close(out["e"].samples[0].old_logprobs, torch.tensor([-0.5, -2.0]), rtol=0, atol=0)


def test_random_is_uniform_without_replacement_and_seeded():
    buf = BUFFERS.get("random").build(StoreConfig(replay_groups=3))
    fill(buf, 4)
    a, b = ids(buf.sample(4, Ctx(seed=1))), ids(buf.sample(4, Ctx(seed=1)))
    assert a == b and len(set(a)) == 3
    counts: dict[str, int] = {}
    for seed in range(400):
        for name in ids(buf.sample(4, Ctx(seed=seed))):
            counts[name] = counts.get(name, 0) + 1
    assert set(counts) == {f"s{s}g{i}" for s in range(4) for i in range(2)}
    # every stored group, roughly evenly: 400 draws x 3 / 8 groups = 150 expected each
    assert max(counts.values()) - min(counts.values()) < 0.35 * 150


def test_budget_ratio_and_token_share():
    buf = fifo(replay_ratio=0.25)
    fill(buf, 1, per_step=8)
    out = buf.sample(1, Ctx())
    assert len(out) == 2 and buf.metrics()["replay/budget"] == 2.0
    add(buf, [mixed_group(f"x{i}", step=1, tokens=3) for i in range(2)], 1)
    # replayed: 2 groups x 2 samples x 2 tokens = 8; fresh: 2 x 2 x 3 = 12 -> share 8 / 20
    assert buf.metrics()["replay/token_share"] == pytest.approx(0.4)


def test_state_round_trip():
    buf = fifo(replay_groups=2, capacity=3)
    fill(buf, 3)
    blob = io.BytesIO()
    torch.save(buf.state_dict(), blob)
    blob.seek(0)
    back = fifo(replay_groups=2, capacity=3)
    back.load_state_dict(torch.load(blob, weights_only=True))
    assert ids(back.sample(3, Ctx())) == ids(buf.sample(3, Ctx())) == ["s2g1", "s2g0"]
    add(back, [mixed_group("new", step=3)], 3)  # insertion counter restored: eviction order continues
    assert ids(e.group for e in back.store.entries) == ["s2g0", "s2g1", "new"]
    assert back.store.entries[-1].index == 6
