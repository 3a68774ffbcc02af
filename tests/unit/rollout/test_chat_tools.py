"""Tool calls through the chat template (``rollout.tools.protocol: chat``): schemas in the prompt, the model's own
call format parsed, several tools per turn, results as ``tool`` messages whose tokens follow the model's exactly,
an environment's episodes replying through the same loop; bad calls, bad tools and bad environments counted."""

import math
import sys
import threading
import time
from importlib import resources
from pathlib import Path

import pytest
import torch
from support import Scripted, tool_tokenizer

from groupwise.config import ToolsConfig, load
from groupwise.isolation import CAN_FORK
from groupwise.loop.chat_tools import ChatTemplate, ToolCall, tool_schema
from groupwise.loop.setup import build
from groupwise.loop.tools import ToolLoop, schemas
from groupwise.models.tiny import build_tokenizer
from groupwise.registry import ConfigError
from groupwise.rollout.base import Request, SamplingParams, to_sample
from groupwise.types import Problem

TOK = tool_tokenizer()
PARAMS = SamplingParams(max_tokens=300, temperature=1.0)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term
        b: the second term
    """
    return a + b


def mul(a, b: int = 1):
    """Multiply.

    More text that is not the description."""
    return {"product": int(a) * b}


def enc(text):
    return TOK.encode(text, add_special_tokens=False)


def chat_loop(script, tools=None, episodes=None, **kw):
    tools = {"add": add, "mul": mul} if tools is None else tools
    cfg = ToolsConfig(protocol="chat", **{"turn_tokens": 200, **kw})  # a character tokenizer: long calls
    chat = ChatTemplate(TOK, [tool_schema(n, f) for n, f in tools.items()] if tools else [], "'test'")
    inner = Scripted(script, TOK)
    return ToolLoop(inner, tools, TOK, cfg, chat, episodes), inner


def test_schemas_from_docstrings_signatures_or_the_tool_itself():
    s = tool_schema("add", add)["function"]
    assert s["name"] == "add" and s["description"] == "Add two integers."
    assert s["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first term"}
    m = tool_schema("times", mul)["function"]  # no Args section: the signature, the first paragraph
    assert m["name"] == "times" and m["description"] == "Multiply."
    assert m["parameters"] == {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                               "required": ["a"]}

    def given(q):
        return q
    given.tool_schema = {"type": "function", "function": {"name": "x", "description": "d", "parameters": {}}}
    assert tool_schema("lookup", given) == {"type": "function", "function": {"name": "lookup", "description": "d",
                                                                            "parameters": {}}}


def test_the_template_must_carry_tools():
    with pytest.raises(ConfigError, match=r"^rollout.tools.protocol=chat: the tokenizer of 'embedded:lab-tiny' cannot "
                                          r"carry tool calls: its chat template does not render the tools"):
        ChatTemplate(build_tokenizer(), [tool_schema("add", add)], "'embedded:lab-tiny'")
    ChatTemplate(build_tokenizer(), [], "'embedded:lab-tiny'")  # no tools (an environment's replies): user turns do
    prompt = TOK.apply_chat_template([{"role": "user", "content": "2+3=?"}], tools=[tool_schema("add", add)],
                                     tokenize=False, add_generation_prompt=True)
    assert prompt == "tools: add\n2+3=?\n"
    with pytest.raises(ConfigError, match=r"rollout.tools.tools: task 'search' has no tool 'calc'; allowed: search"):
        build(load(None, ["model.warm_start=false", "task.name=search",
                          "rollout.tools={protocol: chat, tools: [calc]}"]))
    with pytest.raises(ConfigError, match=r"rollout.tools: tools=\['a'\]: the chat protocol's; allowed with "
                                          r"protocol=text: tool"):
        load(None, ["rollout.tools={tools: [a]}"])
    with pytest.raises(ConfigError, match=r"rollout.tools: tool='calc': the text protocol's"):
        load(None, ["rollout.tools={protocol: chat, tool: calc}"])


def test_parsing_calls_in_the_models_own_format():
    ct = ChatTemplate(TOK, [tool_schema("add", add)], "'test'")
    content, calls = ct.parse([], 'sum:<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
                                  '<tool_call>{"name": "mul", "parameters": {"a": 4}}</tool_call>', [])
    assert content == "sum:" and calls == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("mul", {"a": 4})]
    assert ct.parse([], '{"name": "add", "arguments": {"a": 1, "b": 1}}', [])[1] == [ToolCall("add", {"a": 1, "b": 1})]
    assert ct.parse([], "<answer>5</answer>", []) == ("<answer>5</answer>", [])
    (bad,) = ct.parse([], "<tool_call>{add(2, 3)}</tool_call>", [])[1]
    assert bad.error == "malformed tool call (not JSON)" and bad.arguments is None
    (bad,) = ct.parse([], '<tool_call>{"name": "add", "arguments": [2, 3]}</tool_call>', [])[1]
    assert bad.error.startswith("malformed tool call (arguments")


def test_several_calls_per_turn_results_as_tool_messages_with_exact_ids():
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' \
           '<tool_call>{"name": "mul", "arguments": {"a": 2, "b": 3}}</tool_call><eos>'
    tl, inner = chat_loop([call, "<answer>5</answer><eos>"])
    prompt = torch.tensor(enc("tools: add, mul\n2+3=?\n"))
    (c,) = tl.generate([Request(prompt)], PARAMS, torch.Generator())
    results = '\n<tool_response>5</tool_response>\n<tool_response>{"product": 6}</tool_response>\n'
    ids = enc(call) + enc(results) + enc("<answer>5</answer><eos>")
    assert c.completion_ids.tolist() == ids and c.finish_reason == "stop"
    n1, n2 = len(enc(call)), len(enc(results))
    assert c.forced.tolist() == [False] * n1 + [True] * n2 + [False] * (len(ids) - n1 - n2)
    assert all(math.isnan(v) for v in c.rollout_logprobs[n1:n1 + n2].tolist())
    # the second turn saw prompt + the model's own ids + the template's rendering of the results, token for token
    assert inner.requests[1][0].prompt_ids.tolist() == prompt.tolist() + ids[:n1 + n2]
    # and the tokens are the template's own rendering of the whole conversation
    conv = [{"role": "user", "content": "2+3=?"}, *c.meta["messages"]]
    whole = TOK.apply_chat_template(conv, tools=tl.chat.schemas, tokenize=False)
    assert whole == TOK.decode(prompt.tolist() + ids)
    assert c.meta["messages"] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            {"type": "function", "function": {"name": "mul", "arguments": {"a": 2, "b": 3}}}]},
        {"role": "tool", "name": "add", "content": "5"}, {"role": "tool", "name": "mul", "content": '{"product": 6}'},
        {"role": "assistant", "content": "<answer>5</answer>"}]
    assert {k: c.meta[k] for k in ("turns", "tool_calls", "tool_errors", "tool_timeouts", "tool_tokens")} == {
        "turns": 2, "tool_calls": 2, "tool_errors": 0, "tool_timeouts": 0, "tool_tokens": n2}
    s = to_sample(prompt, c, TOK)
    assert s.loss_mask.tolist() == [not f for f in c.forced.tolist()]


def test_bad_calls_bad_tools_and_a_hung_tool_are_answered_and_counted():
    def boom(a):
        raise RuntimeError("gone")
    release = threading.Event()
    script = ['<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>'
              '<tool_call>{"name": "boom", "arguments": {"a": 1}}</tool_call>'
              '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
              '<tool_call>{"name": "slow", "arguments": {}}</tool_call><eos>', "<answer>1</answer><eos>"]
    tl, _ = chat_loop(script, {"add": add, "boom": boom, "slow": lambda: release.wait(30) and "late"}, timeout_s=0.3,
                      turn_tokens=400)
    t0 = time.monotonic()
    (c,) = tl.generate([Request(torch.tensor(enc("q\n")))], SamplingParams(max_tokens=1000), torch.Generator())
    release.set()
    assert time.monotonic() - t0 < 5
    contents = [m["content"] for m in c.meta["messages"] if m["role"] == "tool"]
    assert contents == ["error: unknown tool 'nope'", "error: malformed tool call (not JSON)", "error: RuntimeError",
                        "error: TypeError", "timeout"]
    assert c.meta["tool_calls"] == 5 and c.meta["tool_errors"] == 4 and c.meta["tool_timeouts"] == 1
    assert c.finish_reason == "stop"


def test_results_are_cut_and_caps_end_episodes():
    tl, _ = chat_loop(['<tool_call>{"name": "big", "arguments": {}}</tool_call><eos>', "<answer>1</answer><eos>"],
                      {"big": lambda: "7" * 10_000_000}, result_tokens=12)
    (c,) = tl.generate([Request(torch.tensor(enc("q\n")))], PARAMS, torch.Generator())
    assert c.meta["messages"][1]["content"] == "7" * 12
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call><eos>'
    tl, _ = chat_loop([call] * 3, max_turns=3)
    (c,) = tl.generate([Request(torch.tensor(enc("q\n")))], PARAMS, torch.Generator())
    assert c.finish_reason == "turns" and c.meta["tool_calls"] == 2
    tl, _ = chat_loop([call, "<answer>2</answer><eos>"])
    (c,) = tl.generate([Request(torch.tensor(enc("q\n")))], SamplingParams(max_tokens=len(enc(call)) + 5),
                       torch.Generator())
    assert c.finish_reason == "length" and c.completion_ids.numel() == len(enc(call)) + 5


@pytest.mark.skipif(not CAN_FORK, reason="process isolation needs fork (Linux)")
def test_user_tools_run_in_forked_workers():
    import os

    def die(code: int):
        os._exit(code)
    tl, _ = chat_loop(['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'
                       '<tool_call>{"name": "die", "arguments": {"code": 3}}</tool_call><eos>',
                       "<answer>4</answer><eos>"], {"add": add, "die": die})
    assert tl.pool is not None
    (c,) = tl.generate([Request(torch.tensor(enc("q\n")))], PARAMS, torch.Generator())
    assert [m["content"] for m in c.meta["messages"] if m["role"] == "tool"] == ["4", "error: VerifierFailed"]
    tl.close()


class Env:
    """A scripted environment: asks `rounds` follow-ups, then ends; records what it was told."""

    def __init__(self, problem, rounds=1, fail=""):
        self.problem, self.rounds, self.fail, self.heard = problem, rounds, fail, []

    def respond(self, reply):
        if self.fail == "respond":
            raise ConnectionError("env server gone")
        if self.fail == "malformed":
            return "not messages"
        if self.fail == "hang":
            time.sleep(30)
        self.heard.append(reply)
        if len(self.heard) > self.rounds:
            return None
        return [{"role": "user", "content": f"again {len(self.heard)}"}]

    def close(self, text):
        self.text = text
        return {"env_rewards": [1.0] * len(self.heard)}


class Envs:
    def __init__(self, **kw):
        self.kw, self.opened = kw, []

    def open_episode(self, problem):
        if self.kw.get("fail") == "open":
            raise RuntimeError("reset refused")
        if self.kw.get("fail") == "own_timeout":  # the environment's own limit, passed before the loop's
            raise TimeoutError("no answer within 0.1s (task.timeout_s)")
        self.opened.append(Env(problem, **self.kw))
        return self.opened[-1]


def test_an_environment_replies_through_the_template_until_it_ends():
    envs = Envs(rounds=1)
    tl, inner = chat_loop(["first<eos>", "second<eos>", "third<eos>"], tools={}, episodes=envs)
    problem = Problem("p", "q", "a")
    (c,) = tl.generate([Request(torch.tensor(enc("q\n")), problem=problem)], PARAMS, torch.Generator())
    assert envs.opened[0].problem is problem and envs.opened[0].heard == ["first", "second"]
    assert TOK.decode(c.completion_ids.tolist()) == "first<eos>\nagain 1\nsecond<eos>"
    assert envs.opened[0].text == "first\nagain 1\nsecond" == to_sample(torch.tensor([1]), c, TOK).text
    assert c.meta["env_rewards"] == [1.0, 1.0] and c.meta["turns"] == 2 and c.finish_reason == "stop"
    assert [m["role"] for m in c.meta["messages"]] == ["assistant", "user", "assistant"]
    with pytest.raises(ValueError, match="need each request's problem"):
        tl.generate([Request(torch.tensor(enc("q\n")))], PARAMS, torch.Generator())


@pytest.mark.parametrize("fail", ["open", "respond", "hang", "own_timeout", "malformed"])
def test_a_failing_environment_ends_its_episode_counted(fail):
    tl, _ = chat_loop(["first<eos>", "second<eos>"], tools={}, episodes=Envs(fail=fail), timeout_s=0.3)
    t0 = time.monotonic()
    (c,) = tl.generate([Request(torch.tensor(enc("q\n")), problem=Problem("p", "q", "a"))], PARAMS, torch.Generator())
    assert time.monotonic() - t0 < 5 and c.finish_reason == "stop" and c.meta["turns"] == 1
    timed_out = fail in ("hang", "own_timeout")  # the loop's timeout_s, or the environment's own TimeoutError
    assert c.meta["tool_timeouts"] == timed_out and c.meta["tool_errors"] == (not timed_out)
    assert c.meta["env_error"] == {"open": "RuntimeError: reset refused", "respond": "ConnectionError: env server gone",
                                   "hang": "timeout",
                                   "own_timeout": "timeout: TimeoutError: no answer within 0.1s (task.timeout_s)",
                                   "malformed": "TypeError: respond returned 'not messages', not "
                                   "a list of messages"}[fail]


def test_real_templates_qwen_and_llama():
    """The templates TRL ships (its chat_templates/): Qwen 2.5's tool turn, Llama 3.1's JSON calls; Qwen 3's thinking
    template rewrites earlier turns, so it is refused (TRL swaps in its training template, as a user can)."""
    pytest.importorskip("trl")
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    templates = resources.files("trl") / "chat_templates"
    tok.chat_template = (templates / "qwen2_5.jinja").read_text()
    ct = ChatTemplate(tok, [tool_schema("add", add)], "'qwen2.5'")
    ids = ct.next_ids([{"role": "tool", "name": "add", "content": "5"}], [ToolCall("add", {"a": 2, "b": 3})],
                      tok.eos_token_id)
    assert tok.decode(ids) == ("\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
                               "<|im_start|>assistant\n")
    text = 'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert ct.parse([], text, []) == ("Adding.", [ToolCall("add", {"a": 2, "b": 3})])
    tok.chat_template = (templates / "qwen3.jinja").read_text()
    with pytest.raises(ConfigError, match="not prefix-preserving"):
        ChatTemplate(tok, [tool_schema("add", add)], "'qwen3'")
    tok.chat_template = (templates / "qwen3_training.jinja").read_text()
    ChatTemplate(tok, [tool_schema("add", add)], "'qwen3'")
    tok.chat_template = (templates / "llama3_1.jinja").read_text()
    ct = ChatTemplate(tok, [tool_schema("add", add)], "'llama3.1'")
    assert ct.parse([], '{"name": "add", "parameters": {"a": 2, "b": 3}}', [])[1] == [ToolCall("add", {"a": 2, "b": 3})]


def test_the_prompt_carries_the_schemas(tmp_path):
    from support import tool_model_dir

    path = tool_model_dir(tmp_path / "m")
    cfg = load(None, [f"model.path={path}", "task.name=search", "rollout.tools={protocol: chat}"])
    pipe = build(cfg)
    assert pipe.prompt_tools == schemas(cfg.rollout.tools, pipe.task)
    text = TOK.decode(pipe.encode(pipe.task.train[0]).tolist())
    assert text == f"tools: search\n{pipe.task.train[0].prompt}\n"
    assert isinstance(pipe.generator.inner, ToolLoop) and pipe.generator.inner.chat is not None


MCP_CALC = str(Path(__file__).parent / "mcp_calc.py")


def test_mcp_servers_tools_join_the_loop():
    pytest.importorskip("mcp")
    from groupwise.loop.mcp_tools import mcp_tools

    tools = mcp_tools({"calc": (sys.executable, MCP_CALC)}, 30.0)
    assert sorted(tools) == ["calc_add", "calc_fail"]
    schema = tool_schema("calc_add", tools["calc_add"])["function"]  # the schema the server advertises
    assert schema["description"] == "Add two integers." and schema["parameters"]["required"] == ["a", "b"]
    script = ['<tool_call>{"name": "calc_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
              '<tool_call>{"name": "calc_fail", "arguments": {"reason": "no"}}</tool_call><eos>',
              "<answer>5</answer><eos>"]
    tl, _ = chat_loop(script, tools)
    (c,) = tl.generate([Request(torch.tensor(enc("q\n")))], PARAMS, torch.Generator())
    assert [m["content"] for m in c.meta["messages"] if m["role"] == "tool"] == ["5", "error: RuntimeError"]
    assert c.meta["tool_errors"] == 1 and tl.pool is None  # groupwise's callables: threads; the server is a process
    with pytest.raises(ConfigError, match=r"^rollout.tools.mcp: server 'gone' \(/nonexistent/python x.py\) did not "
                                          r"start: FileNotFoundError"):
        mcp_tools({"gone": ("/nonexistent/python", "x.py")}, 5.0)
    with pytest.raises(ConfigError, match=r"rollout.tools: mcp: MCP tools go through the chat template"):
        load(None, ["rollout.tools={mcp: {calc: [python, calc.py]}}"])
    with pytest.raises(ConfigError, match=r"rollout.tools: mcp.my-calc: allowed a name that is an identifier"):
        load(None, ["rollout.tools={protocol: chat, mcp: {my-calc: [python, calc.py]}}"])


def test_without_the_mcp_package_one_line_names_the_extra(monkeypatch):
    from groupwise.loop.mcp_tools import mcp_tools

    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ConfigError, match=r"^rollout.tools.mcp needs the mcp package, which is not installed: "
                                          r"pip install 'groupwise\[mcp\]'$"):
        mcp_tools({"other": ("python",)}, 5.0)
