import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_fixtures import (
    Ctx,
    add,
    advantages,
    close,
    components,
    group,
    mixed_group,
    record_updates,
    replayed_groups,
    sample,
    tag,
)
from torch.testing import assert_close

from groupwise.config import load
from groupwise.loop.trainer import rl_step
from groupwise.methods.hdr.buffer import (
    HDR,
    HDRConfig,
    group_drift,
    group_headroom,
    reference_headroom,
    token_headroom,
)
from groupwise.registry import ConfigError

L = math.log


def pinned_group(step=0):
    """s0: A=+1; s1: A=-1 with a NaN (edited) token; s2: A=0 with a masked token. T(g) has 4 tokens."""
    return tag([group([sample([L(.5), L(.25)], 1.0, reward=1.0),
                       sample([L(.5), math.nan], -1.0, reward=0.0),
                       sample([L(.9), L(.6)], 0.0, reward=0.5, mask=[True, False])], step=step, pid="g")])[0]


CURRENT = {("g", 0): [L(.8), L(.25)], ("g", 1): [L(.4), L(.3)], ("g", 2): [L(.9), L(.1)]}
# H(π_gen) = ((1-.5) + (1-.25) + .5 + 0) / 4 = 1.75 / 4                      = 0.4375
# H(π_cur) = ((1-.8) + (1-.25) + .4 + 0) / 4 = 1.35 / 4                      = 0.3375
# D        = (ln(.8/.5)² + 0 + ln(.4/.5)² + 0) / 4 = (0.2209034115 + 0.0497930445) / 4 = 0.0676741140
H_REF, H_CUR, D = 0.4375, 0.3375, (L(1.6) ** 2 + L(0.8) ** 2) / 4


def test_token_headroom_pinned():
    lp = torch.tensor([L(.8), L(.8), L(.8)], dtype=torch.float64)
    assert_close(token_headroom(lp, torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)),
                 torch.tensor([0.2, 0.8, 0.0], dtype=torch.float64), rtol=0, atol=1e-12)


def test_headroom_and_drift_pinned_through_the_buffer():
    buf = HDR(HDRConfig(replay_groups=1, tau=math.inf))
    add(buf, [pinned_group()], 0)
    assert close(buf.store.entries[0].headroom, H_REF)  # the cache starts at H(g; π_gen)
    assert close(buf.metrics()["replay/headroom_ingress"], H_REF)
    ctx = Ctx(current=CURRENT)
    (rep,) = buf.sample(1, ctx)
    out = rep.group
    m = buf.metrics()
    assert close(m["replay/headroom_replayed"], H_CUR) and close(m["replay/drift_scanned"], D)
    assert close(D, 0.0676741140, 1e-9)
    assert close(buf.store.entries[0].headroom, H_CUR)  # refreshed to the runtime headroom
    # behaviour log-probs = stored π_gen; the NaN (edited) token takes the current policy's value (ratio 1)
    assert_close(out.samples[1].old_logprobs, torch.tensor([L(.5), L(.3)]), rtol=0, atol=1e-7)
    assert rep.advantages.tolist() == [1.0, -1.0, 0.0] and out.replayed


def test_group_functions_match_the_pinned_values():
    g = pinned_group()
    assert close(reference_headroom(g, advantages([g])[0].tolist()), H_REF)
    gen = torch.tensor([L(.5), L(.25), L(.5), L(.9)], dtype=torch.float64)
    cur = torch.tensor([L(.8), L(.25), L(.4), L(.9)], dtype=torch.float64)
    sign = torch.tensor([1.0, 1.0, -1.0, 0.0], dtype=torch.float64)
    assert close(group_headroom(cur, sign), H_CUR, 1e-12) and close(group_drift(cur, gen), D, 1e-12)


def test_degenerate_groups():
    # property 1: all A = 0 gives H = 0; an empty T(g) gives H = 0 and D = 0
    lp = torch.tensor([-0.1, -3.0], dtype=torch.float64)
    assert group_headroom(lp, torch.zeros(2, dtype=torch.float64)) == 0.0
    empty = torch.zeros(0, dtype=torch.float64)
    assert group_headroom(empty, empty) == 0.0 and group_drift(empty, empty) == 0.0
    # property 2: the current policy equals π_gen on the stored tokens -> D = 0 and H_cur = H_ref
    buf = HDR(HDRConfig(replay_groups=1, tau=0.0))
    add(buf, [mixed_group("a", pos=-0.3, neg=-1.2)], 0)
    h_ref = buf.store.entries[0].headroom
    assert close(h_ref, ((1 - math.exp(-0.3)) + math.exp(-1.2)) / 2)
    assert len(buf.sample(1, Ctx())) == 1  # D = 0 <= τ = 0: admitted even by the tightest gate
    m = buf.metrics()
    assert m["replay/drift_scanned"] == 0.0 and close(m["replay/headroom_replayed"], h_ref)


