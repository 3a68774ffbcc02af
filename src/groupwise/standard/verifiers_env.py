"""``verifiers``: a verifiers environment (Prime Intellect's ``verifiers`` package, what prime-rl trains on) as a task.

``env`` names it, in either of verifiers' forms (``pip install 'groupwise[verifiers]'``):

  v1      a ``verifiers.v1`` ``Taskset`` subclass (``path/to/env.py:MyTaskset``, ``package.module:MyTaskset``, or an
          installed taskset id, as ``vf-eval`` takes it), built with its own config from ``env_args``. Its tasks
          (``TaskData.prompt`` / ``system_prompt``) are the problems; its ``@vf.reward`` methods (and ``@vf.metric``,
          logged with weight 0) score an episode through ``Task.score`` on a trace of the episode's messages; the
          ``@vf.tool`` methods of its toolsets (``Taskset.toolsets`` and the task class's ``toolsets``, built once per
          run, ``setup()`` awaited once) are the task's tools, named ``<server>_<tool>`` as its MCP clients name them.
  legacy  ``load_environment(**env_args)`` (the v0 form: ``path/to/env.py:load_environment``, or an installed
          environment id through ``verifiers.load_environment``, where the installed verifiers still has it, 0.3.x):
          its ``dataset`` (``eval_dataset``: the held-out problems) are the problems, its rubric's reward functions
          (called with the arguments the rubric would pass them) score an episode, weighted as the rubric weighs
          them, and a ``ToolEnv``'s ``tools`` are the task's tools.

The multi-turn protocol is the tool loop's (``rollout.tools: {protocol: chat}``): the tools' schemas go into the
prompt through the model's chat template and the episode's messages (assistant turns with their tool calls, tool
results) are what the rewards score. Not carried over: a v1 harness (the agent program: here the policy itself is
the agent), per-rollout toolset state (``setup_task``, ``State``), a legacy ``MultiTurnEnv.env_response`` other
than tool calls, and group reward functions (refused at load, in one line).

Scoring: the reward term ``environment`` (``standard/environment.py``) gives the env's weighted reward Σ w·score
(or one function's score) from the episode's messages; ``verify`` (the eval's accuracy, ``correctness``) is the
same total on the completion's text as the one assistant reply, correct iff it reaches ``correct_at``. Both run
the environment's own code, so under ``reward.verifier_isolation: auto`` they run in a forked worker, killed when
it overruns (``runs_user_code``; ``groupwise/isolation.py``). A reward function that raises fails that sample
(counted, never 0.0 as verifiers' own legacy rubric would make it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import random
from collections.abc import Callable
from typing import Any

from groupwise import plugins
from groupwise.registry import ConfigError
from groupwise.standard.jsonl import split_holdout
from groupwise.tasks import TASKS
from groupwise.types import Problem, Sample

Messages = list[dict[str, Any]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiersConfig:
    env: str = ""
    """The environment: ``path/to/env.py:Name`` (relative to the working directory, kept as written: it names the
    warm start) or ``package.module:Name`` (a v1 ``Taskset`` subclass, or a legacy ``load_environment`` function), or
    an installed environment id."""
    env_args: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    """v1: the taskset config's fields; legacy: ``load_environment``'s keyword arguments."""
    test_fraction: float = 0.1
    """Held out when the environment has no held-out set of its own (a legacy ``eval_dataset``): as ``jsonl`` does."""
    max_rows: int = 0
    """Read only the first N tasks (0: all; required for an infinite taskset)."""
    answer_field: str = "answer"
    """The task data field (v1) or dataset column (legacy) shown as the gold answer."""
    reference_field: str = ""
    """A worked-solution field: the SFT target of a warm start (empty: none, ``model.warm_start=false``)."""
    correct_at: float = 1.0
    """``verify``: correct iff the environment's reward is at least this."""

    def __post_init__(self) -> None:
        if not self.env:
            raise ValueError("env: required, e.g. examples/verifiers_arith.py:ArithTaskset or an installed env id")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction={self.test_fraction}: allowed 0 < test_fraction < 1")
        if self.max_rows < 0:
            raise ValueError(f"max_rows={self.max_rows}: allowed >= 0 (0: every task)")


def _verifiers() -> Any:
    try:
        import verifiers
    except ImportError:
        raise ConfigError("task.name=verifiers needs the verifiers package, which is not installed: "
                          "pip install 'groupwise[verifiers]'") from None
    return verifiers


