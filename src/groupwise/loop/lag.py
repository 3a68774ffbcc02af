"""Asynchronous rollouts with a fixed lag: ``rollout.max_async_level`` K > 0 (``trainer.lagged_step``).

Schedule. Version v is the policy after v updates. Step t's rollouts are sampled by version max(0, t − K),
whatever the threads' timing: while step t's update runs in a background thread, the main thread runs step
t + 1's whole rollout stage (selector → shards → transforms → filter and refills → reward check) on a frozen
copy of the weights (``at``). Once step t + 1's advantages are known, the behaviour log-probs of the rows its
update runs are the learner's own forward on that copy (``behaviour``: ``Sample.old_logprobs``, the PPO ratio
is π_θ / π_{t+1−K}, and ``loss.importance_sampling`` keeps correcting sampler vs trainer at that version); the
same rows and micro-batches as the update's first epoch, so inert rows cost nothing and each prompt runs once
with ``optim.shared_prefix`` (a pass over every row, each with its prompt, made K = 1 0.4× the speed of K = 0
on the real model). That pass runs in the main thread before the update starts, not overlapped. The last K
versions' trainable weights are kept (``keep``).

Engines. The snapshot pipeline gets its own generator when the run's can be rebuilt on a module
(``snapshot``: ``hf``); an engine that holds its own weights (``own_weights``: ``vllm``) is shared instead and
loaded with the snapshot before every rollout (``at``), ``trainer.finish`` loading the policy back after the
update; Ray rollout workers are the same actors, sent the snapshot's weights (each holds its own copy).

Why the update, not the generator, is the background thread: everything with state other than the weights
(selector and curriculum cursors, builders, transforms, reward terms and their SIGALRM timeouts, the filter,
the recorder, the replay buffer, signals) stays in the main thread, in the order of the synchronous loop, so
no state needs a lock and every draw is where it was. The update thread touches the policy, its optimizer and
scheduler, the reference model and the teacher's scoring; the main thread never reads the policy while it runs
(the rollout stage sees the snapshot as ``ctx.model`` and ``ctx.policy_logprobs``). What lags besides the
weights: advantage, replay, credit and ``teacher.on_step`` of step t run before step t + 1's rollout, as in
the synchronous loop; a transform that reads ``ctx.teacher`` (``distil``) sees it as of step t − 1's
``on_step``. One rollout overlaps one update, so K ≥ 2 adds staleness but no overlap.

Resume: a checkpoint after step s holds the kept versions s − K .. s − 1 (K copies of the trainable weights)
and the rollout-stage parts' state from before step s's rollout (``capture``); ``--resume`` regenerates that
rollout from them, bit for bit (``tests/e2e/test_resume.py``). Nothing in flight is checkpointed.

Failure: an update that raises stops the run in one line (``UpdateFailed``; ``NonFiniteWeights`` as is); one
still running ``rollout.async_timeout_s`` after it started stops it in one line too (the thread is a daemon; the
last checkpoint is intact). One stuck in C code that holds the GIL blocks the main thread as well: a watchdog
process (``loop/watchdog.py``) prints the same line ``GRACE_S`` later and kills the run. A rollout that raises
waits for the running update first.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from groupwise.loop.sync_check import stale
from groupwise.loop.watchdog import WATCHDOG, Watchdog
from groupwise.loop.workers import InProcess
from groupwise.parallel import data_parallel
from groupwise.registry import ConfigError, RunStopped
from groupwise.update import NonFiniteWeights

if TYPE_CHECKING:
    from groupwise.loop.pipeline import Pipeline, Rollout
    from groupwise.types import TokenBatch


class UpdateFailed(RunStopped):
    """The background update raised or hung (one line, for the CLI)."""


GRACE_S = 5.0
"""How long after ``rollout.async_timeout_s`` the watchdog process waits for the main thread to report a hung
update itself, before it kills the run (the main thread cannot while the update holds the GIL)."""


def trainable(model: torch.nn.Module) -> dict[str, Tensor]:
    """Copies of the parameters that train (all of them, or a LoRA policy's adapter), on their device."""
    return {n: t.detach().clone() for n, t in model.named_parameters() if t.requires_grad}


BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@torch.no_grad()
def fingerprint(params: dict[str, Tensor], names) -> Tensor:
    """Per parameter in ``names`` (in that order): the sum of its bytes read as 64-bit integers, modulo 2^64
    ([len(names)], int64, on the CPU). Exact: the same on every device and in any summation order, so equal
    weights give equal fingerprints, and one changed element changes its parameter's sum. (Its own element width
    when its bytes do not split into 8-byte words; summed in int64 without an up-cast otherwise: 0.04-0.05 s
    for SmolLM2-135M's weights, fp32 or bf16, on one CPU core; an up-cast took 0.3-0.7 s.)"""
    sums = []
    for n in names:
        t = params[n].detach().reshape(-1)
        size = t.element_size()
        if (t.numel() * size) % 8 == 0 and (t.storage_offset() * size) % 8 == 0:
            sums.append(t.view(torch.int64).sum())
        else:
            sums.append(t.view(BITS[size]).sum(dtype=torch.int64))
    return torch.stack(sums).cpu()


class Background:
    """``fn()`` in a daemon thread; ``result()`` joins it, ``timeout`` seconds after its start at the latest.

    ``watchdog``: armed before the thread starts, for ``timeout`` + ``GRACE_S`` seconds, and disarmed when ``fn``
    returns or ``result`` gives up: an update stuck in C code that holds the GIL also blocks the main thread (the
    join never returns), and the watchdog process ends the run with the same one line (``loop/watchdog.py``)."""

    def __init__(self, fn: Callable[[], dict[str, float]], step: int, timeout: float,
                 watchdog: Watchdog | None = None):
        self.step, self.timeout, self.watchdog = step, timeout, watchdog
        self.out: dict[str, float] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=f"groupwise-update-{step + 1}",
                                       daemon=True)
        if watchdog is not None:
            held = f" and holds the GIL (no other thread ran for {GRACE_S:g} s more); the run was killed"
            watchdog.arm(timeout + GRACE_S, f"error: {self._timed_out(held)}")
        self.start = time.monotonic()
        self.thread.start()

    def _timed_out(self, how: str = "; the run stopped") -> str:
        return (f"rollout.async_timeout_s={self.timeout:g}: the background update of step {self.step + 1} has not "
                f"finished{how} (its last checkpoint is intact)")

    def _run(self, fn: Callable[[], dict[str, float]]) -> None:
        try:
            self.out = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread by result()
            self.error = e
        finally:
            if self.watchdog is not None:
                self.watchdog.disarm()

    def result(self) -> dict[str, float]:
        try:
            self.thread.join(max(0.0, self.start + self.timeout - time.monotonic()))
        finally:
            if self.watchdog is not None:  # an update still running is reported here, in one line
                self.watchdog.disarm()
        if self.thread.is_alive():
            raise UpdateFailed(self._timed_out())
        if isinstance(self.error, NonFiniteWeights):
            raise self.error
        if self.error is not None:
            first = (str(self.error).strip().splitlines() or [""])[0]
            raise UpdateFailed(f"the background update of step {self.step + 1} failed: "
                               f"{type(self.error).__name__}: {first}") from self.error
        return self.out


