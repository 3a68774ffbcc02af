"""``openenv``: an OpenEnv environment (Meta / Hugging Face's ``openenv``) in simulation mode as a task: its
``reset`` / ``step`` / ``state`` drive the multi-turn loop, its rewards are the reward term ``environment``'s.

The server is either at ``url`` (any OpenEnv server: ``uvicorn server.app:app``, a container, a Space) or started
by groupwise from ``app`` (``path/to/server.py:app``, the ``create_app(...)`` object) on loopback, in a child
process that ends with the run. ``pip install 'groupwise[openenv]'``. Each rollout is one WebSocket session (the
server's own environment instance: the server must allow ``prompts_per_step x group_size`` concurrent sessions,
``create_app(..., max_concurrent_envs=...)`` with ``SUPPORTS_CONCURRENT_SESSIONS``), driven by OpenEnv's own
client (``GenericEnvClient``):

  problems  problem i is the episode ``reset(seed=i)`` starts (train: seeds 0 .. train_seeds - 1; held out: the
            next ``test_seeds``); its prompt is that reset's observation text, read once when first needed.
  episode   every rollout resets with its problem's seed (an observation other than the prompt's is that episode's
            failure: the environment is not deterministic under its seed); each model turn's reply (its text, its
            tool calls aside) is sent as ``step({action_field: reply})``; the observation's text comes back as the
            next user turn through the chat template, until ``done`` (``rollout.tools: {protocol: chat}``;
            ``max_turns`` bounds the steps).
  rewards   each step's ``reward`` (None: 0, a bool: 0 / 1); the episode's reward is their sum (``reward: sum``)
            or the last one (``last``); ``verify`` (``correctness``, the eval's accuracy): that reward >=
            ``correct_at``, looked up by the episode's text (so only completions of this run's episodes are verified).

Text of an observation: ``observation_field`` (``prompt``, ``message``, ...), else the observation's one field, else
the observation (without ``metadata``) as JSON. Bad input is one line: a server that does not answer (at load, or
an episode's failure later, counted in ``tool_errors`` / ``tool_timeouts`` and in ``reward/env_errors``), an
observation without the field, a reward that is not a number, an action the server refuses (its validation
error), a step over ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import dataclasses
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Literal

from groupwise.registry import ConfigError
from groupwise.tasks import TASKS
from groupwise.types import Problem

RETURNS_KEPT = 100_000
"""Episode returns kept for ``verify`` (by problem and text), the oldest dropped first."""

LAUNCH = """
import os, sys, threading, time
parent = os.getppid()
def watch():  # the trainer is gone (even killed outright): so is this server
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
import uvicorn
from groupwise.plugins import load_callable
uvicorn.run(load_callable(sys.argv[2]), fd=int(sys.argv[1]), log_level="warning")
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenEnvConfig:
    url: str = ""
    """A running OpenEnv server (``http://host:port``), simulation mode."""
    app: str = ""
    """Or its app (``path/to/server.py:app``, ``package.module:app``), served by groupwise on loopback."""
    action_field: str = "message"
    """The action's field that carries the model's reply."""
    observation_field: str = ""
    """The observation's field the model reads (empty: its one field, else the observation as JSON)."""
    train_seeds: int = 1000
    test_seeds: int = 64
    reward: Literal["sum", "last"] = "sum"
    """An episode's reward: its steps' rewards summed, or the last one."""
    correct_at: float = 1.0
    """``verify``: correct iff the episode's reward is at least this."""
    timeout_s: float = 30.0
    """Per request (connect, reset, step, close)."""
    start_timeout_s: float = 120.0
    """``app``: how long the server may take to answer its first request."""

    def __post_init__(self) -> None:
        if bool(self.url) == bool(self.app):
            raise ValueError("url / app: give exactly one (a running server, or its app to serve on loopback)")
        if self.train_seeds < 1 or self.test_seeds < 1:
            raise ValueError(f"train_seeds={self.train_seeds}, test_seeds={self.test_seeds}: allowed >= 1")
        if self.timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError(f"timeout_s={self.timeout_s}, start_timeout_s={self.start_timeout_s}: allowed > 0")


