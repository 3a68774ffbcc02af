"""Asynchronous rollouts (``rollout.max_async_level`` K, ``loop/lag.py``): K = 0 is the synchronous loop (against
its metrics from before K existed, within ``ACROSS_MACHINES``: they were written on another machine), step t is
sampled by version max(0, t − K) with that version's behaviour log-probs, a resumed run reproduces an
uninterrupted one, and a failing or hung background update stops the run in one line."""

import copy
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from groupwise.config import load
from groupwise.loop import lag as lag_mod
from groupwise.loop.lag import UpdateFailed, trainable
from groupwise.loop.setup import build
from groupwise.loop.sync_check import StaleEngineError
from groupwise.loop.trainer import lagged_step, prepare, train
from groupwise.registry import ConfigError
from groupwise.update import Learner

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
from same_steps import ACROSS_MACHINES, compare  # noqa: E402

RECIPE = str(Path(__file__).parents[2] / "recipes" / "grpo_lab.yaml")
ARGS = ["trainer.steps=3", "trainer.save_every=0", "trainer.threads=1", "trainer.progress=false",
        "trainer.sinks=[jsonl]", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_completion_tokens=24", "model.warm_start_steps=40", "eval.before=false", "eval.after=false",
        # lengths vary: every step trains
        "task.p_wrap_slip=0.5", "reward.terms=[{name: length_penalty, max_length: 24}]"]
GOLDEN = Path(__file__).with_name("golden_sync_loop.json")
"""The metrics of ``ARGS`` (name=g) written by the loop before asynchronous rollouts existed (commit cc826ec)."""
STALENESS = ("rollout/staleness_mean", "rollout/staleness_max")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def rows(run: Path) -> list[dict]:
    out = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "time"} for r in out]


def run(tmp_path, cache, monkeypatch, *extra, resume=False) -> list[dict]:
    monkeypatch.setenv("GROUPWISE_CACHE", str(cache))
    train(load(RECIPE, [*ARGS, f"out_dir={tmp_path}", "name=g", *extra]), resume=resume, overwrite=not resume)
    return rows(tmp_path / "g")


def test_k0_is_the_synchronous_loop(tmp_path, cache, monkeypatch):
    # the golden's sampler (torch.multinomial, the default before 2026-12-06: the same law, other draws)
    got = run(tmp_path, cache, monkeypatch, "rollout.max_async_level=0", "rollout.generator.sampler=multinomial")
    assert [{k: r[k] for k in STALENESS} for r in got] == [dict.fromkeys(STALENESS, 0.0)] * 3
    gold = json.loads(GOLDEN.read_text())
    later = {k for r in got for k in r} - {k for g in gold for k in g} - set(STALENESS)
    # metrics added after the golden: verified weight sync (no sync/probe_dlogp: the shared hf engine is not probed
    # after a sync), the components' no-grad policy passes, and the IS diagnostics of issue 46 (ESS, sequence drops)
    assert later == {"sync/failures", "rollout/policy_forwards", "replay/policy_forwards", "mismatch/ess",
                     "mismatch/masked_seq_frac"}
    assert compare(gold, got, strict=False, tol=ACROSS_MACHINES) == []


