"""Weight-sync verification (``loop/sync_check.py``): the probe's gap is pinned on a scripted engine; a
generator that holds its own copy of the weights and whose sync silently does nothing stops the run
(``error``), or is resynced and counted (``resync``); a good sync logs 0 failures every step; ``none`` and a
scripted generator (``fake``) check nothing. The Ray path is in ``test_workers.py`` (its Ray session)."""

import copy

import pytest
import torch

from groupwise.config import load
from groupwise.loop.setup import build
from groupwise.loop.sync_check import PROBE_TOKENS, StaleEngineError, SyncCheck, shares, tolerance
from groupwise.loop.trainer import rl_step
from groupwise.models.forward import completion_logprobs, pack
from groupwise.registry import ConfigError
from groupwise.types import Completion

ARGS = ["model.warm_start=false", "trainer.threads=1", "trainer.record_groups=0", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_completion_tokens=8", "optim.lr=1e-2",
        "reward.terms=[{name: length_penalty, max_length: 8}]",  # lengths vary: steps move the weights
        "seed=1"]  # seed 0's first step happens to tie every group (test_a_good_sync_... pins that step 0 moves them)


def pipeline(tmp_path, *overrides):
    return build(load(None, [*ARGS, f"out_dir={tmp_path}", *overrides]), io=False)


def own_copy(p, sync):
    """Make the hf generator sample from its own copy of the policy (as an async generator's snapshot does),
    synced by ``sync(copy, policy)``."""
    gen = p.generator.inner
    gen.model = copy.deepcopy(p.policy)
    gen.sync_weights = lambda model: sync(gen.model, model)


def copy_weights(dst, src):
    with torch.no_grad():
        for a, b in zip(dst.parameters(), src.parameters()):
            a.copy_(b)


class Scripted:
    """An engine that answers the probe with fixed tokens and the trainer's log-probs shifted by ``offset``."""

    def __init__(self, model, pad_id, offset):
        self.model, self.pad_id, self.offset, self.calls = model, pad_id, offset, 0

    def generate(self, requests, params, rng):
        self.calls += 1
        assert params.temperature == 0 and params.max_tokens == PROBE_TOKENS
        ids = torch.arange(3, 3 + PROBE_TOKENS)
        with torch.no_grad():
            lp = completion_logprobs(self.model, pack([requests[0].prompt_ids], [ids], self.pad_id), 1.0).logprobs[0]
        lp = lp + self.offset
        lp[0] = float("nan")  # a token the engine reports no log-prob for (forced): left out of the mean
        return [Completion(ids, lp, "length")]


def test_gap_is_the_mean_abs_logprob_difference(tmp_path):
    p = pipeline(tmp_path)
    pad = p.tokenizer.pad_token_id
    offsets = torch.zeros(PROBE_TOKENS)
    offsets[1::2], offsets[2::2] = 0.01, -0.03
    # mean |offset| over tokens 1..31 (token 0 has no engine log-prob): 16 odd ones at 0.01, 15 even ones at 0.03
    expected = (16 * 0.01 + 15 * 0.03) / 31
    engine = Scripted(p.policy, pad, offsets)
    check = SyncCheck("error", expected + 1e-6, torch.tensor([5, 6, 7]), pad)
    check.verify("generator 'scripted'", engine, p.policy, lambda: None)
    m = check.metrics()
    assert m["sync/failures"] == 0 and m["sync/probe_dlogp"] == pytest.approx(expected, abs=1e-6)
    check.tol = expected - 1e-6
    with pytest.raises(StaleEngineError, match=r"^rollout\.sync_check: generator 'scripted' does not hold"):
        check.verify("generator 'scripted'", engine, p.policy, lambda: None)


def test_resync_counts_and_probes_again(tmp_path):
    p = pipeline(tmp_path)
    engine = Scripted(p.policy, p.tokenizer.pad_token_id, 0.5)
    check, resyncs = SyncCheck("resync", 1e-3, torch.tensor([5, 6, 7]), p.tokenizer.pad_token_id), []

    def resync():
        resyncs.append(1)
        engine.offset = 0.0  # the second sync works

    check.verify("generator 'scripted'", engine, p.policy, resync)
    assert resyncs == [1] and engine.calls == 2 and check.metrics()["sync/failures"] == 1
    engine.offset = 0.5
    with pytest.raises(StaleEngineError, match="after a resync"):  # a resync that does not help stops the run
        check.verify("generator 'scripted'", engine, p.policy, lambda: None)


def test_default_tolerance_follows_the_dtype():
    assert tolerance(0.0, "float32") == 1e-3 and tolerance(0.0, "bfloat16") == 5e-2 and tolerance(0.2, "float32") == 0.2


