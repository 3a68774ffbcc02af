"""MCP servers as tool sources (``rollout.tools.mcp``, with ``protocol: chat``; ``pip install 'groupwise[mcp]'``).

Each server is a stdio child process (its command line, the ``mcp`` package's client), started once per process when
the run is built and ended at exit; its tools join the task's as ``<server>_<tool>`` with the JSON schema
the server advertises (``inputSchema``). A call goes to the server over its session on one background event loop and
waits at most ``rollout.tools.timeout_s``: its text content is the result (or its structured content, as JSON), an
``isError`` result raises (``error: RuntimeError`` for the model, counted). The tools are groupwise's callables, so
they run in the tool loop's threads; the server's own code runs in its own process. A server that does not start, or
does not answer the handshake within the timeout, is one line naming it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

from groupwise.registry import ConfigError

Servers = tuple[tuple[str, tuple[str, ...]], ...]
"""(name, command line) of each server."""
_STARTED: dict[Servers, McpServers] = {}


def mcp_tools(servers: dict[str, tuple[str, ...]], timeout_s: float) -> dict[str, Callable[..., Any]]:
    """The tools of ``servers`` (name -> command line) by name, the servers started once per process, on first use."""
    key = tuple((name, tuple(argv)) for name, argv in servers.items())
    if not key:
        return {}
    if key not in _STARTED:
        _STARTED[key] = McpServers(key, timeout_s)
    return _STARTED[key].tools


class McpServers:
    """The sessions of some MCP servers, held open by one task on a background event loop until ``close``."""

    def __init__(self, servers: Servers, timeout_s: float):
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise ConfigError("rollout.tools.mcp needs the mcp package, which is not installed: "
                              "pip install 'groupwise[mcp]'") from None
        self.timeout_s, self.tools = timeout_s, {}
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="groupwise-mcp").start()
        self._stop = asyncio.Event()
        self._started = threading.Event()
        self._error: list[str] = []
        self._held = asyncio.run_coroutine_threadsafe(self._hold(servers), self.loop)
        if not self._started.wait(max(timeout_s, 30.0)) or self._error:
            why = self._error[0] if self._error else f"no answer within {max(timeout_s, 30.0):g}s"
            raise ConfigError(f"rollout.tools.mcp: {why}")
        atexit.register(self.close)

    async def _hold(self, servers: Servers) -> None:
        """Enter every server's session, publish its tools, and keep them open until ``close`` (one task: the
        client's task groups must be left by the task that entered them)."""
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        async with contextlib.AsyncExitStack() as stack:
            for name, argv in servers:
                try:
                    params = StdioServerParameters(command=argv[0], args=list(argv[1:]), env=dict(os.environ))
                    read, write = await stack.enter_async_context(stdio_client(params))
                    session = await stack.enter_async_context(ClientSession(read, write))
                    await asyncio.wait_for(session.initialize(), self.timeout_s)
                    listed = await asyncio.wait_for(session.list_tools(), self.timeout_s)
                except Exception as e:  # noqa: BLE001 - any failure to start is the same one line
                    self._error.append(f"server {name!r} ({' '.join(argv)}) did not start: "
                                       f"{type(e).__name__}: {str(e).strip()[:200]}")
                    self._started.set()
                    return
                for tool in listed.tools:
                    self.tools[f"{name}_{tool.name}"] = self._tool(session, name, tool)
            self._started.set()
            await self._stop.wait()

    def _tool(self, session: Any, server: str, tool: Any) -> Callable[..., Any]:
        def call(**arguments: Any) -> Any:
            future = asyncio.run_coroutine_threadsafe(session.call_tool(tool.name, arguments), self.loop)
            result = future.result(self.timeout_s)
            text = "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")
            if result.isError:
                raise RuntimeError(text.strip()[:200] or f"{server}_{tool.name} reported an error")
            return text if text or not result.structuredContent else result.structuredContent

        call.__name__ = f"{server}_{tool.name}"
        call.tool_schema = {"type": "function", "function": {  # type: ignore[attr-defined]
            "name": call.__name__, "description": tool.description or "", "parameters": tool.inputSchema}}
        return call

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self._stop.set)
            with contextlib.suppress(Exception):
                self._held.result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
