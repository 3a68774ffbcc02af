"""Tool calls and results through the tokenizer's chat template (``rollout.tools.protocol: chat``).

What a transformers / TRL user's model expects: the tools are rendered into the prompt as OpenAI-style JSON
schemas (``apply_chat_template(messages, tools=...)``), the model writes its calls in its own format, and each
result goes back as a ``{"role": "tool", "name": ..., "content": ...}`` message rendered by the same template.

  schemas   ``tool_schema(name, fn)``: ``fn.tool_schema`` when the tool carries one (an MCP tool, a verifiers
            toolset's), else transformers' ``get_json_schema`` (a Google-style docstring), else the signature's
            type hints (``str`` → string, ``int`` → integer, ...; no default → required) with the docstring's first
            paragraph as the description.
  calls     ``ChatTemplate.parse``: the tokenizer's ``response_template`` (``tokenizer.parse_response``, transformers
            >= 5.13) when it has one; else ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
            (Hermes / Qwen 2.5-3 / SmolLM3 and most open models of 2026), else a reply that is one JSON object with
            ``name`` and ``arguments`` / ``parameters`` (Llama 3.x). A ``<tool_call>`` block that is not such JSON
            is a malformed call (answered with an error, counted in ``tool_errors``).
  results   ``ChatTemplate.next_ids``: the token ids that follow the model's own turn, computed as TRL's
            ``GRPOTrainer._get_tool_suffix_ids`` does: render a dummy (user, assistant with the call) conversation
            with and without the tool messages (plus the generation prompt) and keep the difference, the dummy
            prefix cut after the last occurrence of the token the model's turn ended with (``<|im_end|>``, EOS),
            so the template's own separator after it (``\\n``) is part of the result. The model's sampled ids are
            never re-tokenised: training sees exactly what the model saw.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable
from typing import Any

from groupwise.registry import ConfigError

JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", tuple: "array",
              dict: "object"}
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call the model made: the tool's name and its arguments (None: a malformed call, ``error`` says why)."""

    name: str
    arguments: dict[str, Any] | None
    id: str = ""
    error: str = ""