@pytest.mark.parametrize(("overrides", "message"), [
    # YAML: off = false
    (["rollout.sync_check=off"], "rollout.sync_check: False is not allowed; allowed: none, resync, error"),
    (["rollout.sync_check=none", "rollout.sync_check_tol=0.1"], "sync_check_tol=0.1: unused with sync_check=none"),
    (["rollout.sync_check_tol=-1"], "sync_check_tol=-1.0: allowed >= 0"),
])
def test_bad_keys_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_good_sync_logs_zero_failures_every_step(tmp_path):
    p = pipeline(tmp_path)
    own_copy(p, copy_weights)
    metrics = [rl_step(p, s) for s in range(3)]
    assert [m["sync/failures"] for m in metrics] == [0.0] * 3
    assert all(m["sync/probe_dlogp"] < 1e-5 for m in metrics) and all(m["perf/sync_check_s"] > 0 for m in metrics)
    assert metrics[0]["update/grad_norm"] > 0, "the weights moved: a stale copy would differ"


def test_an_engine_sharing_the_policy_is_probed_once(tmp_path):
    """The default ``hf`` generator samples from the policy's own parameters (its sync returns True): probed
    before its first generation only, so the check costs nothing per step."""
    p = pipeline(tmp_path)
    calls: list[int] = []
    generate = p.generator.inner.generate
    p.generator.inner.generate = lambda reqs, params, rng: (calls.append(len(reqs)), generate(reqs, params, rng))[1]
    metrics = [rl_step(p, s) for s in range(2)]
    assert calls.count(1) == 1, "one probe (a single request), before the first rollout"
    assert metrics[1]["sync/failures"] == 0 and metrics[1]["perf/sync_check_s"] == 0


def test_a_step_without_a_probe_logs_no_gap(tmp_path):
    """A step whose engine was not probed after a sync (the shared ``hf`` engine: only its first generation is
    probed, unlogged) leaves ``sync/probe_dlogp`` out: a 0 would read as a probe that ran and passed."""
    p = pipeline(tmp_path)
    metrics = [rl_step(p, s) for s in range(2)]
    assert [("sync/probe_dlogp" in m, m["sync/failures"]) for m in metrics] == [(False, 0.0)] * 2
    assert "sync/probe_dlogp" not in SyncCheck("error", 1e-3, torch.tensor([5]), 0).metrics()


def test_a_claim_to_share_the_policy_is_verified(tmp_path):
    """``sync_weights`` returning True is believed only when the engine's ``model`` holds the policy's parameter
    storage; a copy that returns True ("the sync worked") is probed after every sync like any copy."""
    p = pipeline(tmp_path, "rollout.sync_check=error")
    assert shares(p.generator.engine, p.policy) and not shares(object(), p.policy)
    assert not shares(type("E", (), {"model": copy.deepcopy(p.policy)})(), p.policy)
    own_copy(p, lambda dst, src: True)  # claims to share, copies nothing
    with pytest.raises(StaleEngineError, match=r"^rollout\.sync_check: generator 'hf' \(its sync_weights returned "
                                               r"True, yet it does not share the trainer's parameters\) does not hold"):
        rl_step(p, 0)
    good = pipeline(tmp_path)
    own_copy(good, lambda dst, src: (copy_weights(dst, src), True)[1])  # a working copy that returns True
    metrics = [rl_step(good, s) for s in range(2)]
    assert all(m["sync/failures"] == 0 and m["sync/probe_dlogp"] < 1e-5 for m in metrics)


def test_a_sync_that_does_nothing_stops_the_run(tmp_path):
    p = pipeline(tmp_path, "rollout.sync_check=error")
    own_copy(p, lambda dst, src: None)
    with pytest.raises(StaleEngineError, match=r"generator 'hf' does not hold the trainer's weights \(probe"):
        rl_step(p, 0)  # the update, then the sync that did nothing


def test_a_sync_that_fails_once_is_resynced_and_counted(tmp_path):
    p = pipeline(tmp_path)  # resync is the default
    failed: list[int] = []

    def flaky(dst, src):
        if not failed:
            failed.append(1)
            return
        copy_weights(dst, src)

    own_copy(p, flaky)
    metrics = [rl_step(p, s) for s in range(2)]
    assert [m["sync/failures"] for m in metrics] == [1.0, 0.0]
    assert all(torch.equal(a, b) for a, b in zip(p.generator.inner.model.parameters(), p.policy.parameters()))


def test_none_and_scripted_generators_check_nothing(tmp_path):
    p = pipeline(tmp_path, "rollout.sync_check=none")
    own_copy(p, lambda dst, src: None)
    assert "sync/failures" not in rl_step(p, 0)
    fake = pipeline(tmp_path, "rollout.generator={name: fake, completions: ['1']}")
    assert fake.generator.check is None and "sync/failures" not in rl_step(fake, 0)