def run_sync(value: Any) -> Any:
    """A verifiers hook's value: awaited (in a fresh event loop) when it is awaitable."""
    if inspect.isawaitable(value):
        async def wait():
            return await value
        return asyncio.run(wait())
    return value


def vf_messages(types: Any, messages: Messages) -> list[Any]:
    """Chat message dicts (the tool loop's ``meta["messages"]``, a prompt's) as verifiers' message models, each tool
    call given an id when the model wrote none (``call_<k>``) and each tool result its call's id, in order."""
    out, ids = [], []
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            calls = []
            for c in m.get("tool_calls") or []:
                fn = c.get("function", c)
                ids.append(c.get("id") or f"call_{len(ids)}")
                arguments = json.dumps(fn.get("arguments") or {})
                calls.append(types.ToolCall(id=ids[-1], name=fn["name"], arguments=arguments))
            out.append(types.AssistantMessage(content=m.get("content") or "", tool_calls=calls or None))
        elif role == "tool":
            named = {"name": m["name"]} if "name" in m else {}
            out.append(types.ToolMessage(tool_call_id=m.get("tool_call_id") or (ids.pop(0) if ids else "call"),
                                         content=str(m.get("content", "")), **named))
        elif role == "system":
            out.append(types.SystemMessage(content=str(m.get("content", ""))))
        else:
            out.append(types.UserMessage(content=str(m.get("content", ""))))
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "") for p in content or [])


class VerifiersTask:
    """A verifiers environment as a task (see the module docstring)."""

    name = "verifiers"
    runs_user_code = True  # its verifier and rewards are the environment's code (``isolation.user_code``)

    def __init__(self, cfg: VerifiersConfig, seed: int = 0):
        self.cfg, self.seed = cfg, seed
        obj = _resolve(cfg.env)
        self.env = V1Env(obj, cfg) if _is_taskset(obj) else LegacyEnv(obj, cfg)
        problems, held = self.env.problems()
        if held is not None:
            self.train, self.test = problems, held
        else:
            try:
                self.train, self.test = split_holdout(problems, cfg.test_fraction)
            except ValueError as e:
                raise ConfigError(f"task.test_fraction={cfg.test_fraction}: {cfg.env} has {len(problems)} tasks and no "
                                  f"held-out set; holding some out fails ({e})") from None
        self.tools, self.tool_schemas = self.env.tools()

    def episode_rewards(self, problem: Problem, sample: Sample) -> dict[str, tuple[float, float]]:
        """Each reward function's (score, weight) on the sample's episode (its chat messages when the tool loop
        recorded them, else its text as the one reply); weight 0: a metric."""
        reply = sample.meta.get("messages") or [{"role": "assistant", "content": sample.text}]
        return self.env.score(problem, reply)

    def verify(self, problem: Problem, completion: str) -> bool:
        rewards = self.env.score(problem, [{"role": "assistant", "content": completion}])
        return sum(s * w for s, w in rewards.values()) >= self.cfg.correct_at

    def format_ok(self, completion: str) -> bool:
        return bool(completion.strip())

    def extract_answer(self, completion: str) -> str | None:
        return self.env.extract_answer(completion)

    def sft_examples(self, rng: random.Random, n: int) -> list[tuple[Problem, str]]:
        if not self.cfg.reference_field:
            raise NotImplementedError("task.reference_field is empty: the environment has no worked solutions")
        rows = [p for p in self.train if p.reference]
        if not rows:
            raise NotImplementedError(f"task.reference_field={self.cfg.reference_field!r}: no task has one")
        return [(p, p.reference) for p in (rows[rng.randrange(len(rows))] for _ in range(n))]


def _resolve(ref: str) -> Any:
    """``file.py:Name`` / ``module:Name`` → the object; an id → the installed taskset's class, or its legacy module's
    ``load_environment``. One line naming ``task.env`` when nothing is found."""
    vf = _verifiers()
    if ":" in ref:
        try:
            return plugins.load_callable(plugins.absolute(ref))
        except Exception as e:  # noqa: BLE001 - a missing file, module or name: one line
            raise ConfigError(f"task.env={ref!r}: {e}") from None
    try:
        from verifiers.v1.utils.loaders import taskset_class

        return taskset_class(ref)
    except (ImportError, TypeError, AttributeError, ValueError):
        pass
    load = getattr(vf, "load_environment", None)
    if load is None:
        raise ConfigError(f"task.env={ref!r}: no installed taskset of that id, and verifiers {vf.__version__} has no "
                          "legacy load_environment; allowed: an installed v1 taskset id, path/to/env.py:Name")
    return functools.partial(load, ref)


