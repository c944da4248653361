"""Where a model turn ends, how its tool calls are read, and how their results become tokens.

Two formats (`rollout.tool_format`):

    chat   the chat template's own: the turn ends at EOS (e.g. Qwen's <|im_end|>, Llama's <|eot_id|>,
           GPT-OSS's <|call|>); its calls are read by the tokenizer's `response_template` when it has one
           (transformers' `parse_response`, as TRL), else by grpokit's parser for the template's family
           (`grpokit.agents.tool_parsers`: Hermes / Qwen3 JSON blocks, Qwen3.5 / Coder XML, GLM-4, Llama 3.1
           bare JSON, GPT-OSS harmony, Gemma 4, LFM2); a template of no known family without a
           `response_template` is refused. The results are the template's rendering of `tool` messages
           after an assistant turn that called (what follows that turn's EOS), tokenized alone.
    plain  for models without a tool template (text prompts): the turn ends right after
           </tool_call>, whose body is either the JSON above or a Python-style call with literal
           arguments, e.g.  <tool_call>multiply(123, 4567)</tool_call>  (positional arguments bind to
           the tool's parameters in order); the result follows as text,
           <tool_response>561741</tool_response>, and the model goes on in the same turn; EOS ends the
           trajectory.

A call that cannot be read (bad JSON, not a call, non-literal arguments) still gets a result: the error,
so the model learns from it, and it is counted (`ToolCall.error`).
"""

from __future__ import annotations

import ast
import json
from typing import Any

import torch
from jinja2 import TemplateError

from grpokit.agents.tool_parsers import FAMILIES, PARSERS, family_of, json_call, requests_of
from grpokit.agents.tools import CallRequest, Tool
from grpokit.errors import ConfigError
from grpokit.rollout.trajectory import ToolCall

# A minimal ChatML template with Hermes-style tool calls (`<tool_call>{json}</tool_call>`, results as
# `<tool_response>` user turns), prefix-preserving: for small models built offline (tests, benchmarks).
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def parse_call(body: str) -> tuple[str, tuple, dict[str, Any]]:
    """One call's body: JSON {"name", "arguments"} or a Python-style call name(args, key=value).

    Raises:
        ValueError: neither (the message says why).
    """
    body = body.strip()
    if body.startswith("{"):
        call = json_call(body)
        if call.error is not None:
            raise ValueError(call.error)
        return call.name, (), call.arguments
    try:
        node = ast.parse(body, mode="eval").body
    except SyntaxError:
        raise ValueError("the call is neither JSON nor name(arguments)") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError("the call is neither JSON nor name(arguments)")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except ValueError:
        raise ValueError("call arguments must be literals (numbers, strings, lists, ...)") from None
    return node.func.id, args, kwargs


def requests_for(bodies: list[str], tools: dict[str, Tool]) -> list[CallRequest]:
    """Call bodies as requests to `tools` (an unreadable body or unknown name: a request with its error)."""
    out = []
    for body in bodies:
        try:
            name, args, kwargs = parse_call(body)
        except ValueError as e:
            out.append(CallRequest(None, (), {}, name="", error=str(e)))
            continue
        out.append(CallRequest(tools.get(name), args, kwargs, name=name))
    return out


def _message(content: str, requests: list[CallRequest]) -> dict[str, Any]:
    calls = [{"type": "function", "function": {"name": r.name, "arguments": dict(r.kwargs)}}
             for r in requests if r.error is None]
    return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