@pytest.mark.parametrize(("k", "expected"), [(1, [0, 1, 1, 1]), (2, [0, 1, 2, 2])])
def test_step_t_is_sampled_by_version_t_minus_k(tmp_path, cache, monkeypatch, k, expected):
    got = run(tmp_path, cache, monkeypatch, f"rollout.max_async_level={k}", "trainer.steps=4")
    assert [r["rollout/staleness_max"] for r in got] == [float(e) for e in expected]
    assert [r["rollout/staleness_mean"] for r in got] == [float(e) for e in expected]
    # stale rows carry the sampling version's log-probs: the PPO ratio moves off 1 (on-policy it is 1 exactly)
    assert got[0]["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert all(abs(r["loss/ratio_mean"] - 1.0) > 1e-4 for r, e in zip(got, expected) if e)
    assert all(r["mismatch/max_abs_dlogp"] < 1e-4 for r in got)  # sampler vs trainer at the same version


def test_behaviour_logprobs_are_the_sampling_versions_recomputed(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("GROUPWISE_CACHE", str(cache))
    p = build(load(RECIPE, [*ARGS, "rollout.max_async_level=1", f"out_dir={tmp_path}"]))
    lagged_step(p, 0)  # update 0 -> version 1; step 1 is rolled out ahead on version 1 - K = 0
    version1 = trainable(p.policy)
    lagged_step(p, 1)  # update 1 -> version 2; step 2 is rolled out ahead on version 1
    r = p.lag.take(2)
    assert r.step == 2 and r.groups and {g.policy_version for g in r.groups} == {1}
    work = prepare(p, r)
    samples = work.tokens.samples
    assert all(s.old_logprobs is None for s in samples)  # set once the rows the update runs are known
    work.tokens.advantages[:4] = 0.0  # one group made inert: it costs no pass and gets no log-probs
    p.lag.behaviour(work.tokens, 2)
    active = set(p.learner.active_rows(work.tokens))
    assert len(active) == len(samples) - 4
    assert all((s.old_logprobs is not None) == (i in active) for i, s in enumerate(samples))
    old = copy.deepcopy(p.policy)
    with torch.no_grad():
        for name, param in old.named_parameters():
            if name in version1:
                param.copy_(version1[name])
    rows = [samples[i] for i in sorted(active)]
    expected = dataclasses.replace(p, policy=old).policy_logprobs(rows)  # version 1, one plain pass
    now = p.policy_logprobs(rows)
    for s, e in zip(rows, expected):
        torch.testing.assert_close(s.old_logprobs, e, rtol=0, atol=1e-5)  # other micro-batches: rounding only
    assert max(float((e - n).abs().max()) for e, n in zip(expected, now)) > 1e-4  # version 2 differs: not vacuous


def test_a_snapshot_of_the_live_weights_gives_the_updates_own_logprobs_bit_for_bit(tmp_path, cache, monkeypatch):
    """Step 1 of K = 1 is sampled by version 0, the weights its update starts from: the ratio is 1 exactly,
    as in the synchronous loop, because the behaviour pass is the update's own forward (rows, micro-batches)."""
    got = run(tmp_path, cache, monkeypatch, "rollout.max_async_level=1", "trainer.steps=2")
    assert got[0]["loss/ratio_mean"] == 1.0 and got[0]["loss/clip_frac_low"] + got[0]["loss/clip_frac_high"] == 0
    assert got[1]["loss/ratio_mean"] != 1.0


def test_a_resumed_k2_run_reproduces_the_uninterrupted_one(tmp_path, cache, monkeypatch):
    """K = 2 checkpoints two weight versions and the selector's state from before the rollout run ahead."""
    whole = run(tmp_path / "a", cache, monkeypatch, "rollout.max_async_level=2", "trainer.steps=5")
    run(tmp_path / "b", cache, monkeypatch, "rollout.max_async_level=2", "trainer.steps=3")
    resumed = run(tmp_path / "b", cache, monkeypatch, "rollout.max_async_level=2", "trainer.steps=5", resume=True)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    assert resumed == whole


@pytest.mark.parametrize("buffer", ["{name: fifo, replay_groups: 2}", "{name: hdr, replay_groups: 2, tau: .inf}"])
def test_replay_buffers_run_lagged(tmp_path, cache, monkeypatch, buffer):
    got = run(tmp_path, cache, monkeypatch, "rollout.max_async_level=1", "trainer.steps=4", f"replay={buffer}")
    assert sum(r["update/replay_rows"] for r in got) > 0
    assert all(torch.isfinite(torch.tensor(r["loss/total"])) for r in got)


@pytest.mark.parametrize(("override", "match"), [
    ("rollout.max_async_level=-1", r"max_async_level.*>= 0"),
    ("rollout.generator=fake", None),  # a snapshot generator
    ("rollout.generator=vllm", None),  # an engine with its own weights: the snapshot is loaded into it
    ("teacher=privileged", r"rollout.max_async_level=1: not built with teacher"),
    ("rollout.shards=2", None),
])
def test_load_time_refusals(override, match):
    args = [*ARGS, "rollout.max_async_level=1", override] if override != "rollout.max_async_level=-1" else \
        [*ARGS, override]
    if match is None:  # supported
        load(RECIPE, args)
        return
    with pytest.raises(ConfigError, match=match):
        load(RECIPE, args)


def test_a_generator_that_cannot_sample_a_snapshot_is_refused_in_one_line():
    from groupwise.rollout import GENERATORS

    @GENERATORS.register("live_only_test")
    def live_only(cfg, env):  # neither rebuildable on a snapshot nor an engine with its own weights
        return None

    try:
        with pytest.raises(ConfigError, match=r"^rollout.max_async_level=1: generator 'live_only_test' cannot "
                                              r"sample from a weight snapshot; allowed: rollout.max_async_level=0, "
                                              r"or generator fake \| hf \| vllm$"):
            load(RECIPE, [*ARGS, "rollout.max_async_level=1", "rollout.generator=live_only_test"])
    finally:
        GENERATORS._entries.pop("live_only_test")


def test_a_failing_background_update_stops_the_run_in_one_line(tmp_path, cache, monkeypatch):
    def boom(self, batch):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(Learner, "step", boom)
    with pytest.raises(UpdateFailed, match=r"^the background update of step 1 failed: RuntimeError: boom$"):
        run(tmp_path, cache, monkeypatch, "rollout.max_async_level=1")


def test_a_hung_background_update_stops_within_the_timeout(tmp_path, cache, monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(Learner, "step", lambda self, batch: release.wait(60) and {})
    t0 = time.perf_counter()
    with pytest.raises(UpdateFailed, match=r"rollout.async_timeout_s=0.5: the background update of step 1 has"):
        run(tmp_path, cache, monkeypatch, "rollout.max_async_level=1", "rollout.async_timeout_s=0.5")
    assert time.perf_counter() - t0 < 30
    release.set()


def test_a_rollout_that_raises_waits_for_the_running_update(tmp_path, cache, monkeypatch):
    """The rollout run ahead fails while step 1's update runs: the error surfaces after the update joined."""
    from groupwise.standard.random_selector import RandomSelector

    finished = []
    real_step, real_next = Learner.step, RandomSelector.next

    def slow_step(self, batch):
        time.sleep(0.5)
        finished.append(True)
        return real_step(self, batch)

    def next_(self, step, n, ctx=None):
        if step == 1:
            raise ValueError("selector broke")
        return real_next(self, step, n, ctx)

    monkeypatch.setattr(Learner, "step", slow_step)
    monkeypatch.setattr(RandomSelector, "next", next_)
    with pytest.raises(ValueError, match="selector broke"):
        run(tmp_path, cache, monkeypatch, "rollout.max_async_level=1")
    assert finished == [True]
    assert not [t for t in threading.enumerate() if t.name.startswith("groupwise-update")]


def test_background_reraises_non_finite_weights_as_is():
    from groupwise.update import NonFiniteWeights

    def fn():
        raise NonFiniteWeights("stop")

    with pytest.raises(NonFiniteWeights, match="^stop$"):
        lag_mod.Background(fn, 0, 5.0).result()


def test_sigterm_saves_and_the_resumed_run_matches(tmp_path, cache, monkeypatch):
    """SIGTERM during step 2's update (while step 3 is rolled out ahead): the step finishes, the run saves and
    exits as in the synchronous loop, and a resume reproduces the uninterrupted run."""
    import os
    import signal

    whole = run(tmp_path / "a", cache, monkeypatch, "rollout.max_async_level=1", "trainer.steps=4")
    real, calls = Learner.step, []

    def step(self, batch):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered to the main thread's handler
        return real(self, batch)

    monkeypatch.setattr(Learner, "step", step)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", cache, monkeypatch, "rollout.max_async_level=1", "trainer.steps=4")
    assert (tmp_path / "b" / "g" / "checkpoints" / "step_0000002").is_dir()
    monkeypatch.setattr(Learner, "step", real)
    assert run(tmp_path / "b", cache, monkeypatch, "rollout.max_async_level=1", "trainer.steps=4",
               resume=True) == whole


def test_groups_older_than_k_are_refused(tmp_path, cache, monkeypatch):
    real = lag_mod.Lag.at
    monkeypatch.setattr(lag_mod.Lag, "at", lambda self, step: (real(self, step)[0], step - 2))  # a wrong lag
    with pytest.raises(RuntimeError, match=r"step 1: groups of policy version -2; rollout.max_async_level=1"):
        run(tmp_path, cache, monkeypatch, "rollout.max_async_level=1")


def _skip_the_copy(monkeypatch):
    """The fault of issue 48: ``Lag.at`` believes the snapshot already holds the version it needs, so the copy
    into it is skipped and every rollout comes from the warm start's weights."""
    real = lag_mod.Lag.at

    def at(self, step):
        self.loaded = max(0, step - self.k)
        return real(self, step)

    monkeypatch.setattr(lag_mod.Lag, "at", at)


def test_a_snapshot_that_missed_its_copy_stops_the_run_in_one_line_with_sync_check_error(tmp_path, cache,
                                                                                        monkeypatch):
    """The snapshot is checked against the trainer's weights of the version it should hold, not against itself:
    step 2 is sampled by version 1, and a snapshot still holding version 0 is caught there."""
    _skip_the_copy(monkeypatch)
    with pytest.raises(StaleEngineError, match=r"^rollout.sync_check: the weight snapshot of rollout.max_async_level "
                                               r"does not hold policy version 1 \(.*\); allowed: .*$"):
        run(tmp_path, cache, monkeypatch, "rollout.max_async_level=1", "rollout.sync_check=error")


def test_a_snapshot_that_missed_its_copy_is_counted_and_copied_again_with_resync(tmp_path, cache, monkeypatch):
    _skip_the_copy(monkeypatch)
    got = run(tmp_path / "b", cache, monkeypatch, "rollout.max_async_level=1")
    assert [r["sync/failures"] for r in got] == [0.0, 1.0, 0.0]  # found while step 2 was rolled out ahead
    monkeypatch.undo()
    whole = run(tmp_path / "a", cache, monkeypatch, "rollout.max_async_level=1")
    assert [r["sync/snapshot_version"] for r in whole] == [0.0, 0.0, 1.0]  # each rollout's snapshot, verified
    # copied again before the rollout: the run is the undisturbed run
    assert [{k: v for k, v in r.items() if k != "sync/failures"} for r in got] == \
        [{k: v for k, v in r.items() if k != "sync/failures"} for r in whole]


def test_the_snapshot_check_is_off_with_sync_check_none(tmp_path, cache, monkeypatch):
    """Not checked: no ``sync/snapshot_version`` (a missing check is never logged as one that passed)."""
    got = run(tmp_path, cache, monkeypatch, "rollout.max_async_level=1", "rollout.sync_check=none")
    assert not [k for r in got for k in r if k.startswith("sync/")]


HOLDS_THE_GIL = """
import ctypes, sys, time
from groupwise.cli import main
from groupwise.update import Learner

real, calls = Learner.step, []

def step(self, batch):
    calls.append(1)
    if len(calls) == 2:  # step 2's update, after step 1's checkpoint
        open(sys.argv[1], "w").write(repr(time.monotonic()))
        ctypes.PyDLL(None).sleep(600)  # C code that keeps the GIL: no other thread of the process runs
    return real(self, batch)

Learner.step = step
sys.exit(main(sys.argv[2:]))
"""


def test_an_update_stuck_in_c_code_that_holds_the_gil_is_killed_in_one_line(tmp_path, cache, monkeypatch):
    """``Thread.join(timeout)`` cannot return while the update thread holds the GIL: the watchdog process prints
    the line and kills the run, and step 1's checkpoint is intact (``--resume`` goes on from it, with a longer
    ``rollout.async_timeout_s``)."""
    import os
    import signal
    import subprocess

    from groupwise import checkpoint

    hung = tmp_path / "hung_at"
    env = {**os.environ, "GROUPWISE_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    args = ["train", RECIPE, *ARGS, f"out_dir={tmp_path}", "name=g", "rollout.max_async_level=1",
            "rollout.async_timeout_s=1", "trainer.save_every=1"]
    out = subprocess.run([sys.executable, "-c", HOLDS_THE_GIL, str(hung), *args], env=env, capture_output=True,
                         text=True, timeout=120)
    waited = time.monotonic() - float(hung.read_text())
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert out.stderr.splitlines()[-1] == (
        f"error: rollout.async_timeout_s=1: the background update of step 2 has not finished and holds the GIL (no "
        f"other thread ran for {lag_mod.GRACE_S:g} s more); the run was killed (its last checkpoint is intact)")
    assert 1 + lag_mod.GRACE_S <= waited < 1 + lag_mod.GRACE_S + 20
    saved = checkpoint.checkpoint_dir(tmp_path / "g")
    assert sorted(c.name for c in saved.iterdir()) == ["step_0000001"]
    assert checkpoint.damage(saved / "step_0000001") is None
    resumed = run(tmp_path, cache, monkeypatch, "rollout.max_async_level=1", "trainer.save_every=1",
                  "rollout.async_timeout_s=600", resume=True)  # a longer timeout: it changes no sample
    assert [r["step"] for r in resumed] == [1, 2, 3]
