"""Tools: a Python function the model may call, its JSON schema, and running a batch of calls.

    tool = as_tool(multiply)          # schema from the type hints and the Google-style docstring
    calls = run_calls([CallRequest(tool, (), {"a": 3, "b": 4})], timeout=10.0, max_chars=2000)

A tool is a plain or ``async def`` function (or an environment's bound method); its schema is
transformers' `get_json_schema` (the same TRL uses), so the docstring must describe every argument.
`run_calls` runs every call of one decode step at once: ``async def`` tools on one event loop, plain
ones in worker threads (so a timeout can be enforced; they must be thread-safe, or be written async),
each under `asyncio.wait_for(timeout)`. Nothing a tool does stops the run: an exception, a timeout, a
call that cannot be bound to the signature, or a result that is not text becomes the model's tool
result as ``{"error": "..."}`` and is counted (`ToolCall.error`). A sync tool that times out cannot be
killed: its thread is abandoned (it finishes, or not, in the background).

Results: a str is given as is; int, float and bool as str(); a dict or list as JSON; anything else
(None, objects) is an error. Text longer than `max_chars` is cut (`ToolCall.truncated`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers.utils import get_json_schema

from grpokit.errors import ConfigError
from grpokit.rollout.trajectory import ToolCall

TRUNCATION_MARK = " ...[truncated]"


@dataclass
class Tool:
    """A callable the model may call by name."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]           # {"type": "function", "function": {name, description, parameters}}
    is_async: bool

    @property
    def parameters(self) -> list[str]:
        """Argument names in signature order (positional arguments of a plain-format call bind to these)."""
        return list(self.schema["function"].get("parameters", {}).get("properties", {}))


def as_tool(fn: Callable[..., Any]) -> Tool:
    """A function (or bound method) as a `Tool`; its schema from type hints and docstring.

    Raises:
        ConfigError: not callable, or transformers cannot build its schema (no docstring, an argument
            without a type hint or description).
    """
    if isinstance(fn, Tool):
        return fn
    if not callable(fn):
        raise ConfigError(f"tool {fn!r:.60} is not callable: give a function with type hints and a docstring")
    try:
        schema = get_json_schema(fn)
    except Exception as e:   # transformers raises several kinds (TypeHintParsingException, ...)
        name = getattr(fn, "__name__", repr(fn))
        raise ConfigError(f"tool '{name}' has no usable schema ({' '.join(str(e).split())[:160]}): give it "
                          "type hints and a Google-style docstring with an Args: line per argument") from None
    return Tool(schema["function"]["name"], fn, schema, inspect.iscoroutinefunction(fn))


def schema_of(tool: Any) -> dict[str, Any]:
    """The JSON schema a prompt shows for `tool`: a function's (as `as_tool`), or a dict given as a schema
    ({"type": "function", "function": {...}}, or the bare {"name", "description", "parameters"}).

    Raises:
        ConfigError: a dict without a name, or something neither callable nor a dict.
    """
    if isinstance(tool, dict):
        body = tool.get("function", tool) if tool.get("type", "function") == "function" else None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise ConfigError(f"tool schema {str(tool)[:60]} has no function name: give "
                              "{'type': 'function', 'function': {'name': ..., 'parameters': ...}}")
        return {"type": "function", "function": body}
    return as_tool(tool).schema


@dataclass
class CallRequest:
    """One call to run: the tool (None when the model named no known tool) and its arguments."""

    tool: Tool | None
    args: tuple
    kwargs: dict[str, Any]
    name: str = ""                   # what the model wrote as the tool's name
    error: str | None = None         # set: do not run, give the model this error (unparsable call, ...)


def error_text(message: str) -> str:
    """What the model reads for a failed call."""
    return json.dumps({"error": message})


def as_result_text(out: Any) -> tuple[str | None, str | None]:
    """A tool's return value as (text, None), or (None, why it is not text)."""
    if isinstance(out, str):
        return out, None
    if isinstance(out, (bool, int, float)):
        return str(out), None
    if isinstance(out, (dict, list)):
        try:
            return json.dumps(out), None
        except (TypeError, ValueError):
            pass
    return None, f"the tool returned {type(out).__name__}, not text"


def _bind(req: CallRequest) -> tuple[dict[str, Any], str | None]:
    """The call's arguments by name, or why they do not fit the tool's signature."""
    try:
        bound = inspect.signature(req.tool.function).bind(*req.args, **req.kwargs)
    except TypeError as e:
        return dict(req.kwargs), f"bad arguments for {req.tool.name}: {e}"
    return dict(bound.arguments), None


async def _run_one(req: CallRequest, timeout: float, max_chars: int,
                   pool: concurrent.futures.Executor) -> ToolCall:
    name = req.tool.name if req.tool is not None else req.name
    if req.error is not None or req.tool is None:
        why = req.error or f"no tool named '{req.name}'"
        return ToolCall(name, dict(req.kwargs), error_text(why), error=why)
    arguments, why = _bind(req)
    if why is not None:
        return ToolCall(name, arguments, error_text(why), error=why)
    fn = functools.partial(req.tool.function, *req.args, **req.kwargs)
    start, timed_out = time.perf_counter(), False
    try:
        if req.tool.is_async:
            out = await asyncio.wait_for(fn(), timeout)
        else:
            out = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(pool, fn), timeout)
        text, why = as_result_text(out)
    except asyncio.TimeoutError:
        text, why, timed_out = None, f"{name} timed out after {timeout:g} s", True
    except Exception as e:   # a tool's failure is the model's feedback, never the run's end
        text, why = None, f"{type(e).__name__}: {e}"
    latency = time.perf_counter() - start
    if why is not None:
        return ToolCall(name, arguments, error_text(why), error=why, timed_out=timed_out, latency_s=latency)
    cut = bool(max_chars) and len(text) > max_chars
    if cut:
        text = text[:max_chars] + TRUNCATION_MARK
    return ToolCall(name, arguments, text, truncated=cut, latency_s=latency)


def run_calls(requests: list[CallRequest], timeout: float, max_chars: int) -> list[ToolCall]:
    """Run every request concurrently (async on one loop, sync in threads), each within `timeout` seconds;
    the records in request order."""
    if not requests:
        return []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(requests)),
                                                 thread_name_prefix="grpokit-tool")

    async def gather() -> list[ToolCall]:
        return list(await asyncio.gather(*(_run_one(r, timeout, max_chars, pool) for r in requests)))

    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(gather())
        with concurrent.futures.ThreadPoolExecutor(1) as outer:   # called inside a running loop (notebooks)
            return outer.submit(asyncio.run, gather()).result()
    finally:
        pool.shutdown(wait=False)   # a timed-out sync tool's thread is left to finish on its own