def _is_taskset(obj: Any) -> bool:
    try:
        from verifiers.v1 import Taskset
    except ImportError:
        return False
    return isinstance(obj, type) and issubclass(obj, Taskset)


def _problem(i: int, key: str, prompt: Any, system: str | None, data: dict[str, Any], cfg: VerifiersConfig) -> Problem:
    if isinstance(prompt, str) and not system:
        text: Any = prompt
    else:
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [
            {"role": str(m.get("role") if isinstance(m, dict) else m.role),
             "content": _text(m.get("content") if isinstance(m, dict) else m.content)} for m in prompt or []]
        text = tuple(([{"role": "system", "content": system}] if system else []) + msgs)
    reference = str(data.get(cfg.reference_field) or "") if cfg.reference_field else ""
    return Problem(id=f"verifiers/{key}", prompt=text, answer=str(data.get(cfg.answer_field, "")), reference=reference,
                   meta={"vf_index": i})


def _prompt_messages(problem: Problem) -> Messages:
    p = problem.prompt
    return [{"role": "user", "content": p}] if isinstance(p, str) else [dict(m) for m in p]


class V1Env:
    """A ``verifiers.v1`` taskset: its tasks, its ``Task.score`` and its toolsets' tools."""

    def __init__(self, taskset_cls: type, cfg: VerifiersConfig):
        from verifiers.v1 import TasksetConfig
        from verifiers.v1.utils.generic import concrete_type

        config_cls = concrete_type(taskset_cls, TasksetConfig) or TasksetConfig
        try:
            config = config_cls(**{"id": taskset_cls.__name__, **cfg.env_args})
        except Exception as e:  # noqa: BLE001 - pydantic's validation error: its first line
            raise ConfigError(f"task.env_args: not a valid {config_cls.__name__} for {cfg.env} "
                              f"({str(e).strip().splitlines()[0]})") from None
        self.cfg, self.taskset = cfg, taskset_cls(config)
        self.tasks: list[Any] = []

    def problems(self) -> tuple[list[Problem], None]:
        bounded = getattr(self.taskset, "bounded", not getattr(self.taskset, "INFINITE", False))  # 0.4 / 0.3
        if not bounded and not self.cfg.max_rows:
            raise ConfigError(f"task.max_rows=0: {self.cfg.env} is an infinite taskset; allowed: max_rows > 0")
        out = []
        for i, task in enumerate(self.taskset):
            if self.cfg.max_rows and i >= self.cfg.max_rows:
                break
            self.tasks.append(task)
            data = task.data.model_dump()
            key = next((str(data[k]) for k in ("id", "name", "idx") if data.get(k) is not None), str(i))
            out.append(_problem(i, key, task.data.prompt, task.data.system_prompt, data, self.cfg))
        if not out:
            raise ConfigError(f"task.env={self.cfg.env!r}: the taskset yielded no tasks")
        return out, None

    def score(self, problem: Problem, reply: Messages) -> dict[str, tuple[float, float]]:
        import verifiers.v1 as vf
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, TraceTask

        task, prompt = self.tasks[problem.meta["vf_index"]], _prompt_messages(problem)
        nodes = [MessageNode(parent=k - 1 if k else None, message=m, sampled=k >= len(prompt))
                 for k, m in enumerate(vf_messages(vf, prompt + reply))]
        trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data), agent=AgentInfo(
            config=vf.AgentConfig()), nodes=nodes)
        run_sync(task.score(trace))
        missing = [k for k, r in trace.rewards.items() if r is None]
        if missing:
            raise ValueError(f"reward {missing[0]!r} was not scored")
        out = {k: (float(r.score), float(r.weight)) for k, r in trace.rewards.items()}
        out.update({k: (float(v), 0.0) for k, v in trace.metrics.items() if v is not None and k not in out})
        return out

    def extract_answer(self, completion: str) -> str | None:
        return None

    def tools(self) -> tuple[dict[str, Callable[..., Any]], dict[str, dict]]:
        from verifiers.v1.utils.decorators import discover_decorated

        task_cls = type(self.taskset).task_type()
        servers = [*type(self.taskset).toolsets(self.taskset.config),
                   *task_cls.toolsets(self.taskset.config.task)]
        tools: dict[str, Callable[..., Any]] = {}
        for server in servers:
            run_sync(server.setup())
            for method in discover_decorated(server, "tool"):
                name = getattr(method, "tool_name", None) or method.__name__
                tools[f"{server.server_name}_{name}" if server.server_name else name] = _sync_tool(method)
        return tools, {}


