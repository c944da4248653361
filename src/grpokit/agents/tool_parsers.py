"""Reading a model turn's tool calls, one parser per chat-template family (`rollout.tool_format=chat`).

A model writes its calls the way its chat template renders an assistant's `tool_calls`, and that differs by
family. The family is recognised from the template's text (`family_of`), as TRL's `add_response_schema`
recognises a template, but by the markup it renders rather than by an exact copy of the text:

    hermes   Qwen2.5, Qwen3, Qwen3-2507, Qwen3-VL   <tool_call>{"name": N, "arguments": {...}}</tool_call>
    xml      Qwen3.5/3.6/3.8, Qwen3-Coder, Nemotron 3
             <tool_call><function=N><parameter=K>V</parameter>...</function></tool_call>
    glm4     GLM-4.5 / GLM-4-MoE
             <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
    llama3   Llama 3.1 / 3.2            the turn is bare JSON: {"name": N, "parameters": {...}}
    harmony  GPT-OSS                    ...to=functions.N ... <|message|>{...}<|call|>
    gemma4   Gemma 4                    <|tool_call>call:N{k:<|"|>text<|"|>,n:3}<tool_call|>
    lfm2     LFM2 (v2), LFM2.5          <|tool_call_start|>[N(k='v', n=3), M()]<|tool_call_end|>

A template of none of these has no parser here (`family_of` gives None): `ChatFormat` then needs the
tokenizer's `response_template` (transformers' `parse_response`) and refuses to start without one.

Every parser takes the turn's text (special tokens kept, EOS dropped) and gives (content, calls). A call it
cannot read is a `RawCall` with `error` set: the model gets that error as the tool's result. XML-style
values (xml, glm4) are the template's text: `typed_arguments` reads them by the tool's JSON schema.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from grpokit.agents.tools import CallRequest, Tool

FAMILIES = ("gemma4", "harmony", "glm4", "xml", "lfm2", "hermes", "llama3")

# (family, markers its template's text holds: all of them), checked in this order: an XML or GLM template
# also writes <tool_call>, so those come before Hermes.
_DETECT = (("gemma4", ("<|tool_call>call:",)), ("harmony", ("<|call|>", "to=")),
           ("glm4", ("<arg_key>", "<tool_call>")), ("xml", ("<function=", "<parameter=")),
           ("lfm2", ("<|tool_call_start|>",)), ("hermes", ("<tool_call>",)),
           ("llama3", ('"parameters": ', '{"name": ', "<|start_header_id|>")))


@dataclass
class RawCall:
    """A call as written: its name, its arguments, or why it cannot be read."""

    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    as_text: bool = False          # the values are template text (XML tags): read by the tool's schema
    error: str | None = None       # set: the call is not run, the model reads this error


def family_of(chat_template: str | dict | None) -> str | None:
    """The tool-call family of a chat template's text (one of FAMILIES), or None when none fits."""
    if isinstance(chat_template, dict):   # named templates: any of them may render the tool turns
        chat_template = "\n".join(str(t) for t in chat_template.values())
    text = chat_template or ""
    return next((name for name, markers in _DETECT if all(m in text for m in markers)), None)