logprob = st.floats(min_value=-12.0, max_value=0.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(logprob, logprob, st.sampled_from([-1.0, 0.0, 1.0])), min_size=1, max_size=40))
def test_prop2_headroom_moves_at_most_sqrt_drift(tokens):
    # property 3 (Prop. 2): |H(π_cur) - H(π_gen)| <= sqrt(D), and H in [0, 1], D >= 0
    gen, cur, sign = (torch.tensor(c, dtype=torch.float64) for c in zip(*tokens))
    h_cur, h_ref, d = group_headroom(cur, sign), group_headroom(gen, sign), group_drift(cur, gen)
    assert 0.0 <= h_cur <= 1.0 and 0.0 <= h_ref <= 1.0 and d >= 0.0
    assert abs(h_cur - h_ref) <= math.sqrt(d) + 1e-12


def test_rank_by_cached_headroom_and_admit_by_drift():
    buf = HDR(HDRConfig(replay_groups=2, tau=0.1))
    # H(π_gen) = ((1 - e^pos) + e^neg) / 2: top .970, mid .500, mid2 .428, low .008
    groups = [mixed_group("low", pos=-0.01, neg=-5.0), mixed_group("top", pos=-3.0, neg=-0.01),
              mixed_group("mid", pos=-1.0, neg=-1.0), mixed_group("mid2", pos=-1.0, neg=-1.5)]
    add(buf, groups, 0)
    order = [e.group.problem.id for e in sorted(buf.store.entries, key=lambda e: -e.headroom)]
    assert order == ["top", "mid", "mid2", "low"]
    ctx = Ctx(shift={"top": -0.5})  # top drifted: D = 0.25 > τ; the others did not move
    out = replayed_groups(buf.sample(1, ctx))
    assert [g.problem.id for g in out] == ["mid", "mid2"]
    # one pass per scanned group, in chunks of (K - admitted): [top, mid], then [mid2]; "low" never scanned
    assert [[s.meta["pid"] for s in call] for call in ctx.calls] == [["top"] * 2 + ["mid"] * 2, ["mid2"] * 2]
    m = buf.metrics()
    assert m["replay/scanned"] == 3 and m["replay/accept_rate"] == pytest.approx(2 / 3)
    assert m["replay/accept_rate_age1"] == pytest.approx(2 / 3) and "replay/accept_rate_age2" not in m
    # D by age: top 0.25 (every token shifted by -0.5), mid and mid2 0, all three stored one step ago
    assert close(m["replay/drift_scanned_age1"], 0.25 / 3) and "replay/drift_scanned_age2" not in m
    top = next(e for e in buf.store.entries if e.group.problem.id == "top")
    # the rejected group's cache moved to its headroom under the current policy
    assert close(top.headroom, ((1 - math.exp(-3.5)) + math.exp(-0.51)) / 2)


def test_equal_headroom_and_no_gate_replays_the_most_recent_groups():
    # property 5: with ties everywhere and τ = ∞ the order is the store's, newest first (= fifo's choice)
    from groupwise.methods.hdr.store import SimpleReplay, StoreConfig

    hdr = HDR(HDRConfig(replay_groups=3, tau=math.inf))
    fifo = SimpleReplay(StoreConfig(replay_groups=3), "fifo")
    for step in range(3):
        batch = [mixed_group(f"s{step}g{i}", step=step) for i in range(2)]
        add(hdr, batch, step)
        add(fifo, batch, step)
    got = [g.problem.id for g in replayed_groups(hdr.sample(3, Ctx()))]
    assert got == ["s2g1", "s2g0", "s1g1"] == [g.problem.id for g in replayed_groups(fifo.sample(3, Ctx()))]


def test_never_replays_a_group_in_its_own_step_and_counts_ages():
    buf = HDR(HDRConfig(replay_groups=4, tau=math.inf))
    add(buf, [mixed_group("old")], 1)
    add(buf, [mixed_group("new")], 3)
    ctx = Ctx()
    assert [g.problem.id for g in replayed_groups(buf.sample(3, ctx))] == ["old"]  # property 7: "new" is from step 3
    assert ctx.scanned() == ["old", "old"]
    m = buf.metrics()
    assert (m["replay/scanned_age2"], m["replay/accepted_age2"], m["replay/scanned_age1"]) == (1.0, 1.0, 0.0)
    assert [g.meta["replay_age"] for g in replayed_groups(buf.sample(4, Ctx()))] == [1, 3]