def _sync_tool(method: Callable[..., Any]) -> Callable[..., Any]:
    """A (maybe async) tool method as a plain function of its keyword arguments, keeping its signature and
    docstring (its schema) and its module (``isolation``: user code)."""
    @functools.wraps(method)
    def call(**kwargs):
        return run_sync(method(**kwargs))
    call.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return call


class LegacyEnv:
    """A legacy (v0) ``vf.Environment``: its datasets, its rubric's reward functions and a ToolEnv's tools."""

    def __init__(self, load: Callable[..., Any], cfg: VerifiersConfig):
        try:
            self.env = load(**cfg.env_args)
        except (ImportError, AttributeError, TypeError, ValueError) as e:
            raise ConfigError(f"task.env={cfg.env!r}: load_environment failed: {type(e).__name__}: {e}") from None
        self.cfg = cfg
        vf = _verifiers()
        self.funcs, self.weights = [], []
        for rubric in getattr(self.env.rubric, "rubrics", None) or [self.env.rubric]:
            if type(rubric).__module__.startswith("verifiers.legacy.envs"):
                continue  # its own rollout monitors (turns, tool calls): the tool loop reports those
            for fn, w in zip(rubric.funcs, rubric.weights):
                if rubric._is_group_func(fn):
                    raise ConfigError(f"task.env={cfg.env!r}: reward function {fn.__name__!r} scores a group of "
                                      "rollouts together; allowed: per-rollout reward functions")
                self.funcs.append((rubric, fn))
                self.weights.append(float(w))
        self.types = vf.types
        self.rows: list[dict[str, Any]] = []

    def problems(self) -> tuple[list[Problem], list[Problem] | None]:
        env, n = self.env, self.cfg.max_rows or -1
        train = [self._problem(row) for row in env.get_dataset(n=n)]
        held = None
        if getattr(env, "eval_dataset", None) is not None or getattr(env, "eval_dataset_source", None) is not None:
            held = [self._problem(row) for row in env.get_eval_dataset(n=n)]
        return train, held

    def _problem(self, row: dict[str, Any]) -> Problem:
        self.rows.append(dict(row))
        key = str(row.get("example_id", len(self.rows) - 1))
        return _problem(len(self.rows) - 1, key, row.get("prompt") or row.get("question", ""), None, row, self.cfg)

    def score(self, problem: Problem, reply: Messages) -> dict[str, tuple[float, float]]:
        row = self.rows[problem.meta["vf_index"]]
        state = {"prompt": vf_messages(self.types, _prompt_messages(problem)), "input": row,
                 "completion": vf_messages(self.types, reply), "answer": row.get("answer", ""),
                 "info": row.get("info") or {}, "task": row.get("task", "default"), "trajectory": []}
        out = {}
        for (rubric, fn), w in zip(self.funcs, self.weights):
            objects = rubric.score_objects(state)
            params = inspect.signature(fn).parameters
            wants_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
            out[fn.__name__] = (float(run_sync(fn(**{k: v for k, v in objects.items()
                                                    if wants_all or k in params}))), w)
        return out

    def extract_answer(self, completion: str) -> str | None:
        try:
            return self.env.parser.parse_answer(completion)
        except Exception:  # noqa: BLE001 - a parser that cannot read it: no answer
            return None

    def tools(self) -> tuple[dict[str, Callable[..., Any]], dict[str, dict]]:
        tools = dict(getattr(self.env, "tool_map", None) or {})
        schemas = {}
        for d in getattr(self.env, "tool_defs", None) or []:
            name = d["name"] if isinstance(d, dict) else d.name
            if name in tools:
                schemas[name] = {"type": "function", "function": {
                    "name": name, "description": d["description"] if isinstance(d, dict) else d.description,
                    "parameters": d["parameters"] if isinstance(d, dict) else d.parameters}}
        return tools, schemas


@TASKS.register("verifiers", config=VerifiersConfig)
def verifiers(cfg: VerifiersConfig, env) -> VerifiersTask:
    return VerifiersTask(cfg, env.seed)