def json_call(body: str) -> RawCall:
    """One JSON call {"name": ..., "arguments" (or "parameters"): {...}}; arguments may be a JSON string."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return RawCall(error=f"the call is not valid JSON ({e.msg})")
    return _call_object(obj)


def _call_object(obj: Any) -> RawCall:
    args = obj.get("arguments", obj.get("parameters", {})) if isinstance(obj, dict) else None
    if isinstance(args, str):   # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(args, dict):
        return RawCall(error='a JSON call needs {"name": "...", "arguments": {...}}')
    return RawCall(obj["name"], args)


def _blocks(text: str, open_: str, close: str) -> tuple[str, list[str], bool]:
    """(text outside the blocks, the blocks' bodies, whether an opened block was never closed)."""
    pattern = re.compile(re.escape(open_) + r"(.*?)" + re.escape(close), re.DOTALL)
    bodies = pattern.findall(text)
    rest = pattern.sub("", text)
    unclosed = open_ in rest
    return (rest[:rest.find(open_)] if unclosed else rest).strip(), bodies, unclosed


def _marked(text: str, open_: str, close: str, read) -> tuple[str, list[RawCall]]:
    content, bodies, unclosed = _blocks(text, open_, close)
    calls = [read(b) for b in bodies]
    if unclosed:
        calls.append(RawCall(error=f"a {open_} without {close}"))
    return content, calls


def parse_hermes(text: str) -> tuple[str, list[RawCall]]:
    """<tool_call>{json}</tool_call> blocks (Qwen2.5 / Qwen3 / Hermes)."""
    return _marked(text, "<tool_call>", "</tool_call>", lambda b: json_call(b.strip()))


_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)(?:</function>\s*)?$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _xml_call(body: str) -> RawCall:
    m = _FUNCTION.match(body)
    if m is None:
        return RawCall(error="a <tool_call> needs <function=NAME> ... </function> inside")
    return RawCall(m.group(1).strip(), dict(_PARAMETER.findall(m.group(2))), as_text=True)


def parse_xml(text: str) -> tuple[str, list[RawCall]]:
    """<tool_call><function=N><parameter=K>V</parameter></function></tool_call> (Qwen3.5...)."""
    return _marked(text, "<tool_call>", "</tool_call>", _xml_call)


_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _glm_call(body: str) -> RawCall:
    name = body.split("<arg_key>", 1)[0].strip()
    if not name or any(c.isspace() for c in name):
        return RawCall(error="a <tool_call> needs the tool's name first, then <arg_key>/<arg_value> pairs")
    return RawCall(name, {k.strip(): v for k, v in _ARG.findall(body)}, as_text=True)


def parse_glm4(text: str) -> tuple[str, list[RawCall]]:
    """<tool_call>NAME <arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call> (GLM-4.5 / 4-MoE)."""
    return _marked(text, "<tool_call>", "</tool_call>", _glm_call)


def parse_llama3(text: str) -> tuple[str, list[RawCall]]:
    """A turn that is bare JSON {"name", "parameters"} (Llama 3.1 / 3.2); several may follow one another,
    separated by whitespace or ';'. A turn not starting with '{' is plain content."""
    s = text.strip().removeprefix("<|python_tag|>").strip()
    if not s.startswith("{"):
        return text.strip(), []
    decoder, calls, i = json.JSONDecoder(), [], 0
    while i < len(s):
        try:
            obj, i = decoder.raw_decode(s, i)
        except json.JSONDecodeError as e:
            return "", [*calls, RawCall(error=f"the call is not valid JSON ({e.msg})")]
        calls.append(_call_object(obj))
        while i < len(s) and (s[i].isspace() or s[i] == ";"):
            i += 1
    return "", calls


_HARMONY_CALL = re.compile(r"to=functions\.([^\s<]+)((?:(?!<\|message\|>).)*)<\|message\|>"
                           r"(.*?)(?:<\|call\|>|$)", re.DOTALL)
_HARMONY_FINAL = re.compile(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|return\|>|<\|end\|>|$)", re.DOTALL)


def parse_harmony(text: str) -> tuple[str, list[RawCall]]:
    """GPT-OSS (harmony): a call is `to=functions.NAME` in a message header (before or after its channel),
    the arguments JSON its body, up to <|call|>; the content is the final channel's text."""
    calls = []
    for name, _, body in _HARMONY_CALL.findall(text):
        try:
            args = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(RawCall(name, error=f"the arguments are not valid JSON ({e.msg})"))
            continue
        calls.append(RawCall(name, args) if isinstance(args, dict)
                     else RawCall(name, error="the arguments must be a JSON object"))
    final = _HARMONY_FINAL.search(text)
    if final is None:   # no final channel: a turn without calls says what its last message says
        last = text.rsplit("<|message|>", 1)[-1]
        return ("" if calls else re.sub(r"<\|[a-z_]+\|>", "", last).strip()), calls
    return final.group(1).strip(), calls


_GEMMA_STRING = '<|"|>'
_GEMMA_KEY = re.compile(r"([{,]\s*)([A-Za-z_][\w.-]*)(\s*:)")