def test_closed_gate_and_zero_budget_make_no_replay():
    buf = HDR(HDRConfig(replay_groups=2, tau=0.0))
    add(buf, [mixed_group("a"), mixed_group("b")], 0)
    ctx = Ctx(shift={"a": -0.1, "b": -0.2})
    assert buf.sample(1, ctx) == [] and buf.metrics()["replay/accept_rate"] == 0.0
    zero = HDR(HDRConfig(replay_groups=0))
    add(zero, [mixed_group("a")], 0)
    ctx = Ctx()
    assert zero.sample(1, ctx) == [] and ctx.calls == []  # K_rep = 0: not even a forward pass


def test_replayed_copies_and_ratio_reference():
    g = mixed_group("a", pos=-0.2, neg=-0.7)
    cur = HDR(HDRConfig(replay_groups=1, tau=math.inf, replay_ratio_ref="current"))
    gen = HDR(HDRConfig(replay_groups=1, tau=math.inf))
    for buf in (cur, gen):
        add(buf, [g], 0)
    g.samples[0].rollout_logprobs.fill_(99.0)  # the stored copy does not alias the fresh group
    (a,) = replayed_groups(cur.sample(1, Ctx(shift={"a": -0.05})))
    (rb,) = gen.sample(1, Ctx(shift={"a": -0.05}))
    b = rb.group
    assert_close(a.samples[0].old_logprobs, torch.full((2,), -0.25), rtol=0, atol=1e-7)  # current policy
    assert_close(b.samples[0].old_logprobs, torch.full((2,), -0.2), rtol=0, atol=1e-7)  # stored π_gen
    assert a.replayed and b.replayed and rb.advantages.tolist() == [1.0, -1.0]
    stored = gen.store.entries[0].group
    assert not stored.replayed and stored.samples[0].old_logprobs is None


def test_ingress_admits_mixed_groups_only():
    buf = HDR(HDRConfig(replay_groups=1))
    same = group([sample([-1.0], 0.0, reward=1.0), sample([-1.0], 0.0, reward=1.0)], pid="same")
    add(buf, [same, mixed_group("mixed")], 0)
    assert [e.group.problem.id for e in buf.store.entries] == ["mixed"]
    assert buf.metrics()["replay/ingress_frac"] == 0.5 and close(buf.metrics()["replay/headroom_fresh"], 0.25)
    # mixed_correct: rewards differ (a length term) but every answer is wrong -> not admitted
    by_answer = HDR(HDRConfig(replay_groups=1, ingress="mixed_correct"))
    shaped = group([sample([-1.0], 1.0, reward=0.3, correct=False),
                    sample([-1.0], -1.0, reward=0.1, correct=False)])
    add(by_answer, [shaped], 0)
    assert by_answer.store.entries == []


def test_budget_from_ratio_and_config_errors():
    buf = HDR(HDRConfig(tau=math.inf))  # default: K_rep = 0.5 × fresh groups of the previous step
    add(buf, [mixed_group(f"g{i}") for i in range(16)] + [group([sample([-1.0]), sample([-1.0])])] * 4, 0)
    assert len(buf.sample(1, Ctx())) == 10 and buf.metrics()["replay/budget"] == 10.0
    cfg = load(None, ["replay.name=hdr", "replay.tau=inf", "replay.replay_ratio=0.25"])
    assert cfg.replay.cfg.tau == math.inf and cfg.replay.cfg.replay_ratio == 0.25
    with pytest.raises(ConfigError, match=r"replay: tau=-0.001: the drift threshold must be >= 0"):
        load(None, ["replay.name=hdr", "replay.tau=-1e-3"])
    with pytest.raises(ConfigError, match="either replay_groups or replay_ratio"):
        load(None, ["replay.name=hdr", "replay.replay_groups=8", "replay.replay_ratio=0.5"])


def test_checkpoint_round_trip():
    buf = HDR(HDRConfig(replay_groups=2, tau=0.1, capacity=3))
    for step in range(4):
        add(buf, [pinned_group(step) if step == 1 else mixed_group(f"s{step}", pos=-step - 0.1)], step)
    assert [e.step for e in buf.store.entries] == [1, 2, 3]  # property 8: C = 3, the oldest evicted first
    buf.sample(4, Ctx(shift={"s3": -1.0}))  # refresh some cached headroom first
    blob = io.BytesIO()
    torch.save(buf.state_dict(), blob)
    blob.seek(0)
    back = HDR(HDRConfig(replay_groups=2, tau=0.1, capacity=3))
    back.load_state_dict(torch.load(blob, weights_only=True))  # plain containers and tensors only
    assert [(e.step, e.index, e.headroom) for e in back.store.entries] == \
           [(e.step, e.index, e.headroom) for e in buf.store.entries]
    a, b = buf.sample(5, Ctx(current=CURRENT)), back.sample(5, Ctx(current=CURRENT))
    assert [r.group.problem for r in a] == [r.group.problem for r in b] and len(a) == 2
    for ra, rb in zip(a, b):
        assert torch.equal(ra.advantages, rb.advantages)
        for sa, sb in zip(ra.group.samples, rb.group.samples):
            assert torch.equal(sa.completion_ids, sb.completion_ids)
            assert torch.equal(sa.old_logprobs, sb.old_logprobs) and torch.equal(sa.loss_mask, sb.loss_mask)


