"""Multi-turn tool use (``rollout.tools``): a generator whose every completion alternates model turns and
tool results (or an environment's replies). It wraps the run's generator, so training rollouts, transforms that
regenerate and held-out eval all run the same episodes; builders and the loop are unchanged.

Two protocols (``rollout.tools.protocol``):

  text  the model writes ``<tool>query</tool>`` (the tag is the tool's name; ``</tool>`` is added to the stop
        strings) and gets ``<result>text</result>`` back (cut to ``result_tokens`` tokens, the closing tag kept):
        one tool (``rollout.tools.tool``), called as ``tool(query)``.
  chat  the tokenizer's chat template (``loop/chat_tools.py``): the task's tools (``rollout.tools.tools``, all
        of them by default) are rendered into every prompt as OpenAI-style JSON schemas, the model's calls are
        parsed from its turn (several per turn), each tool is called as ``tool(**arguments)`` and its result goes
        back as a ``tool`` message (its content cut to ``result_tokens`` tokens) rendered by the template, followed
        by the next generation prompt. MCP servers' tools join them (``rollout.tools.mcp``, ``loop/mcp_tools.py``).
        A task with episodes (``tasks.base.EpisodeTask``: an OpenEnv server, a
        verifiers multi-turn env) gets one per rollout: a turn that calls no tool goes to ``episode.respond`` and
        the user messages it returns are appended the same way, until it returns None.

For each request, all rows of a call in lockstep (one inner generator call per turn): the model generates until
EOS, the turn's cap (``turn_tokens``) or (text) the closing tag; a turn that calls a tool (or that an episode
answers) continues from prompt + everything so far (one prefill per row and turn); the episode ends at EOS with no
call and no environment reply (``finish_reason`` ``stop``), at the row's token cap (``rollout.max_completion_tokens``
or the request's own, model and tool tokens together: ``length``), at a turn that ends neither in a call nor in EOS
(``length``), or at a call in the last allowed turn (``max_turns``; ``turns``: it is not run).

The completion is the whole interleaving. Tool tokens are context, not actions: they are ``forced`` (so
``loss_mask = False``) with ``rollout_logprobs = NaN``, so they carry no loss and no importance ratio. Model
tokens keep the inner generator's sampling log-probs, and the training forward sees exactly the token ids
the model saw (nothing is re-tokenised). A request's forced prefix (e.g. a think-mode token) is applied in
the first turn.

The calls of one turn run concurrently (``workers`` at a time), all bounded by ``timeout_s`` from the start of
the turn's calls: a call that raises (or calls ``sys.exit``) reads ``error: <Type>``, one that times out
``timeout``, and the episode goes on (an episode's own ``respond`` that fails ends its episode). Where the task's
tools run is ``isolation`` (``groupwise/isolation.py``): ``process`` (the default for a plug-in task's tools on
Linux) runs them in forked worker processes, and one over the deadline is killed, so a call stuck in C code (a
regex) or ``os._exit`` cannot stall or end the run; ``thread`` (groupwise's own tools) runs them in daemon threads,
and a hung call's thread is abandoned (never joined, not even when the process exits), but one that holds the GIL
in C code stalls the run. An episode's ``respond`` always runs in a thread (its state lives in this process; an
OpenEnv environment runs in its own server). A result is cut to ``MAX_CHARS_PER_TOKEN x result_tokens`` characters
before it is tokenised (in the worker, under ``process``), so a 10 MB result costs what a short one does.
Per sample ``meta``: ``turns``, ``tool_calls``, ``tool_errors``, ``tool_timeouts``, ``tool_tokens`` (the loop
reports their per-rollout means as ``rollout/turns``, ``rollout/tool_calls``, ... and ``rollout/tool_token_frac``;
``loop/stats.py``); with ``chat``, ``messages`` (the episode as chat messages, after the prompt: assistant turns
with their parsed ``tool_calls``, tool results, an environment's replies) and what the episode's ``close`` returns.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

from groupwise.config import ToolsConfig
from groupwise.isolation import Forked, resolve
from groupwise.lazy import torch
from groupwise.loop.chat_tools import ChatTemplate, ToolCall, call_message, tool_message, tool_schema
from groupwise.loop.mcp_tools import mcp_tools
from groupwise.registry import ConfigError
from groupwise.rollout.base import Generator, Request, SamplingParams, close, release
from groupwise.tasks.base import Episode, EpisodeTask
from groupwise.types import Completion

MAX_CHARS_PER_TOKEN = 32
"""A tool result is cut to this many characters per ``result_tokens`` before tokenising (no tokenizer's token
is longer, so the token cut after it is what it would have been)."""

Outcome = tuple[bool, Any] | None
"""A call's outcome: (True, value), (False, the exception) or None (over the turn's deadline)."""


@dataclasses.dataclass(eq=False)  # by identity: a turn's calls are grouped by their episode
class _Episode:
    request: Request
    cap: int
    ids: list[int] = dataclasses.field(default_factory=list)
    logps: list[float] = dataclasses.field(default_factory=list)
    forced: list[bool] = dataclasses.field(default_factory=list)
    reason: str = ""
    env: Episode | None = None
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    meta: dict[str, Any] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(
            ("turns", "tool_calls", "tool_errors", "tool_timeouts", "tool_tokens"), 0))

    def add(self, ids: list[int], logps: list[float], forced: list[bool]) -> None:
        self.ids += ids
        self.logps += logps
        self.forced += forced

    def completion(self) -> Completion:
        return Completion(torch.tensor(self.ids, dtype=torch.long), torch.tensor(self.logps, dtype=torch.float),
                          self.reason or "length", torch.tensor(self.forced, dtype=torch.bool), dict(self.meta))


@dataclasses.dataclass
class _Call:
    """One job of a turn: a task tool by name (``args``: the text protocol's query, or the chat arguments), or an
    episode's ``respond`` (``reply``); ``error`` set: answered with it, never run (a malformed or unknown call)."""

    episode: _Episode
    name: str = ""
    args: Any = None
    call: ToolCall | None = None
    reply: str | None = None
    error: str = ""


class ToolLoop:
    """A ``Generator`` running multi-turn tool episodes over ``inner`` (see the module docstring). ``tools``: the
    task's tools by name; ``chat``: the chat-template protocol (None: text); ``episodes``: a task whose rollouts
    are environment episodes (chat only)."""

    def __init__(self, inner: Generator, tools: dict[str, Callable[..., Any]], tokenizer, cfg: ToolsConfig,
                 chat: ChatTemplate | None = None, episodes: EpisodeTask | None = None):
        self.inner, self.tools, self.tokenizer, self.cfg = inner, tools, tokenizer, cfg
        self.chat, self.episodes = chat, episodes
        mode = "alarm" if cfg.isolation == "thread" else cfg.isolation
        process = any(resolve(mode, fn) == "process" for fn in tools.values())
        self.pool: list[Forked] | None = [] if process else None  # forked on the first call (``_run_forked``)
        self.open_tag, self.close_tag = f"<{cfg.tool}>", f"</{cfg.tool}>"
        self.end_ids = tokenizer.encode("</result>", add_special_tokens=False)

    def sync_weights(self, model) -> bool | None:
        return self.inner.sync_weights(model)

    def release(self) -> None:
        release(self.inner)

    def close(self) -> None:
        for worker in self.pool or []:
            worker.close()
        close(self.inner)

    def generate(self, requests: list[Request], params: SamplingParams, rng: torch.Generator) -> list[Completion]:
        eps = [_Episode(r, r.max_tokens if r.max_tokens is not None else params.max_tokens) for r in requests]
        if self.episodes is not None:
            self._open(eps)
        stop = params.stop if self.chat is not None else (*params.stop, self.close_tag)
        turn_params = dataclasses.replace(params, stop=stop)
        for turn in range(self.cfg.max_turns):
            live = [e for e in eps if not e.reason]
            if not live:
                break
            reqs = [Request(torch.cat([e.request.prompt_ids, torch.tensor(e.ids, dtype=torch.long)]),
                            e.request.prefix if turn == 0 else (),
                            min(self.cfg.turn_tokens + (len(e.request.prefix) if turn == 0 else 0), e.cap - len(e.ids)))
                    for e in live]
            calls = [call for e, c in zip(live, self.inner.generate(reqs, turn_params, rng))
                     for call in self._model_turn(e, c, last=turn == self.cfg.max_turns - 1)]
            outcomes = self._run(calls)
            for e in dict.fromkeys(call.episode for call in calls):
                mine = [(call, o) for call, o in zip(calls, outcomes) if call.episode is e]
                self._append(e, [c for c, _ in mine], [o for _, o in mine])
        return self._finish(eps)

    # ------------------------------------------------------------------------------------ model turns
    def _model_turn(self, e: _Episode, c: Completion, last: bool) -> list[_Call]:
        """Record one model turn; return the turn's calls (none: the episode ended)."""
        forced = c.forced.tolist() if c.forced is not None else [False] * int(c.completion_ids.numel())
        ids = c.completion_ids.tolist()
        e.add(ids, c.rollout_logprobs.tolist(), forced)
        e.meta["turns"] += 1
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        calls = self._calls(e, ids, text) if c.finish_reason == "stop" else []
        if not calls:
            e.reason = "length" if len(e.ids) >= e.cap else c.finish_reason
        elif last:
            e.reason = "turns"
        elif len(e.ids) >= e.cap:
            e.reason = "length"
        return [] if e.reason else calls

    def _calls(self, e: _Episode, ids: list[int], text: str) -> list[_Call]:
        if self.chat is None:
            if text.endswith(self.close_tag) and self.open_tag in text:
                return [_Call(e, self.cfg.tool, text.rsplit(self.open_tag, 1)[1][:-len(self.close_tag)])]
            return []
        content, parsed = self.chat.parse(ids, text, e.request.prompt_ids.tolist() + e.ids[:len(e.ids) - len(ids)])
        e.messages.append(call_message(parsed, content) if parsed else {"role": "assistant", "content": content})
        if not parsed:
            return [_Call(e, reply=content)] if e.env is not None else []
        return [_Call(e, c.name, c.arguments, c, error=c.error or ("" if c.name in self.tools else
                                                                  f"unknown tool {c.name!r}")) for c in parsed]

    # ------------------------------------------------------------------------------------ results
    def _append(self, e: _Episode, calls: list[_Call], outcomes: list[Outcome]) -> None:
        if calls[0].reply is not None:  # the environment's reply to a turn without calls
            self._append_reply(e, outcomes[0])
            return
        texts = [self._text(e, call, o) for call, o in zip(calls, outcomes)]
        if self.chat is None:
            ids = self.tokenizer.encode(f"<result>{texts[0]}</result>", add_special_tokens=False)
            if len(ids) > self.cfg.result_tokens:  # cut the text, keep the closing tag
                ids = ids[:max(self.cfg.result_tokens - len(self.end_ids), 0)] + self.end_ids
        else:
            messages = [tool_message(call.call, self._cut(text)) for call, text in zip(calls, texts)]
            e.messages += messages
            ids = self.chat.next_ids(messages, [call.call for call in calls], e.ids[-1] if e.ids else None)
        self._add_forced(e, ids)
        e.meta["tool_calls"] += len(calls)

    def _append_reply(self, e: _Episode, outcome: Outcome) -> None:
        """An episode's ``respond``: its messages appended; None, a failure or a timeout ends the episode."""
        if outcome is None or not outcome[0]:
            self._env_failed(e, outcome)
            e.reason = "stop"
            return
        if outcome[1] is None:
            e.reason = "stop"
            return
        try:
            messages = [{"role": str(m.get("role", "user")), "content": self._cut(str(m.get("content", "")))}
                        for m in outcome[1]]
        except (AttributeError, TypeError):  # not a list of messages: a malformed reply ends the episode
            self._env_failed(e, (False, TypeError(f"respond returned {outcome[1]!r:.80}, not a list of messages")))
            e.reason = "stop"
            return
        e.messages += messages
        self._add_forced(e, self.chat.next_ids(messages, [], e.ids[-1] if e.ids else None))

    def _text(self, e: _Episode, call: _Call, outcome: Outcome) -> str:
        if call.error:
            e.meta["tool_errors"] += 1
            return f"error: {call.error}"
        if outcome is None:
            e.meta["tool_timeouts"] += 1
            return "timeout"
        ok, value = outcome
        e.meta["tool_errors"] += not ok
        return as_text(value) if ok else f"error: {getattr(value, 'type_name', type(value).__name__)}"

    def _cut(self, text: str) -> str:
        """A chat message's content cut to ``result_tokens`` tokens (before the template wraps it)."""
        text = text[:MAX_CHARS_PER_TOKEN * self.cfg.result_tokens]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self.tokenizer.decode(ids[:self.cfg.result_tokens]) if len(ids) > self.cfg.result_tokens else text

    def _add_forced(self, e: _Episode, ids: list[int]) -> None:
        ids = ids[:e.cap - len(e.ids)]
        e.add(ids, [math.nan] * len(ids), [True] * len(ids))
        e.meta["tool_tokens"] += len(ids)
        if len(e.ids) >= e.cap:
            e.reason = "length"

    # ------------------------------------------------------------------------------------ episodes
    def _open(self, eps: list[_Episode]) -> None:
        """Open every row's episode (``open_episode``), concurrently and bounded like a turn's calls. A row whose
        episode does not open is counted (``tool_errors`` / ``tool_timeouts``, ``meta["env_error"]``) and runs
        without it: its first turn ends it (its environment reward term then fails on it, counted too)."""
        for e in eps:
            if e.request.problem is None:
                raise ValueError("rollout.tools: the task's episodes need each request's problem (Request.problem); "
                                 "this caller generated without it")
        opened = self._run_threads([functools.partial(self.episodes.open_episode, e.request.problem) for e in eps])()
        for e, outcome in zip(eps, opened):
            if outcome is not None and outcome[0]:
                e.env = outcome[1]
            else:
                self._env_failed(e, outcome)

    def _env_failed(self, e: _Episode, outcome: Outcome) -> None:
        """Count an environment call that failed: the loop's ``timeout_s`` passing, or the environment's own
        ``TimeoutError`` (its own limit, e.g. OpenEnv's ``task.timeout_s``, which can fire first), as a timeout
        (``env_error`` "timeout", then the environment's message if it raised), anything else as an error."""
        err = None if outcome is None else outcome[1]
        timed_out = err is None or isinstance(err, TimeoutError)
        e.meta["tool_timeouts" if timed_out else "tool_errors"] += 1
        e.meta["env_error"] = "timeout" if err is None else ("timeout: " if timed_out else "") + _first_line(err)

    def _finish(self, eps: list[_Episode]) -> list[Completion]:
        """The completions, each episode closed (concurrently, bounded) and what its ``close`` returns in meta."""
        live = [e for e in eps if e.env is not None]
        texts = [self.tokenizer.decode(e.ids, skip_special_tokens=True) for e in live]  # the samples' ``text``
        closes = [functools.partial(e.env.close, text) for e, text in zip(live, texts)]
        for e, outcome in zip(live, self._run_threads(closes)() if live else []):
            if outcome is not None and outcome[0] and isinstance(outcome[1], dict):
                e.meta.update(outcome[1])
            else:
                self._env_failed(e, outcome if outcome is None or not outcome[0] else
                                 (False, TypeError(f"close() returned {type(outcome[1]).__name__}, not a dict")))
        for e in eps:
            if self.chat is not None:
                e.meta["messages"] = e.messages
        return [e.completion() for e in eps]

    # ------------------------------------------------------------------------------------ running calls
    def _run(self, calls: list[_Call]) -> list[Outcome]:
        """The turn's calls, concurrently, bounded by ``timeout_s`` from the start (see the module docstring):
        task tools forked (``process``) or in threads, episodes' replies in threads."""
        outcomes: list[Outcome] = [None] * len(calls)
        tool = [i for i, c in enumerate(calls) if c.reply is None and not c.error]
        env = [i for i, c in enumerate(calls) if c.reply is not None]
        forked = tool if self.pool is not None else []
        threaded = [*([] if self.pool is not None else tool), *env]
        jobs = [functools.partial(calls[i].episode.env.respond, calls[i].reply) if calls[i].reply is not None
                else functools.partial(call_tool, self.tools, MAX_CHARS_PER_TOKEN * self.cfg.result_tokens,
                                       calls[i].name, calls[i].args) for i in threaded]
        waiter = self._run_threads(jobs) if jobs else list
        for i, o in zip(forked, self._run_forked([(calls[i].name, calls[i].args) for i in forked])):
            outcomes[i] = o
        for i, o in zip(threaded, waiter()):
            outcomes[i] = o
        return outcomes

    def _run_forked(self, payloads: list[tuple[str, Any]]) -> list[Outcome]:
        """``isolation: process``: up to ``workers`` forked processes take the calls in order; at the deadline the
        ones still running are killed (a new process is forked for the next turn). None: a timeout."""
        if not payloads:
            return []
        assert self.pool is not None
        limit = MAX_CHARS_PER_TOKEN * self.cfg.result_tokens  # cut in the worker: a 10 MB result never crosses
        while len(self.pool) < min(self.cfg.workers, len(payloads)):
            self.pool.append(Forked(functools.partial(call_tool, self.tools, limit), self.cfg.timeout_s, "tool"))
        results: list[Outcome] = [None] * len(payloads)
        todo, running, free = list(range(len(payloads))), {}, list(range(len(self.pool)))
        deadline = time.monotonic() + self.cfg.timeout_s
        while todo or running:
            while todo and free:
                k, i = free.pop(0), todo.pop(0)
                self.pool[k].submit(*payloads[i])
                running[self.pool[k].connection] = (k, i)
            ready = connection.wait(list(running), timeout=max(deadline - time.monotonic(), 0.0))
            if not ready:
                break
            for conn in ready:
                k, i = running.pop(conn)
                free.append(k)
                try:
                    results[i] = (True, self.pool[k].result(0))
                except Exception as err:  # noqa: BLE001  (a tool's failure, a dead worker included, is counted)
                    results[i] = (False, err)
        for k, _ in running.values():  # over the deadline: killed, a fresh worker next time
            self.pool[k].close()
        return results

    def _run_threads(self, jobs: list[Callable[[], Any]]) -> Callable[[], list[Outcome]]:
        """``isolation: thread``: daemon threads (a hung call's thread is abandoned), started now; the returned
        function waits for them until the deadline. None: a timeout."""
        pending: queue.SimpleQueue = queue.SimpleQueue()
        for job in enumerate(jobs):
            pending.put(job)
        results: dict[int, tuple[bool, Any]] = {}
        done = [threading.Event() for _ in jobs]
        over = threading.Event()  # the turn's deadline passed: queued calls are not started

        def worker() -> None:
            while not over.is_set():
                try:
                    i, job = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[i] = (True, job())
                except BaseException as err:  # noqa: BLE001  (a tool's failure, exit included, is counted)
                    results[i] = (False, err)
                done[i].set()

        for _ in range(min(self.cfg.workers, len(jobs))):  # daemon: a hung call never holds the exit
            threading.Thread(target=worker, daemon=True, name="groupwise-tool").start()
        deadline = time.monotonic() + self.cfg.timeout_s

        def wait() -> list[Outcome]:
            out = [results[i] if done[i].wait(max(deadline - time.monotonic(), 0.0)) else None
                   for i in range(len(jobs))]
            over.set()
            return out

        return wait


def call_tool(tools: dict[str, Callable[..., Any]], limit: int, name: str, args: Any) -> str:
    """A tool call (in a forked worker, or a thread): its result as text, cut to ``limit`` characters before it is
    sent back. ``args``: the text protocol's query (``tool(query)``) or the chat call's arguments (``tool(**args)``)."""
    fn = tools[name]
    return as_text(fn(**args) if isinstance(args, dict) else fn(args))[:limit]


def as_text(value: Any) -> str:
    """A tool's result as the text the model reads: a string as it is, a dict or list as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__


def offered(cfg: ToolsConfig, task) -> dict[str, Callable[..., Any]]:
    """The task's tools the model is offered: text, ``cfg.tool`` (``config/check.py`` checked at load that the task
    declares it: the ability ``tool:<name>``); chat, ``cfg.tools`` (empty: every tool; an environment's tools are
    known once its task is built, so they are checked here)."""
    tools = getattr(task, "tools", None) or {}
    name = getattr(task, "name", "?")
    if cfg.protocol == "text" and isinstance(task, EpisodeTask):
        raise ConfigError(f"rollout.tools.protocol=text: task '{name}' runs an environment's episodes, whose turns "
                          "go through the chat template; allowed: protocol=chat")
    if cfg.protocol == "text":  # the task declares its tool as the ability ``tool:<name>``, checked at load
        return {cfg.tool: tools[cfg.tool]}
    unknown = [t for t in cfg.tools if t not in tools]
    if unknown:
        raise ConfigError(f"rollout.tools.tools: task '{name}' has no tool {unknown[0]!r}; allowed: "
                          f"{', '.join(sorted(tools)) or 'none (the task has no tools)'}")
    servers = mcp_tools(cfg.mcp, cfg.timeout_s) if cfg.mcp else {}
    if not tools and not servers and not isinstance(task, EpisodeTask):
        raise ConfigError(f"rollout.tools: task '{name}' has no tools and no episodes; allowed: a task with tools "
                          "(task.name=search), an environment (task.name=verifiers / openenv) or MCP servers (mcp)")
    return {**{t: tools[t] for t in (cfg.tools or sorted(tools))}, **servers}


def schemas(cfg: ToolsConfig | None, task) -> list[dict[str, Any]] | None:
    """The tool schemas rendered into every prompt (chat protocol with tools), else None."""
    if cfg is None or cfg.protocol != "chat":
        return None
    explicit = getattr(task, "tool_schemas", None) or {}
    return [explicit.get(name) or tool_schema(name, fn) for name, fn in offered(cfg, task).items()] or None


def wrap(inner: Generator, cfg: ToolsConfig, task, tokenizer, model: str = "the model") -> ToolLoop:
    """``inner`` in the tool loop over the task's tools (``offered``), an environment's episodes and MCP servers'."""
    tools = offered(cfg, task)
    chat = ChatTemplate(tokenizer, schemas(cfg, task) or [], f"'{model}'") if cfg.protocol == "chat" else None
    episodes = task if cfg.protocol == "chat" and isinstance(task, EpisodeTask) else None
    return ToolLoop(inner, tools, tokenizer, cfg, chat, episodes)