def tool_schema(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI-style function schema of a tool, named ``name`` (see the module docstring)."""
    given = getattr(fn, "tool_schema", None)
    if isinstance(given, dict):
        schema = given
    else:
        try:
            from transformers.utils import get_json_schema

            schema = get_json_schema(fn)
        except Exception:  # noqa: BLE001 - no Google-style docstring: the signature alone
            schema = _signature_schema(fn)
    function = {**schema.get("function", schema), "name": name}
    return {"type": "function", "function": function}


def _signature_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: every parameter a string
        hints = {}
    props, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("self", "cls"):
            continue
        hint = hints.get(p.name, str)
        props[p.name] = {"type": JSON_TYPES.get(typing.get_origin(hint) or hint, "string")}
        if p.default is p.empty:
            required.append(p.name)
    doc = inspect.getdoc(fn) or ""
    return {"name": getattr(fn, "__name__", "tool"), "description": doc.split("\n\n")[0].strip(),
            "parameters": {"type": "object", "properties": props, "required": required}}


def call_message(calls: list[ToolCall], content: str) -> dict[str, Any]:
    """The assistant message of a turn that made ``calls`` (OpenAI form, arguments as a dict)."""
    return {"role": "assistant", "content": content,
            "tool_calls": [{"type": "function", **({"id": c.id} if c.id else {}),
                            "function": {"name": c.name, "arguments": c.arguments or {}}} for c in calls]}


def tool_message(call: ToolCall, content: str) -> dict[str, Any]:
    return {"role": "tool", "name": call.name, "content": content, **({"tool_call_id": call.id} if call.id else {})}


class ChatTemplate:
    """The chat-template protocol of one tokenizer and one run's tools (see the module docstring); ``schemas``
    empty: an environment's episodes without tools (its replies go back as user messages)."""

    def __init__(self, tokenizer, schemas: list[dict[str, Any]], model: str = "the model"):
        self.tokenizer, self.schemas, self.model = tokenizer, schemas, model
        self.tools = schemas or None  # never tools=[]: some templates (Llama) render tool boilerplate for it
        self._parse = getattr(tokenizer, "response_template", None) is not None
        self.check()

    def check(self) -> None:
        """Refuse (one line) a template that cannot render tools, a tool call and a tool result (or, without
        tools, a user turn after the model's), or whose next turn does not extend the conversation token for
        token (results could not be appended to the model's own ids)."""
        tok, mark = self.tokenizer, "RESULT-7f3"
        why = ""
        if not getattr(tok, "chat_template", None):
            why = "it has no chat template"
        else:
            try:
                ask = [{"role": "user", "content": "q"}]
                bare = tok.apply_chat_template(ask, tokenize=False, add_generation_prompt=True)
                prompt = tok.apply_chat_template(ask, tools=self.tools, tokenize=False, add_generation_prompt=True)
                name = self.schemas[0]["function"]["name"] if self.schemas else ""
                if name and (prompt == bare or name not in prompt):
                    why = "its chat template does not render the tools into the prompt"
                elif mark not in tok.decode(self.next_ids(
                        [tool_message(ToolCall(name, {}), mark)] if name else [{"role": "user", "content": mark}],
                        [ToolCall(name, {})] if name else [], tok.eos_token_id)):
                    why = f"its chat template does not render a {'tool' if name else 'user'} message after the model's"
            except Exception as e:  # noqa: BLE001 - any template failure is the same refusal
                why = f"its chat template fails on a tool-calling conversation ({type(e).__name__}: {e})"
        if why:
            raise ConfigError(f"rollout.tools.protocol=chat: the tokenizer of {self.model} cannot carry tool calls: "
                              f"{why}; allowed: rollout.tools.protocol=text (the <tool>/<result> text protocol), or "
                              "a model whose chat template supports tools (user -> assistant tool_calls -> tool)")

    # ------------------------------------------------------------------------------------------ parsing
    def parse(self, ids: list[int], text: str, prompt_ids: list[int]) -> tuple[str, list[ToolCall]]:
        """(the turn's content without its calls, the calls) of one model turn; no tools: no calls."""
        if not self.schemas:
            return text, []
        if self._parse:
            return self._parse_template(ids, prompt_ids)
        blocks = _CALL.findall(text)
        if blocks:
            return _CALL.sub("", text).strip(), [_call(b) for b in blocks]
        stripped = text.strip()
        if stripped.startswith("{") and stripped.endswith("}"):
            call = _call(stripped)
            if not call.error:
                return "", [call]
        return text, []

    def _parse_template(self, ids: list[int], prompt_ids: list[int]) -> tuple[str, list[ToolCall]]:
        message = self.tokenizer.parse_response(ids, prefix=prompt_ids, tools=self.schemas)
        calls = []
        for c in message.get("tool_calls") or []:
            fn = c.get("function", c)
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    args = None
            calls.append(ToolCall(str(fn.get("name", "")), args if isinstance(args, dict) else None, c.get("id", ""),
                                  "" if isinstance(args, dict) else "malformed tool call (arguments are not a JSON "
                                  "object)"))
        return str(message.get("content") or ""), calls

    # ------------------------------------------------------------------------------------------ results
    def next_ids(self, messages: list[dict[str, Any]], calls: list[ToolCall], last_id: int | None) -> list[int]:
        """The ids after the model's turn (which made ``calls`` and ended with token ``last_id``): the template's
        rendering of ``messages`` (tool results, or an environment's user turn) and the next generation prompt."""
        tok = self.tokenizer
        said = call_message([ToolCall(c.name, {}, c.id) for c in calls[:1]], "") if calls else {
            "role": "assistant", "content": ""}
        dummy = [{"role": "user", "content": "dummy"}, said]
        prefix = tok.apply_chat_template(dummy, tools=self.tools, tokenize=True, return_dict=False)
        full = tok.apply_chat_template(dummy + messages, tools=self.tools, tokenize=True, add_generation_prompt=True,
                                       return_dict=False)
        ends = [i for i, t in enumerate(prefix) if t == last_id]
        if ends:  # the model's turn ended there: what the template writes after it belongs to the reply
            prefix = prefix[:ends[-1] + 1]
        if full[:len(prefix)] != prefix:
            raise ValueError("the chat template renders the conversation differently once the next messages "
                             "follow (not prefix-preserving)")
        return list(full[len(prefix):])


def _call(block: str) -> ToolCall:
    try:
        obj = json.loads(block.strip())
    except ValueError:
        return ToolCall("", None, error="malformed tool call (not JSON)")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", None, error="malformed tool call (no name)")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            args = None
    if not isinstance(args, dict):
        return ToolCall(obj["name"], None, str(obj.get("id", "")), "malformed tool call (arguments are not a JSON "
                        "object)")
    return ToolCall(obj["name"], args, str(obj.get("id", "")))
