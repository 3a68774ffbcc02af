"""Multi-turn tool use (``rollout.tools``): a generator whose every completion alternates model turns and
tool results. It wraps the run's generator, so training rollouts, transforms that regenerate and held-out
eval all run the same episodes; builders and the loop are unchanged.

For each request, all rows of a call in lockstep (one inner generator call per turn):

1. the model generates until EOS, the turn's cap (``turn_tokens``) or the call's closing tag ``</tool>``
   (added to the stop strings);
2. a turn that ends in ``<tool>query</tool>`` calls the task's tool (``task.tools[tool]``) on ``query``; the
   result, as ``<result>text</result>`` (cut to ``result_tokens`` tokens, the closing tag kept), is appended,
   and the model continues from prompt + everything so far (one prefill per row and turn);
3. the episode ends at EOS (``finish_reason`` ``stop``), at the row's token cap (``rollout.max_completion_tokens``
   or the request's own, model and tool tokens together: ``length``), at a turn that ends neither in a call
   nor in EOS (``length``), or at a call in the last allowed turn (``max_turns``; ``turns``: it is not run).

The completion is the whole interleaving. Tool tokens are context, not actions: they are ``forced`` (so
``loss_mask = False``) with ``rollout_logprobs = NaN``, so they carry no loss and no importance ratio. Model
tokens keep the inner generator's sampling log-probs, and the training forward sees exactly the token ids
the model saw (nothing is re-tokenised). A request's forced prefix (e.g. a think-mode token) is applied in
the first turn.

The calls of one turn run concurrently (``workers`` at a time), all bounded by ``timeout_s`` from the start of
the turn's calls: a call that raises (or calls ``sys.exit``) reads ``<result>error: <Type></result>``, one that
times out ``<result>timeout</result>``, and the episode goes on. Where they run is ``isolation``
(``groupwise/isolation.py``): ``process`` (the default for a plug-in task's tool on Linux) runs them in forked
worker processes, and one over the deadline is killed, so a call stuck in C code (a regex) or ``os._exit``
cannot stall or end the run; ``thread`` (groupwise's own tools) runs them in daemon threads, and a hung call's
thread is abandoned (never joined, not even when the process exits), but one that holds the GIL in C code
stalls the run. A result is cut to ``MAX_CHARS_PER_TOKEN x result_tokens`` characters before it is tokenised
(in the worker, under ``process``), so a 10 MB result costs what a short one does.
Per sample ``meta``: ``turns``, ``tool_calls``, ``tool_errors``, ``tool_timeouts``, ``tool_tokens`` (the loop
reports their per-rollout means as ``rollout/turns``, ``rollout/tool_calls``, ... and ``rollout/tool_token_frac``;
``loop/stats.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing import connection

from groupwise.config import ToolsConfig
from groupwise.isolation import Forked, resolve
from groupwise.lazy import torch
from groupwise.rollout.base import Generator, Request, SamplingParams, close, release
from groupwise.types import Completion

MAX_CHARS_PER_TOKEN = 32
"""A tool result is cut to this many characters per ``result_tokens`` before tokenising (no tokenizer's token
is longer, so the token cut after it is what it would have been)."""


@dataclasses.dataclass
class _Episode:
    request: Request
    cap: int
    ids: list[int] = dataclasses.field(default_factory=list)
    logps: list[float] = dataclasses.field(default_factory=list)
    forced: list[bool] = dataclasses.field(default_factory=list)
    reason: str = ""
    meta: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(
            ("turns", "tool_calls", "tool_errors", "tool_timeouts", "tool_tokens"), 0))

    def add(self, ids: list[int], logps: list[float], forced: list[bool]) -> None:
        self.ids += ids
        self.logps += logps
        self.forced += forced

    def completion(self) -> Completion:
        return Completion(torch.tensor(self.ids, dtype=torch.long), torch.tensor(self.logps, dtype=torch.float),
                          self.reason or "length", torch.tensor(self.forced, dtype=torch.bool), dict(self.meta))


class ToolLoop:
    """A ``Generator`` running multi-turn tool episodes over ``inner`` (see the module docstring)."""

    def __init__(self, inner: Generator, tool: Callable[[str], str], tokenizer, cfg: ToolsConfig):
        self.inner, self.tool, self.tokenizer, self.cfg = inner, tool, tokenizer, cfg
        process = resolve("alarm" if cfg.isolation == "thread" else cfg.isolation, tool) == "process"
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
        turn_params = dataclasses.replace(params, stop=(*params.stop, self.close_tag))
        for turn in range(self.cfg.max_turns):
            live = [e for e in eps if not e.reason]
            if not live:
                break
            reqs = [Request(torch.cat([e.request.prompt_ids, torch.tensor(e.ids, dtype=torch.long)]),
                            e.request.prefix if turn == 0 else (),
                            min(self.cfg.turn_tokens + (len(e.request.prefix) if turn == 0 else 0), e.cap - len(e.ids)))
                    for e in live]
            calls = [(e, q) for e, c in zip(live, self.inner.generate(reqs, turn_params, rng))
                     if (q := self._model_turn(e, c, last=turn == self.cfg.max_turns - 1)) is not None]
            for (e, _), result in zip(calls, self._run_tools([e for e, _ in calls], [q for _, q in calls])):
                self._append_result(e, result)
        return [e.completion() for e in eps]

    def _model_turn(self, e: _Episode, c: Completion, last: bool) -> str | None:
        """Record one model turn; return the tool query to run, or None when the episode ended."""
        forced = c.forced.tolist() if c.forced is not None else [False] * int(c.completion_ids.numel())
        e.add(c.completion_ids.tolist(), c.rollout_logprobs.tolist(), forced)
        e.meta["turns"] += 1
        text = self.tokenizer.decode(c.completion_ids.tolist(), skip_special_tokens=True)
        called = c.finish_reason == "stop" and text.endswith(self.close_tag) and self.open_tag in text
        if not called:
            e.reason = "length" if len(e.ids) >= e.cap else c.finish_reason
        elif last:
            e.reason = "turns"
        elif len(e.ids) >= e.cap:
            e.reason = "length"
        return text.rsplit(self.open_tag, 1)[1][:-len(self.close_tag)] if called and not e.reason else None

    def _append_result(self, e: _Episode, result: str) -> None:
        result = result[:MAX_CHARS_PER_TOKEN * self.cfg.result_tokens]
        ids = self.tokenizer.encode(f"<result>{result}</result>", add_special_tokens=False)
        if len(ids) > self.cfg.result_tokens:  # cut the text, keep the closing tag
            ids = ids[:max(self.cfg.result_tokens - len(self.end_ids), 0)] + self.end_ids
        ids = ids[:e.cap - len(e.ids)]
        e.add(ids, [math.nan] * len(ids), [True] * len(ids))
        e.meta["tool_calls"] += 1
        e.meta["tool_tokens"] += len(ids)
        if len(e.ids) >= e.cap:
            e.reason = "length"

    def _run_tools(self, eps: list[_Episode], queries: list[str]) -> list[str]:
        """The turn's calls, concurrently, bounded by ``timeout_s`` from the start (see the module docstring)."""
        if not queries:
            return []
        results = self._run_forked(queries) if self.pool is not None else self._run_threads(queries)
        out = []
        for e, r in zip(eps, results):
            if r is None:
                out.append("timeout")
                e.meta["tool_timeouts"] += 1
                continue
            ok, value = r
            out.append(str(value) if ok else f"error: {getattr(value, 'type_name', type(value).__name__)}")
            e.meta["tool_errors"] += not ok
        return out

    def _run_forked(self, queries: list[str]) -> list[tuple[bool, object] | None]:
        """``isolation: process``: up to ``workers`` forked processes take the calls in order; at the deadline the
        ones still running are killed (a new process is forked for the next turn). None: a timeout."""
        assert self.pool is not None
        limit = MAX_CHARS_PER_TOKEN * self.cfg.result_tokens  # cut in the worker: a 10 MB result never crosses
        while len(self.pool) < min(self.cfg.workers, len(queries)):
            self.pool.append(Forked(functools.partial(call_cut, self.tool, limit), self.cfg.timeout_s, "tool"))
        results: list[tuple[bool, object] | None] = [None] * len(queries)
        todo, running, free = list(range(len(queries))), {}, list(range(len(self.pool)))
        deadline = time.monotonic() + self.cfg.timeout_s
        while todo or running:
            while todo and free:
                k, i = free.pop(0), todo.pop(0)
                self.pool[k].submit(queries[i])
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

    def _run_threads(self, queries: list[str]) -> list[tuple[bool, object] | None]:
        """``isolation: thread``: daemon threads (a hung call's thread is abandoned). None: a timeout."""
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        for job in enumerate(queries):
            jobs.put(job)
        results: dict[int, tuple[bool, object]] = {}
        done = [threading.Event() for _ in queries]
        over = threading.Event()  # the turn's deadline passed: queued calls are not started

        def worker() -> None:
            while not over.is_set():
                try:
                    i, q = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[i] = (True, self.tool(q))
                except BaseException as err:  # noqa: BLE001  (a tool's failure, exit included, is counted)
                    results[i] = (False, err)
                done[i].set()

        for _ in range(min(self.cfg.workers, len(queries))):  # daemon: a hung call never holds the exit
            threading.Thread(target=worker, daemon=True, name="groupwise-tool").start()
        deadline = time.monotonic() + self.cfg.timeout_s
        out = [results[i] if done[i].wait(max(deadline - time.monotonic(), 0.0)) else None
               for i in range(len(queries))]
        over.set()
        return out


def call_cut(tool: Callable[[str], object], limit: int, query: str) -> str:
    """A tool call in a forked worker: its result as text, cut to ``limit`` characters before it is sent back."""
    return str(tool(query))[:limit]


def wrap(inner: Generator, cfg: ToolsConfig, task, tokenizer) -> ToolLoop:
    """``inner`` in the tool loop over ``task.tools[cfg.tool]`` (the task declares the tool as the ability
    ``tool:<name>``, checked at load: ``config/check.py``)."""
    return ToolLoop(inner, task.tools[cfg.tool], tokenizer, cfg)