def _client_cls() -> Any:
    try:
        from openenv.core import GenericEnvClient
    except ImportError:
        raise ConfigError("task.name=openenv needs the openenv package, which is not installed: "
                          "pip install 'groupwise[openenv]'") from None
    return GenericEnvClient


def serve(app: str, timeout_s: float) -> tuple[str, subprocess.Popen]:
    """Serve ``app`` on a free loopback port in a child process (ended at exit, or when this process dies); its URL
    once ``/health`` answers. One line naming the app when it cannot start (its last line of stderr)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with tempfile.TemporaryFile() as log:  # the server's output (it keeps its own descriptor after this closes)
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(sock.fileno()), app], pass_fds=(sock.fileno(),),
                                stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        sock.close()
        atexit.register(_stop, proc)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                tail = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
                raise ConfigError(f"task.app={app!r}: the OpenEnv server exited ({proc.returncode}) before it "
                                  f"answered: {tail[-1] if tail else 'no output'}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    return url, proc
            except OSError:
                time.sleep(0.2)
    _stop(proc)
    raise ConfigError(f"task.app={app!r}: the OpenEnv server did not answer /health within {timeout_s:g}s "
                      "(task.start_timeout_s)")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class OpenEnvTask:
    """An OpenEnv environment as a task (see the module docstring): an ``EpisodeTask`` and ``EnvironmentRewards``."""

    name = "openenv"

    def __init__(self, cfg: OpenEnvConfig):
        self.cfg, client_cls = cfg, _client_cls()
        self.url, self.server = (cfg.url, None) if cfg.url else serve(cfg.app, cfg.start_timeout_s)
        self.where = f"task.url={cfg.url!r}" if cfg.url else f"task.app={cfg.app!r}"
        self._new = lambda: client_cls(base_url=self.url)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True, name="groupwise-openenv").start()
        self._returns: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.train = _Seeds(self, "train", 0, cfg.train_seeds)
        self.test = _Seeds(self, "test", cfg.train_seeds, cfg.test_seeds)
        try:
            self.train[0]  # the server answers and its observation has the text: at load, in one line
        except Exception as e:  # noqa: BLE001 - any first failure is the same refusal
            raise ConfigError(f"{self.where}: the OpenEnv environment failed its first reset: {_line(e)}") from None

    def call(self, make: Callable[[], Any]) -> Any:
        """``await make()`` on the task's event loop, bounded by ``timeout_s``."""
        async def run():
            return await make()
        future = asyncio.run_coroutine_threadsafe(run(), self._loop)
        try:
            return future.result(self.cfg.timeout_s)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {self.cfg.timeout_s:g}s (task.timeout_s)") from None

    def text(self, observation: Any) -> str:
        """The observation's text for the model (see the module docstring)."""
        if not isinstance(observation, dict):
            raise ValueError(f"observation is {type(observation).__name__}, not an object")
        fields = {k: v for k, v in observation.items() if k != "metadata"}
        if self.cfg.observation_field:
            if self.cfg.observation_field not in fields:
                raise KeyError(f"observation has no field {self.cfg.observation_field!r} (task.observation_field); "
                               f"its fields: {', '.join(fields) or 'none'}")
            value = fields[self.cfg.observation_field]
        else:
            value = next(iter(fields.values())) if len(fields) == 1 else fields
        return value if isinstance(value, str) else json.dumps(value, default=str)

    def reset(self, seed: int) -> tuple[Any, str]:
        """A new session, reset with ``seed``: (its client, the observation's text)."""
        client = self._new()
        self.call(client.connect)
        try:
            return client, self.text(self.call(lambda: client.reset(seed=seed)).observation)
        except BaseException:
            self.call(client.close)
            raise

    def prompt(self, seed: int) -> str:
        client, text = self.reset(seed)
        self.call(client.close)
        return text

    # ------------------------------------------------------------------------------------ EpisodeTask
    def open_episode(self, problem: Problem) -> _Session:
        client, text = self.reset(problem.meta["seed"])
        if text != problem.prompt:
            self.call(client.close)
            raise ValueError(f"reset(seed={problem.meta['seed']}) observed {text[:60]!r}, not the problem's prompt: "
                             "the environment is not deterministic under its seed")
        return _Session(self, problem, client)

    def record(self, problem: Problem, text: str, value: float) -> None:
        with self._lock:
            self._returns[(problem.id, text)] = value
            while len(self._returns) > RETURNS_KEPT:
                self._returns.popitem(last=False)

    # ------------------------------------------------------------------------------------ rewards
    def episode_rewards(self, problem: Problem, sample: Any) -> dict[str, tuple[float, float]]:
        meta = sample.meta
        if meta.get("env_error"):
            raise RuntimeError(f"the episode's environment failed: {meta['env_error']}")
        if "env_rewards" not in meta:
            raise LookupError("the sample has no OpenEnv episode (run with rollout.tools: {protocol: chat})")
        return {"reward": (_episode_reward(meta["env_rewards"], self.cfg.reward), 1.0),
                "steps": (float(len(meta["env_rewards"])), 0.0), "done": (float(meta.get("env_done", False)), 0.0)}

    def verify(self, problem: Problem, completion: str) -> bool:
        with self._lock:
            value = self._returns.get((problem.id, completion))
        if value is None:
            raise LookupError("no episode of this run ended with this completion: the OpenEnv task verifies its own "
                              "episodes (rollout.tools: {protocol: chat})")
        return value >= self.cfg.correct_at

    def format_ok(self, completion: str) -> bool:
        return bool(completion.strip())

    def extract_answer(self, completion: str) -> str | None:
        return None

    def sft_examples(self, rng, n: int) -> list[tuple[Problem, str]]:
        raise NotImplementedError("an OpenEnv environment has no reference traces")


