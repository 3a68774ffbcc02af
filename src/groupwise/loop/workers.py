"""Rollout shards, built and scored in this process or in Ray actors (``rollout.shards``, ``rollout.workers``).

The step's problems are dealt round-robin into ``rollout.shards`` shards (shard i: problems i, i + shards, ...,
as ``distributed.shard`` deals them to ranks). A shard is the group builder then the reward stage, run with
the shard index in every rollout seed (``Pipeline.context``): its samples are fixed by the shard's problems,
its seeds and the policy's weights, so *where* it runs cannot change them. The shards' groups come back in
selection order; the driver then runs the transforms, the filter and the update as with one shard. With
several shards an empty one (fewer problems than shards, e.g. a small refill) is skipped, here and in workers.

- ``InProcess`` (``workers: 0``, the default) runs the shards one after another. With one shard the seeds
  carry no shard index: a run without these fields is reproduced bit for bit.
- ``RayWorkers`` (``workers: N``, ``pip install 'groupwise[ray]'``) starts a local Ray instance with N
  actors. Each builds its own task, model, generator, builder and reward stage from the run's config
  (``setup.build(worker=True)``: no teacher, no reference model) with the driver's torch thread count, and
  takes the next shard when it is free. After each optimizer step the policy's trainable parameters (a LoRA
  policy: its adapter) go into the object store once; an actor copies them before its next shard when its
  version is older, so nothing is sent when the weights did not change. Samples and metrics are therefore
  bit-identical to ``InProcess`` at the same ``shards`` (``tests/unit/rollout/test_workers.py``).
- The seed counters of a step (``draws``, per (stage, shard)) travel with a shard and come back with it, so
  refills continue the streams and, with one shard, the driver's transforms continue where the worker's
  builder stopped, exactly as in one process.
- An actor that dies mid-shard is restarted by Ray (``max_restarts=-1``) and its call is rerun on it
  (``max_task_retries``): it rebuilds itself from that call, and the shard runs from the same counters and
  weights, so the step is the undisturbed step. A result from a new process id counts one
  ``rollout/worker_restarts`` (several deaths within one call count once). A shard whose worker dies
  ``MAX_TRIES`` times stops the run.
- A shard that raises one of groupwise's one-line errors (a plug-in's ``PluginError``, a ``ConfigError``,
  ``RunStopped``) stops the run with that error, the line it gives in process, not Ray's remote traceback; the
  step's other shards are waited for first (``DRAIN_S``), so Ray reports none of their errors as unhandled.
- Ray is started with the first shard (``num_cpus = workers``, no dashboard; building a pipeline starts no
  process) and shut down when training ends, at exit at the latest. In a Ray session the caller started (a
  notebook, the tests) it stays up, and the next run there takes the idle actors over (``prestart``) instead
  of starting new processes.
- The weights are checked (``rollout.sync_check``, ``loop/sync_check.py``): after each weight load an actor
  probes its own generator and sends the probe back with every shard; the driver compares it with its policy
  (``RayWorkers._stale``). A stale shard stops the run (``error``) or, with ``resync``, is dropped with its
  seed counters, the weights are sent again and the shard rerun: its samples are those of a good sync.
- Workers hold nothing a checkpoint needs: a resumed run sends its restored weights with the first shard.
  Components that would keep state in a worker (``stateful``, ``reports`` or ``driver_only`` generators,
  builders and reward terms) are refused when the config loads (``config._check_workers``). A builder in a
  worker sees ``ctx.teacher = None``. Its reward-stage failure counts and generator counters are added to
  the driver's; failures are printed by the worker's own process.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from groupwise.registry import ConfigError, RunStopped
from groupwise.types import Group, Problem

if TYPE_CHECKING:
    from groupwise.loop.pipeline import Pipeline
    from groupwise.loop.sync_check import Probe

MAX_TRIES = 3
"""A shard is run at most this many times (its worker died on every try: the run stops)."""
DRAIN_S = 60.0
"""When a shard raises, how long the step's other shards are waited for before the run stops (``_drain``)."""
ENV = ("GROUPWISE_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
"""The driver's environment a worker must share (the warm-start cache, offline Hub settings)."""


def deal(items: list[Any], n: int) -> list[list[Any]]:
    """``n`` shards, round-robin: shard i holds items i, i + n, ... (``interleave`` is the inverse)."""
    return [items[i::n] for i in range(n)]


def interleave(parts: list[list[Any]]) -> list[Any]:
    """Round-robin over the shards' outputs: selection order when each problem gave one group."""
    out, rest = [], [list(p) for p in parts]
    while any(rest):
        out += [p.pop(0) for p in rest if p]
    return out


def run_shard(p: Pipeline, problems: list[Problem], step: int, shard: int | None, draws: dict) -> list[Group]:
    """One shard: the builder with the shard's seeds, then the reward stage (in the driver or in a worker)."""
    groups = p.builder(problems, p.context(step, shard=shard, draws=draws))
    p.reward(groups, step)
    return groups


def shard_key(i: int, n: int) -> int | None:
    """The index a shard puts into its seeds: none with one shard (the seeds of a run without shards)."""
    return i if n > 1 else None


class InProcess:
    """The shards one after another in this process (``rollout.workers: 0``)."""

    def __init__(self, p: Pipeline):
        self.p = p

    def __call__(self, problems: list[Problem], step: int, draws: dict) -> list[Group]:
        n = self.p.cfg.rollout.shards
        return interleave([run_shard(self.p, part, step, shard_key(i, n), draws)
                           for i, part in enumerate(deal(problems, n)) if part or n == 1])

    def sync_weights(self, policy: torch.nn.Module) -> None:  # the builder samples from the policy itself
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("rollout.workers needs ray, which is not installed: pip install 'groupwise[ray]'") from None
    return ray


def trainable(policy: torch.nn.Module, names: set[str] | None = None) -> dict[str, torch.Tensor]:
    """The parameters that train (all of them, or a LoRA policy's adapter), as CPU copies; with ``names``, those
    parameters of ``policy`` (a frozen snapshot of the policy: ``loop/lag.py``)."""
    return {n: t.detach().to("cpu", copy=True) for n, t in policy.named_parameters()
            if (t.requires_grad if names is None else n in names)}


@torch.no_grad()
def load_trainable(policy: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``trainable`` weights into a policy of the same build, exactly (``copy_`` keeps every bit)."""
    params = dict(policy.named_parameters())
    unknown = sorted(set(weights) - set(params))
    if unknown:
        raise RuntimeError(f"rollout worker: the driver sent weights this worker's model lacks ({unknown[:3]})")
    for name, value in weights.items():
        params[name].copy_(value)


@dataclasses.dataclass
class ShardResult:
    """What a worker sends back: the scored groups, its seed counters, generator counts, reward failures."""

    groups: list[Group]
    draws: dict
    tokens: int
    prompt_tokens: int
    seconds: float
    errors: dict[str, float]
    pid: int
    probe: Probe | None = None  # the worker's sync probe at its current weights (``rollout.sync_check``)


class Worker:
    """A Ray actor: a rollout-only pipeline and the versions of the config and weights it was built with.

    Every call carries its config and weights (object-store references, fetched only when this actor's copy
    is older), so a restarted actor, or one taken over from an earlier run in the same Ray session, rebuilds
    itself from the call alone. A new actor builds at once from the ``setup`` it is created with."""

    def __init__(self, setup: tuple[str, tuple] | None = None) -> None:
        import groupwise.loop.pipeline  # noqa: F401  (the slow part of a start: torch, the stages, and
        import groupwise.models.tiny  # noqa: F401  transformers' model classes, loaded lazily otherwise)

        self.p: Pipeline | None = None
        self.setup: str | None = None
        self.version: int | None = None
        if setup is not None:
            self._use(setup)

    def run(self, setup: tuple[str, tuple], version: int, weights: list[Any], step: int,
            problems: list[Problem], shard: int | None, draws: dict) -> ShardResult:
        import ray

        self._use(setup)
        assert self.p is not None
        if version != self.version:
            load_trainable(self.p.policy, ray.get(weights[0]))
            self.p.generator.sync_weights(self.p.policy, check_shared=True)  # the probe goes back to the driver
            self.version = version
        gen = self.p.generator
        gen.reset()
        groups = run_shard(self.p, problems, step, shard, draws)
        mine = {k: v for k, v in draws.items() if k[1] == shard}
        return ShardResult(groups, mine, gen.tokens, gen.prompt_tokens, gen.seconds, self.p.reward.take_errors(),
                           os.getpid(), gen.probe)

    def _use(self, setup: tuple[str, tuple]) -> None:
        """Build the pipeline of ``setup`` = (run id, (config dict, torch threads, environment, builder)), sent inline
        (a few KB; an object-store argument of the constructor could be gone when Ray restarts the actor)."""
        if setup[0] != self.setup:
            self._build(*setup[1])
            self.setup, self.version = setup[0], None

    def _build(self, raw: dict[str, Any], threads: int, env: dict[str, str], build: Callable[..., Pipeline]) -> None:
        """``build``: ``setup.build``, sent by the driver (the pipeline builder sits above this module)."""
        from groupwise.config import load

        os.environ.update(env)
        self.p = None  # the previous run's pipeline goes first
        self.p = build(load(base=raw), io=False, worker=True)
        torch.set_num_threads(threads)  # the driver's count: the same kernels, the same bits

    def pid(self) -> int:
        return os.getpid()


_IDLE: dict[str, list[Any]] = {}
"""Actors of closed runners, by Ray job: the next run in this process and Ray session takes them over (a
fresh actor costs a process start and the torch / transformers imports)."""


def kept(run_dir) -> str:
    from groupwise import checkpoint

    last = checkpoint.latest(run_dir)
    return f"the run keeps {last}" if last is not None else "no checkpoint was saved yet"


SENTINEL = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the whole group: the driver decides
driver, raylet, line = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False

while True:  # the raylet first: its death may take the driver with it within the same poll
    if not alive(raylet):
        print(line, file=sys.stderr, flush=True)
        break
    if os.getppid() != driver or not alive(driver):  # the driver left first (an exit, a kill): nothing to say
        break
    time.sleep(0.02)
"""


def watch_raylet(run_dir) -> tuple[Any, Any]:
    """Say in one line when the Ray node this process started dies (its raylet killed, or OOM). Ray's core worker
    may then end this process at once, exit 1, with nothing on stderr but Ray's own log dump (otherwise the next
    shard fails: ``RayWorkers.stopped``). No thread of this process can be sure to speak first, so a small
    sentinel process (``SENTINEL``, Linux ``/proc``) watches the raylet and prints the line; it leaves when this
    process does, and is stopped before a planned shutdown. Returns (the raylet's ``Popen``, the sentinel's), None
    where unknown (Ray's private node handle, or no ``/proc``)."""
    try:
        import ray

        raylet = ray._private.worker._global_node.all_processes["raylet"][0].process
    except (AttributeError, KeyError, IndexError):
        return None, None
    if not os.path.isdir(f"/proc/{raylet.pid}"):
        return raylet, None
    line = (f"groupwise: rollout.workers: the Ray node died (raylet pid {raylet.pid}); the run keeps its last "
            f"checkpoint in {run_dir}/checkpoints: resume with --resume")
    sentinel = subprocess.Popen([sys.executable, "-c", SENTINEL, str(os.getpid()), str(raylet.pid), line],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return raylet, sentinel


def actor_class() -> Any:
    """``Worker`` as a Ray actor: restarted when it dies (``max_restarts=-1``) and the call it was running
    rerun on it (the same shard, seeds and weights), at most ``MAX_TRIES`` times."""
    return require_ray().remote(num_cpus=1, max_restarts=-1, max_task_retries=MAX_TRIES - 1)(Worker)


def prestart(n: int) -> None:
    """Start ``n`` idle actors in the current Ray session (started by the caller), for the runs to come in
    this process (a notebook, a sweep, the tests): their process start and imports overlap other work."""
    ray = require_ray()
    _IDLE.setdefault(ray.get_runtime_context().get_job_id(), []).extend(actor_class().remote() for _ in range(n))


class RayWorkers:
    """The shards on ``rollout.workers`` Ray actors, each shard to the next free actor."""

    def __init__(self, p: Pipeline, build: Callable[..., Pipeline]):
        from groupwise.parallel import data_parallel

        if data_parallel()[1] > 1:
            raise ConfigError("rollout.workers: not with several training processes (torchrun); allowed: "
                              "rollout.workers: 0 there, or one process with workers")
        self.ray = require_ray()
        self.p, self.version, self.weights, self.restarts = p, 0, None, 0
        self.build = build  # ``setup.build``: each actor builds its rollout-only pipeline with it
        self.names = {n for n, t in p.policy.named_parameters() if t.requires_grad}  # what a sync sends
        self.actors: list[Any] = []  # started with the first shard: building a pipeline starts no process
        self.pids: list[int] = []  # each actor's process id: a result from another one is a restart
        self.owns, self.job = False, ""
        self.raylet: Any = None  # the Ray node's raylet process, when this runner started Ray
        self.sentinel: Any = None  # watches it (``watch_raylet``); stopped before a planned shutdown

    def _start(self) -> None:
        from groupwise.config import to_dict

        ray, n = self.ray, self.p.cfg.rollout.workers
        self.owns = not ray.is_initialized()  # a Ray instance someone else started stays up at close()
        # ray.init replaces the SIGTERM handler with sys.exit(15): the session's (stop after the step, save) stays
        term = signal.getsignal(signal.SIGTERM)
        if self.owns and os.environ.get("RAY_ADDRESS"):  # a cluster (`ray start --head`): join it, size nothing
            ray.init(logging_level="ERROR", log_to_driver=True)
        elif self.owns:
            ray.init(num_cpus=n, include_dashboard=False, logging_level="ERROR", log_to_driver=True)
        if threading.current_thread() is threading.main_thread() and term is not None:
            signal.signal(signal.SIGTERM, term)
        if self.owns:
            self.raylet, self.sentinel = watch_raylet(self.p.cfg.run_dir)
        self.job = ray.get_runtime_context().get_job_id()
        idle = _IDLE.setdefault(self.job, [])
        env, threads, cpus = {k: os.environ[k] for k in ENV if k in os.environ}, torch.get_num_threads(), os.cpu_count()
        if cpus and n * threads > cpus:  # measured on 2 cores: oversubscribed threads ran the lab ~10x slower
            print(f"groupwise: rollout.workers={n} x {threads} torch threads (each worker takes the driver's count: "
                  f"other counts draw other bits) oversubscribe {cpus} CPUs; "
                  f"set trainer.threads <= {max(cpus // n, 1)}",
                  file=sys.stderr, flush=True)
        self.setup = (uuid.uuid4().hex, (to_dict(self.p.cfg), threads, env, self.build))
        self.actors = [idle.pop() if idle else actor_class().remote(self.setup) for _ in range(n)]
        try:
            self.pids = ray.get([a.pid.remote() for a in self.actors])
        except ray.exceptions.RayActorError as e:
            raise self.stopped("starting the workers", "a worker died", e) from None
        atexit.register(self.close)

    def __call__(self, problems: list[Problem], step: int, draws: dict) -> list[Group]:
        n = self.p.cfg.rollout.shards
        if not self.actors:
            self._start()
        if self.weights is None:  # once per update, shared by every actor through the object store
            self.weights = self.ray.put(trainable(self.p.policy, self.names))
        parts = deal(problems, n)
        todo = [i for i in range(n) if parts[i] or n == 1]
        done: dict[int, list[Group]] = {}
        idle, running, resent = list(range(len(self.actors))), {}, set()
        while todo or running:
            while todo and idle:
                i, k = todo.pop(0), idle.pop(0)
                ref = self.actors[k].run.remote(self.setup, self.version, [self.weights], step, parts[i],
                                                shard_key(i, n), dict(draws))
                running[ref] = (k, i)
            [ref], _ = self.ray.wait(list(running), num_returns=1)
            k, i = running.pop(ref)
            idle.append(k)
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as e:  # Ray restarted it and reran the shard MAX_TRIES times
                raise self.stopped(f"step {step}", f"rollout shard {i}'s worker died {MAX_TRIES} times", e) from None
            except self.ray.exceptions.RayTaskError as e:  # the shard raised: a plug-in, a config error, a bug
                self._drain(running)
                if isinstance(e.cause, (ConfigError, RunStopped)):  # one line in process: the same line here
                    raise e.cause from None
                raise  # a bug: Ray's error carries the worker's traceback
            if self._stale(result, k, retry=i not in resent):  # resync: send the weights again, rerun the shard
                resent.add(i)
                self.weights, self.version = self.ray.put(trainable(self.p.policy, self.names)), self.version + 1
                todo.insert(0, i)
                continue
            done[i] = self._absorb(result, k, step, draws)
        return interleave([done[i] for i in sorted(done)])

    def _drain(self, running: dict[Any, tuple[int, int]]) -> None:
        """Before a shard's error stops the run: wait (at most ``DRAIN_S``) for the step's other shards and fetch
        them, so that Ray does not print an error of theirs as unhandled (a remote traceback after the run's one
        line) when their results are dropped."""
        ready, _ = self.ray.wait(list(running), num_returns=len(running), timeout=DRAIN_S) if running else ([], [])
        for ref in ready:
            with contextlib.suppress(self.ray.exceptions.RayError):
                self.ray.get(ref)

    def _stale(self, r: ShardResult, k: int, retry: bool) -> bool:
        """Whether actor ``k``'s probe (its generator, after its last weight load) is off the driver's policy
        (``rollout.sync_check``): counted in ``sync/failures``; raises unless ``retry`` (resync mode, the
        shard's first failure). The stale shard's result is dropped whole: its seed counters too, so the rerun
        draws the same seeds."""
        check = self.p.generator.check
        if check is None or r.probe is None:
            return False
        g = check.stale(self.p.policy, r.probe)
        if g is not None:
            check.failed(f"rollout worker {k} (pid {r.pid})", g, retry)
        return g is not None

    def stopped(self, where: str, what: str, e: BaseException) -> RunStopped:
        """The one line a run stops with when its workers are gone: the Ray node itself died, or ``what`` (a
        worker that kept dying: Ray's first line of the last error), and the checkpoint the run keeps."""
        if self.raylet is not None and self.raylet.poll() is not None:
            what = f"the Ray node died (raylet exited {self.raylet.returncode})"
        else:
            what = f"{what}; last: {str(e).strip().splitlines()[0][:200]}"
        return RunStopped(f"rollout.workers: {where}: {what}; {kept(self.p.cfg.run_dir)}: resume with --resume")

    def _absorb(self, r: ShardResult, k: int, step: int, draws: dict) -> list[Group]:
        """Merge a shard's counters into the driver's: seed counts, generator counts, reward failures, and a
        restart of actor ``k`` (its process id changed)."""
        self.restarts += r.pid != self.pids[k]
        self.pids[k] = r.pid
        draws.update(r.draws)
        gen = self.p.generator
        gen.tokens, gen.prompt_tokens, gen.seconds = (gen.tokens + r.tokens, gen.prompt_tokens + r.prompt_tokens,
                                                      gen.seconds + r.seconds)
        self.p.reward.add_errors(step, r.errors, sum(len(g.samples) for g in r.groups))
        return r.groups

    def sync_weights(self, policy: torch.nn.Module) -> None:
        self.weights, self.version = None, self.version + 1  # sent with the next shard

    def metrics(self) -> dict[str, float]:
        out, self.restarts = {"rollout/worker_restarts": float(self.restarts)}, 0
        return out

    def close(self) -> None:
        """Stop Ray when this runner started it (also at exit: no process is left behind); in a Ray session
        someone else started, the actors stay up for the next run (``_IDLE``)."""
        if self.sentinel is not None:
            self.sentinel.kill()
            self.sentinel.wait()
            self.sentinel = None
        if self.owns and self.ray.is_initialized():
            self.ray.shutdown()
            _IDLE.pop(self.job, None)
        elif self.actors and self.ray.is_initialized() and self.ray.get_runtime_context().get_job_id() == self.job:
            _IDLE.setdefault(self.job, []).extend(self.actors)
        self.actors, self.weights, self.owns = [], None, False