class Lag:
    """The weight versions, the snapshot pipeline the rollout stage runs on, and the rollout run ahead.

    ``make_generator(model)`` builds the run's generator (counted) on ``model``: the snapshot's."""

    def __init__(self, p: Pipeline, make_generator: Callable[[torch.nn.Module], Any], own_weights: bool = False):
        """``own_weights``: the run's generator is an engine with its own copy of the weights (vLLM), shared by
        the snapshot pipeline and loaded with the snapshot before each rollout (and with the policy again after
        each update, for the eval: ``trainer.finish``); otherwise the snapshot gets its own generator."""
        if data_parallel()[1] > 1:
            raise ConfigError("rollout.max_async_level: not built with several training processes; allowed: "
                              "rollout.max_async_level=0 there")
        self.p, self.k, self.timeout = p, p.cfg.rollout.max_async_level, p.cfg.rollout.async_timeout_s
        self.shared = own_weights
        self.snapshot = copy.deepcopy(p.policy).requires_grad_(False)
        generator = p.generator if own_weights else make_generator(self.snapshot)
        self.view = dataclasses.replace(p, policy=self.snapshot, generator=generator, lag=None)
        if isinstance(p.shards, InProcess):
            self.view.shards = InProcess(self.view)
        else:  # Ray workers: the same actors, each holding its own copy, given the snapshot's weights
            p.shards.p = self.view
            self.view.shards = p.shards
        self.versions: dict[int, dict[str, Tensor]] = {}
        self.mode = p.cfg.rollout.sync_check  # the snapshot's check (``verify``): none | resync | error
        self.prints: dict[int, Tensor] = {}  # the trainer's weights' fingerprint at each kept version
        self.verified: int | None = None  # the version the snapshot was verified to hold (None: not checked)
        self.failures, self.seconds = 0, 0.0  # this step's snapshot check: stale snapshots found, its time
        self.before: dict[str, Any] = {}  # the rollout-stage parts' state before the rollout run ahead
        self.ahead: Rollout | None = None
        self.loaded: int | None = None  # the version in the snapshot

    def keep(self, step: int) -> None:
        """Keep version ``step`` (the policy now, between updates), and its fingerprint, taken from the policy
        itself: what ``verify`` compares the snapshot with."""
        self.versions[step] = trainable(self.p.policy)
        if self.mode != "none":
            t0 = time.perf_counter()
            self.prints[step] = fingerprint(dict(self.p.policy.named_parameters()), self.versions[step])
            self.seconds += time.perf_counter() - t0

    def at(self, step: int) -> tuple[Pipeline, int]:
        """The snapshot pipeline at version max(0, step − K), verified to hold it, and that version; older
        versions are dropped."""
        v = max(0, step - self.k)
        fresh = self.loaded != v
        if fresh:
            self.copy(v)
        self.loaded = v
        fresh = self.verify(v) or fresh
        if fresh or self.shared:  # a shared engine was given the policy since (``trainer.finish``)
            self.view.generator.sync_weights(self.snapshot)  # an engine holding its own copy reloads (and is probed)
            self.view.shards.sync_weights(self.snapshot)  # Ray workers: the snapshot's weights with the next shard
        for old in [u for u in self.versions if u < v]:
            del self.versions[old]
            self.prints.pop(old, None)
        return self.view, v

    def copy(self, v: int) -> None:
        """Copy version ``v`` into the snapshot."""
        params = dict(self.snapshot.named_parameters())
        with torch.no_grad():
            for name, value in self.versions[v].items():
                params[name].copy_(value)

    def verify(self, v: int) -> bool:
        """Check that the snapshot holds version ``v``: its fingerprint equals the trainer's weights' at ``v``
        (``keep``), so a missed or partial copy, or a write into the snapshot, is found before the rollout (the
        engines' probes compare them with the snapshot). A stale snapshot obeys ``rollout.sync_check``: counted
        in ``sync/failures``, and with ``resync`` copied again and checked again; still stale, or with
        ``error``, the run stops in one line. Returns whether it copied again (the engines then reload)."""
        self.verified = None
        if self.mode == "none":
            return False
        t0 = time.perf_counter()
        try:
            for retry in (True, False):
                differ = int((fingerprint(dict(self.snapshot.named_parameters()), self.versions[v])
                              != self.prints[v]).sum())
                if not differ:
                    self.verified = v
                    return not retry
                self.failures += 1
                stale(self.mode, retry,
                      f"the weight snapshot of rollout.max_async_level does not hold policy version {v}",
                      f"{differ} of {len(self.prints[v])} parameters differ from the trainer's at version {v}",
                      "fix the copy into the snapshot (loop/lag.py)")
                self.copy(v)
        finally:
            self.seconds += time.perf_counter() - t0
        return False

    def metrics(self) -> dict[str, float]:
        """The snapshot check's ``sync/failures`` and ``perf/sync_check_s`` this step (none with
        ``rollout.sync_check=none``); reset for the next step."""
        out = {"sync/failures": float(self.failures), "perf/sync_check_s": self.seconds}
        self.failures, self.seconds = 0, 0.0
        return out if self.mode != "none" else {}

    def behaviour(self, tokens: TokenBatch, step: int) -> None:
        """π_old (``Sample.old_logprobs``, the PPO ratio's denominator) of the rows step ``step``'s update runs:
        the learner's own forward on the snapshot, which still holds the version that sampled them (the next
        ``at`` comes after), so the ratio and ``loss.importance_sampling`` see that version."""
        sampled = max(0, step - self.k)
        if self.loaded != sampled:
            raise RuntimeError(f"step {step + 1}: the snapshot holds version {self.loaded}, not the one that "
                               f"sampled ({sampled})")
        self.p.learner.behaviour_logprobs(self.snapshot, tokens)

    def take(self, step: int) -> Rollout | None:
        """The rollout run ahead for ``step``, if any (none at the start and after a resume)."""
        r, self.ahead = self.ahead, None
        return r if r is not None and r.step == step else None

    def start(self, step: int, fn: Callable[[], dict[str, float]]) -> Background:
        return Background(fn, step, self.timeout, WATCHDOG)

    def capture(self) -> None:
        """Record the rollout-stage parts' state (before the next rollout) for the next checkpoint."""
        self.before = {x.key: copy.deepcopy(x.obj.state_dict()) for x in self.p.rollout_parts() if x.entry.stateful}

    def state_dict(self) -> dict[str, Any]:
        if not self.before:  # no step has run yet: the parts are as the next rollout will find them
            self.capture()
        return {"versions": dict(self.versions), "components": self.before}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the kept versions and put the rollout-stage parts back to before the rollout of the
        checkpoint's step (``Pipeline.load_trainer_state`` loads this after every part's own state)."""
        self.versions = {int(v): w for v, w in state["versions"].items()}
        if self.mode != "none":  # the checkpoint's record of each version (its files are checksummed)
            self.prints = {v: fingerprint(w, w) for v, w in self.versions.items()}
        self.before, self.ahead, self.loaded = state["components"], None, None
        for x in self.p.rollout_parts():
            if x.entry.stateful:
                x.obj.load_state_dict(copy.deepcopy(self.before[x.key]))