def _vocab_with(tokenizer, char: str) -> list[int]:
    """Ids whose token text contains `char` (a cheap pre-filter for a marker's last character)."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return [i for i, p in enumerate(pieces) if p is not None and char in p]


class PlainFormat:
    """<tool_call>...</tool_call> in plain text; results as <tool_response>...</tool_response>."""

    name = "plain"
    prefix_preserving = True   # nothing is ever re-rendered

    def __init__(self, tokenizer, eos_ids: list[int]) -> None:
        self.tokenizer, self.eos_ids = tokenizer, set(eos_ids)
        self.stop_ids = torch.tensor(sorted(self.eos_ids | set(_vocab_with(tokenizer, CALL_CLOSE[-1]))))

    def turn_ended(self, turn: list[int]) -> bool:
        """At EOS, or at the token that completes </tool_call> (a BPE token may carry text past it, as
        SmolLM2's '><': that overhang stays the model's, see `render`)."""
        if turn[-1] in self.eos_ids:
            return True
        return CALL_CLOSE in self.tokenizer.decode(turn[-24:], skip_special_tokens=False)

    def parse(self, turn: list[int], prefix: list[int], tools: dict[str, Tool]):
        """(the turn as a chat message, its call requests: none when it ended at EOS)."""
        text = self.tokenizer.decode(turn, skip_special_tokens=True)
        if turn[-1] in self.eos_ids:
            return {"role": "assistant", "content": text}, []
        full = self.tokenizer.decode(turn, skip_special_tokens=False)
        if CALL_OPEN in full:
            body = full[full.rfind(CALL_OPEN) + len(CALL_OPEN):full.rfind(CALL_CLOSE)]
            requests = requests_for([body], tools)
        else:
            requests = [CallRequest(None, (), {}, error=f"{CALL_CLOSE} without {CALL_OPEN}")]
        return _message(text, requests), requests

    def render(self, calls: list[ToolCall], turn: list[int] | None = None) -> list[int]:
        """The results' tokens. When the turn's last token ran past </tool_call> into the start of
        <tool_response> (e.g. '><'), that start is not inserted again: the text reads as one result."""
        text = "".join(f"{RESPONSE_OPEN}{c.result}{RESPONSE_CLOSE}" for c in calls)
        if turn:
            tail = self.tokenizer.decode(turn[-24:], skip_special_tokens=False)
            overhang = tail[tail.rfind(CALL_CLOSE) + len(CALL_CLOSE):] if CALL_CLOSE in tail else ""
            if overhang and text.startswith(overhang):
                text = text[len(overhang):]
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


class ChatFormat:
    """The chat template's tool turns: calls read by the tokenizer's response_template or the template
    family's parser (`grpokit.agents.tool_parsers`), results rendered as the template's `tool` messages.

    Raises:
        ConfigError: the template's calls cannot be read (no known family, no response_template), or its tool
            results cannot be cut cleanly after an assistant's EOS.
    """

    name = "chat"

    def __init__(self, tokenizer, eos_ids: list[int], chat_template_kwargs: dict | None = None) -> None:
        self.tokenizer, self.eos_ids = tokenizer, set(eos_ids)
        self.kwargs = dict(chat_template_kwargs or {})
        self.stop_ids = torch.tensor(sorted(self.eos_ids))
        self.eos_texts = sorted({t for t in (tokenizer.decode([i]) for i in self.eos_ids) if t})
        self.family = family_of(getattr(tokenizer, "chat_template", None))
        if getattr(tokenizer, "response_template", None) is None and self.family is None:
            raise ConfigError("rollout.tool_format=chat: grpokit cannot read this chat template's tool calls "
                              f"(it parses the {', '.join(FAMILIES)} families): set "
                              "tokenizer.response_template (transformers' response parsing; TRL's "
                              "add_response_schema sets one for the templates it knows), or use "
                              "rollout.tool_format=plain")
        probe = self._results_text([ToolCall("name_7f3a", {}, "result_7f3a")])
        if "result_7f3a" not in probe:
            raise ConfigError(f"rollout.tool_format=chat: the template's tool results after an assistant's "
                              f"EOS ({probe!r}) do not hold the result: use rollout.tool_format=plain")
        self.prefix_preserving = template_is_prefix_preserving(tokenizer, self.kwargs)

    def turn_ended(self, turn: list[int]) -> bool:
        return turn[-1] in self.eos_ids

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=generation_prompt, **self.kwargs)

    def parse(self, turn: list[int], prefix: list[int], tools: dict[str, Tool]):
        """(the turn as a chat message, its call requests: none when it made no call)."""
        tok = self.tokenizer
        if getattr(tok, "response_template", None) is not None:   # the template's own parser, as TRL
            parsed = _parse_response(tok, turn, prefix, [t.schema for t in tools.values()])
            requests = [CallRequest(tools.get(c["function"]["name"]), (), _arguments(c["function"]),
                                    name=c["function"]["name"]) for c in parsed.get("tool_calls") or []]
            return _message(parsed.get("content") or "", requests), requests
        text = tok.decode([i for i in turn if i not in self.eos_ids], skip_special_tokens=False)
        content, calls = PARSERS[self.family](text)
        requests = requests_of(calls, tools)
        return _message(content, requests), requests

    def render(self, calls: list[ToolCall], turn: list[int] | None = None) -> list[int]:
        """The template's tool messages after an assistant turn that called (tokens after its EOS)."""
        return self.tokenizer(self._results_text(calls), add_special_tokens=False)["input_ids"]

    def _results_text(self, calls: list[ToolCall]) -> str:
        """The text that follows an assistant turn's EOS when `calls`' results come next, up to the next
        assistant turn (its generation prompt).

        One rendering, `after` = [user, assistant calling, tool results] + generation prompt, is cut after the
        first EOS that follows the user's message: the assistant turn's own. The cut lies within that one
        string, so a template that renders the last assistant turn differently from an earlier one (Qwen3's
        empty <think></think> on the last only) cannot shift it.

        Raises:
            ConfigError: no EOS ends the assistant turn in the rendering.
        """
        user = [{"role": "user", "content": "x"}]
        results = [{"role": "tool", "name": c.name, "content": c.result} for c in calls]
        names = [c.name or "tool" for c in calls]
        after, error = None, None
        for named in (names, names[:1]):   # Llama 3.1 and GPT-OSS render one call per assistant turn
            assistant = {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": n, "arguments": {}}} for n in named]}
            try:
                after = self._render(user + [assistant] + results, True)
                break
            except TemplateError as e:
                error = e
        if after is None:
            raise ConfigError(f"rollout.tool_format=chat: the chat template cannot render a tool call and "
                              f"its result ({error}): use rollout.tool_format=plain")
        head = self._render(user, False)
        start = next((i for i, (a, b) in enumerate(zip(head, after)) if a != b), min(len(head), len(after)))
        ends = [after.find(e, start) + len(e) for e in self.eos_texts if after.find(e, start) >= 0]
        cut = min(ends, default=-1)
        if cut < 0 or names[0] not in after[start:cut]:
            eos = ", ".join(map(repr, self.eos_texts))
            raise ConfigError(f"rollout.tool_format=chat: in the chat template's rendering {after[start:]!r} "
                              f"no EOS ({eos}) ends the assistant's tool call: set the model's "
                              "generation_config.eos_token_id to the ids that end a tool-calling turn, or "
                              "use rollout.tool_format=plain")
        return after[cut:]


def _arguments(function: dict[str, Any]) -> dict[str, Any]:
    args = function.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return {}
    return args if isinstance(args, dict) else {}


def _parse_response(tok, turn: list[int], prefix: list[int], schemas: list[dict]) -> dict[str, Any]:
    """transformers' `parse_response` (newer versions take the prompt and the tools); a turn it cannot read
    is plain content, as in TRL."""
    try:
        try:
            parsed = tok.parse_response(turn, prefix=prefix, tools=schemas or None)
        except TypeError:   # an older transformers: no prefix / tools keywords
            parsed = tok.parse_response(turn)
        if not isinstance(parsed, dict):
            raise ValueError("no message")
        parsed["tool_calls"] = [_named_call(c) for c in parsed.get("tool_calls") or []]
        return parsed
    except (ValueError, TypeError, KeyError, AttributeError):
        return {"role": "assistant", "content": tok.decode(turn, skip_special_tokens=True)}


def _named_call(call: Any) -> dict[str, Any]:
    """A parsed call as {"type": "function", "function": {"name": str, "arguments": ...}}; a call without a
    name is not a call (ValueError: the turn is read as plain content, as TRL does)."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError("a tool call without a name")
    return {"type": "function", "function": {**function, "arguments": function.get("arguments") or {}}}


def template_is_prefix_preserving(tokenizer, kwargs: dict | None = None) -> bool:
    """Whether rendering a conversation's turns 1..k is a prefix of rendering turns 1..k+1 (a probe with two
    tool-calling assistant turns, each with reasoning). A template that drops earlier reasoning is not."""
    call = [{"type": "function", "function": {"name": "probe", "arguments": {"x": 1}}}]
    first = [{"role": "user", "content": "q"},
             {"role": "assistant", "content": "one", "reasoning_content": "thought one", "tool_calls": call},
             {"role": "tool", "name": "probe", "content": "r1"}]
    second = first + [{"role": "assistant", "content": "two", "reasoning_content": "thought two",
                       "tool_calls": call}, {"role": "tool", "name": "probe", "content": "r2"}]
    kw = dict(kwargs or {})
    try:
        a = tokenizer.apply_chat_template(first, tokenize=False, add_generation_prompt=True, **kw)
        b = tokenizer.apply_chat_template(second, tokenize=False, add_generation_prompt=True, **kw)
    except TemplateError:   # GPT-OSS refuses content and reasoning together in a tool-calling turn
        for m in first[1:2] + second[3:4]:
            m["content"] = ""
        a = tokenizer.apply_chat_template(first, tokenize=False, add_generation_prompt=True, **kw)
        b = tokenizer.apply_chat_template(second, tokenize=False, add_generation_prompt=True, **kw)
    return b.startswith(a)


def supports_tool_messages(tokenizer, kwargs: dict | None = None) -> bool:
    """Whether the chat template renders an assistant's tool call and the tool's result at all."""
    call = [{"type": "function", "function": {"name": "name_7f3a", "arguments": {"arg_7f3a": 1}}}]
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": call},
                {"role": "tool", "name": "name_7f3a", "content": "result_7f3a"}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, **dict(kwargs or {}))
    except Exception:   # jinja raises TemplateError / UndefinedError / TypeError on unsupported roles
        return False
    return all(s in text for s in ("name_7f3a", "arg_7f3a", "result_7f3a"))