# ------------------------------------------------------------ in the engine (tiny model, fake generator)
def params(c):
    return [p.detach().clone() for p in c.policy.parameters()]


def test_closed_gate_or_zero_budget_update_equals_plain_grpo():
    # property 4: no replay -> the update is bit-identical to the matched GRPO baseline
    runs = {"none": components(), "k0": components("replay.name=hdr", "replay.replay_groups=0"),
            "tau0": components("replay.name=hdr", "replay.tau=0")}
    scanned = 0.0
    for step in range(2):
        for name, c in runs.items():
            m = rl_step(c, step)
            scanned += m.get("replay/scanned", 0.0) if name == "tau0" else 0.0
    assert scanned > 0  # the gate really was asked (fake log-probs are far from the model's: D > 0)
    base = params(runs["none"])
    for name in ("k0", "tau0"):
        assert all(torch.equal(a, b) for a, b in zip(base, params(runs[name]))), name


def test_fresh_stream_is_untouched_and_replay_only_appends():
    # property 6 (same seed, same policy at step 1) and property 9 in the real loop
    plain, hdr = components(), components("replay.name=hdr", "replay.tau=inf", "replay.replay_groups=2")
    seen_plain, seen_hdr = record_updates(plain), record_updates(hdr)
    calls: list[int] = []
    real = hdr.policy_logprobs
    hdr.policy_logprobs = lambda samples: calls.append(len(samples)) or real(samples)
    generated, gen_calls = [0], []
    real_generate, real_sample = hdr.generator.generate, hdr.replay.sample
    hdr.generator.generate = lambda *a: generated.__setitem__(0, generated[0] + 1) or real_generate(*a)

    def sample_counting_generation(step, ctx):
        before = generated[0]
        out = real_sample(step, ctx)
        gen_calls.append(generated[0] - before)
        return out

    hdr.replay.sample = sample_counting_generation
    for step in range(2):
        rl_step(plain, step)
        m = rl_step(hdr, step)
    fresh, mixed = seen_plain[1], seen_hdr[1]
    assert len(mixed) == len(fresh) + 2 * 4 and m["update/replay_rows"] == 8.0
    for (a, adv_a), (b, adv_b) in zip(fresh, mixed):
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.equal(a.rollout_logprobs, b.rollout_logprobs)
        assert adv_a == adv_b and a.old_logprobs is None and b.old_logprobs is None
    assert all(s.old_logprobs is not None for s, _ in mixed[len(fresh):])
    # fresh generation once per step, none inside the buffer; one pass over 2 scanned groups x 4 samples
    assert generated == [2] and gen_calls == [0, 0] and calls == [8]
    assert m["replay/scanned"] == 2 and 0 < m["replay/token_share"] < 1 and m["replay/groups"] == 2


def test_engine_checkpoints_the_buffer_state():
    # the trainer saves {name: part.state_dict() for name, part in c.stateful().items()} and restores it on
    # --resume: the hdr store (groups, steps, insertion counter, cached headroom) survives that round trip
    c = components("replay.name=hdr", "replay.tau=inf", "replay.replay_groups=2")
    for step in range(2):
        rl_step(c, step)
    assert "buffer" in c.stateful() and c.replay.store.entries
    blob = io.BytesIO()
    torch.save({k: v.state_dict() for k, v in c.stateful().items()}, blob)
    blob.seek(0)
    back = components("replay.name=hdr", "replay.tau=inf", "replay.replay_groups=2")
    back.replay.load_state_dict(torch.load(blob, weights_only=False)["buffer"])
    key = [(e.step, e.index, e.headroom, e.advantages, e.group.problem) for e in c.replay.store.entries]
    assert [(e.step, e.index, e.headroom, e.advantages, e.group.problem) for e in back.replay.store.entries] == key
    assert back.replay.store.inserted == c.replay.store.inserted
    for ea, eb in zip(c.replay.store.entries, back.replay.store.entries):
        for sa, sb in zip(ea.group.samples, eb.group.samples):
            assert torch.equal(sa.completion_ids, sb.completion_ids)
            assert torch.allclose(sa.rollout_logprobs, sb.rollout_logprobs, rtol=0, atol=0, equal_nan=True)