def gemma_arguments(text: str) -> Any:
    """Gemma 4's argument syntax as a value: JSON with bare keys and <|"|>-delimited strings.

    Raises:
        ValueError: not that syntax (the message says why).
    """
    parts = text.split(_GEMMA_STRING)
    if len(parts) % 2 == 0:
        raise ValueError(f"a {_GEMMA_STRING} string is not closed")
    pieces = [json.dumps(p) if i % 2 else _GEMMA_KEY.sub(r'\1"\2"\3', p) for i, p in enumerate(parts)]
    try:
        return json.loads("".join(pieces))
    except json.JSONDecodeError as e:
        raise ValueError(f"the arguments are not readable ({e.msg})") from None


def _gemma_call(body: str) -> RawCall:
    m = re.match(r"^call:(\w[\w.-]*)(.*)$", body.strip(), re.DOTALL)
    if m is None:
        return RawCall(error="a <|tool_call> needs call:NAME{arguments}")
    try:
        args = gemma_arguments(m.group(2)) if m.group(2).strip() else {}
    except ValueError as e:
        return RawCall(m.group(1), error=str(e))
    return RawCall(m.group(1), args) if isinstance(args, dict) else RawCall(
        m.group(1), error="the arguments must be {key: value, ...}")


def parse_gemma4(text: str) -> tuple[str, list[RawCall]]:
    """<|tool_call>call:NAME{...}<tool_call|> blocks (Gemma 4); reasoning <|channel>...<channel|> dropped."""
    text = re.sub(r"<\|channel>.*?<channel\|>", "", text, flags=re.DOTALL)
    return _marked(text, "<|tool_call>", "<tool_call|>", _gemma_call)


_PY_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _PY_NAMES:   # a JSON mapping's true / false / null
        return _PY_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _lfm2_calls(body: str) -> list[RawCall]:
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except SyntaxError:
        return [RawCall(error="the calls must read [name(key=value, ...), ...]")]
    out = []
    for node in tree.elts if isinstance(tree, ast.List) else [tree]:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            out.append(RawCall(error="each call must read name(key=value, ...)"))
            continue
        try:
            out.append(RawCall(node.func.id, {k.arg: _literal(k.value) for k in node.keywords}))
        except ValueError:
            out.append(RawCall(node.func.id, error="call arguments must be literals"))
    return out


def parse_lfm2(text: str) -> tuple[str, list[RawCall]]:
    """<|tool_call_start|>[name(k=v, ...), ...]<|tool_call_end|> (LFM2 v2, LFM2.5): Python-style calls."""
    content, groups = _marked(text, "<|tool_call_start|>", "<|tool_call_end|>", lambda b: b)
    calls = [c for g in groups for c in (_lfm2_calls(g) if isinstance(g, str) else [g])]
    return content, calls


PARSERS = {"hermes": parse_hermes, "xml": parse_xml, "glm4": parse_glm4, "llama3": parse_llama3,
           "harmony": parse_harmony, "gemma4": parse_gemma4, "lfm2": parse_lfm2}


def _typed(value: str, schema: dict[str, Any]) -> Any:
    """A value written as text, read as its parameter's type says (a string stays text; anything else is
    JSON when it parses, else the text)."""
    if schema.get("type") == "string":
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def typed_arguments(call: RawCall, tool: Tool | None) -> dict[str, Any]:
    """The call's arguments; XML-style text values read by the tool's parameter schema."""
    if not call.as_text:
        return dict(call.arguments)
    properties = (tool.schema["function"].get("parameters", {}).get("properties", {}) if tool else {})
    return {k: _typed(v, properties.get(k, {})) for k, v in call.arguments.items()}


def requests_of(calls: list[RawCall], tools: dict[str, Tool]) -> list[CallRequest]:
    """Parsed calls as requests to `tools` (an unreadable call: a request with its error)."""
    out = []
    for c in calls:
        if c.error is not None:
            out.append(CallRequest(None, (), {}, name=c.name, error=c.error))
            continue
        tool = tools.get(c.name)
        out.append(CallRequest(tool, (), typed_arguments(c, tool), name=c.name))
    return out