def _episode_reward(rewards: list[float], how: str) -> float:
    return float(sum(rewards) if how == "sum" else (rewards[-1] if rewards else 0.0))


def _line(e: BaseException) -> str:
    one = len(e.args) == 1 and isinstance(e.args[0], str)  # a KeyError's str() is a repr: its message instead
    text = (e.args[0] if one else str(e)).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


class _Session:
    """One rollout's WebSocket session (``tasks.base.Episode``)."""

    def __init__(self, task: OpenEnvTask, problem: Problem, client: Any):
        self.task, self.problem, self.client = task, problem, client
        self.rewards: list[float] = []
        self.done = False

    def respond(self, reply: str) -> list[dict[str, str]] | None:
        if self.done:
            return None
        result = self.task.call(lambda: self.client.step({self.task.cfg.action_field: reply}))
        reward = 0.0 if result.reward is None else result.reward  # OpenEnv's rewards may be None or a bool too
        if not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ValueError(f"step returned reward {result.reward!r}, not a finite number")
        if not isinstance(result.done, bool):
            raise ValueError(f"step returned done={result.done!r}, not true / false")
        self.rewards.append(float(reward))
        self.done = result.done
        return None if self.done else [{"role": "user", "content": self.task.text(result.observation)}]

    def close(self, text: str) -> dict[str, Any]:
        try:
            self.task.call(self.client.close)
        finally:
            self.task.record(self.problem, text, _episode_reward(self.rewards, self.task.cfg.reward))
        return {"env_rewards": list(self.rewards), "env_done": self.done}


class _Seeds(Sequence[Problem]):
    """Problems by reset seed, each prompt read from its reset on first use (then kept)."""

    def __init__(self, task: OpenEnvTask, split: str, start: int, n: int):
        self.task, self.split, self.start, self.n = task, split, start, n
        self._prompts: dict[int, str] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        seed = self.start + i % self.n
        if seed not in self._prompts:
            self._prompts[seed] = self.task.prompt(seed)
        return Problem(id=f"openenv/{self.split}/{seed}", prompt=self._prompts[seed], answer="", meta={"seed": seed})


@TASKS.register("openenv", config=OpenEnvConfig)
def openenv(cfg: OpenEnvConfig, env) -> OpenEnvTask:
    tools = env.run.rollout.tools if env.run is not None else None
    if env.run is not None and (tools is None or tools.protocol != "chat"):
        raise ConfigError("task.name=openenv: its episodes run in the multi-turn loop; allowed: "
                          "rollout.tools: {protocol: chat} (max_turns bounds the steps)")
    return OpenEnvTask(cfg)
