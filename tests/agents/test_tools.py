"""Tools: schemas, call parsing, failures that become the model's feedback, timeouts, concurrency."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import torch
from agent_models import PROMPTS, plain_caller

from grpokit.agents.agent import Agent
from grpokit.agents.formats import parse_call
from grpokit.agents.tools import CallRequest, as_tool, run_calls
from grpokit.config.schema import ConfigError, build_config
from grpokit.observe.agent_metrics import trajectory_stats
from grpokit.tasks.base import Example


def add(a: int, b: int = 1) -> int:
    """Add.

    Args:
        a: First.
        b: Second.
    """
    return a + b


def test_schema_comes_from_type_hints_and_docstring():
    tool = as_tool(add)
    assert tool.name == "add" and tool.parameters == ["a", "b"] and not tool.is_async
    properties = tool.schema["function"]["parameters"]["properties"]
    assert properties["a"] == {"type": "integer", "description": "First."}

    def bare(x):
        return x
    with pytest.raises(ConfigError, match="tool 'bare' has no usable schema"):
        as_tool(bare)


@pytest.mark.parametrize("body,want", [
    ('{"name": "add", "arguments": {"a": 2, "b": 3}}', ("add", (), {"a": 2, "b": 3})),
    ('{"name": "add", "arguments": "{\\"a\\": 2}"}', ("add", (), {"a": 2})),
    ("add(2, b=3)", ("add", (2,), {"b": 3})),
    (" add('x') ", ("add", ("x",), {})),
])
def test_calls_read_as_json_or_a_python_style_call(body, want):
    assert parse_call(body) == want


@pytest.mark.parametrize("body,why", [("add(2", "neither JSON nor"), ("{bad json", "not valid JSON"),
                                      ("add(x)", "must be literals"), ('{"arguments": {}}', "needs {")])
def test_unreadable_calls_say_why(body, why):
    with pytest.raises(ValueError, match=why):
        parse_call(body)


def _slow(seconds: float):
    def slow(a: int) -> str:
        """Sleep.

        Args:
            a: Anything.
        """
        time.sleep(seconds)
        return "late"
    return as_tool(slow)


def raises(a: int) -> str:
    """Fail.

    Args:
        a: Anything.
    """
    raise RuntimeError("boom")


def returns_none(a: int) -> str:
    """Return nothing.

    Args:
        a: Anything.
    """
    return None


def returns_dict(a: int) -> dict:
    """Return a dict.

    Args:
        a: Anything.
    """
    return {"a": a}


def long_text(a: int) -> str:
    """Return a long text.

    Args:
        a: Anything.
    """
    return "x" * 50


async def hangs(a: int) -> str:
    """Never answer in time.

    Args:
        a: Anything.
    """
    await asyncio.sleep(10)
    return "never"


def test_every_failure_becomes_an_error_result_and_nothing_stops():
    reqs = [CallRequest(as_tool(raises), (1,), {}), CallRequest(as_tool(returns_none), (1,), {}),
            CallRequest(as_tool(returns_dict), (2,), {}), CallRequest(as_tool(long_text), (1,), {}),
            CallRequest(as_tool(hangs), (1,), {}), CallRequest(_slow(5.0), (1,), {}),
            CallRequest(as_tool(add), (), {"c": 1}), CallRequest(None, (1,), {}, name="nope"),
            CallRequest(None, (), {}, error="the call is not valid JSON (x)"),
            CallRequest(as_tool(add), (2,), {})]
    start = time.perf_counter()
    out = run_calls(reqs, timeout=0.3, max_chars=10)
    assert time.perf_counter() - start < 4.0       # neither the hung async nor the sleeping thread is awaited
    failed = [c.error is not None for c in out]
    assert failed == [True, True, False, False, True, True, True, True, True, False]
    assert json.loads(out[0].result) == {"error": "RuntimeError: boom"}
    assert "returned NoneType, not text" in out[1].error
    assert out[2].result == '{"a": 2}'
    assert out[3].truncated and out[3].result.startswith("x" * 10) and len(out[3].result) < 50
    assert out[4].timed_out and out[5].timed_out and "timed out after 0.3 s" in out[4].result
    assert "bad arguments for add" in out[6].error and "no tool named 'nope'" in out[7].error
    assert out[9].result == "3" and out[9].arguments == {"a": 2}


def test_async_tools_of_one_step_run_concurrently():
    spans = []

    async def wait(a: int) -> str:
        """Wait.

        Args:
            a: Anything.
        """
        begin = time.monotonic()
        await asyncio.sleep(0.2)
        spans.append((begin, time.monotonic()))
        return "ok"

    run_calls([CallRequest(as_tool(wait), (i,), {}) for i in range(4)], timeout=5.0, max_chars=0)
    assert len(spans) == 4
    assert max(b for b, _ in spans) < min(e for _, e in spans)     # all four were in flight together


def test_sync_tools_of_one_step_run_in_threads_together():
    spans, barrier = [], threading.Barrier(3, timeout=5)

    def meet(a: int) -> str:
        """Meet.

        Args:
            a: Anything.
        """
        begin = time.monotonic()
        barrier.wait()          # returns only when all three calls are running at once
        spans.append((begin, time.monotonic()))
        return "met"

    out = run_calls([CallRequest(as_tool(meet), (i,), {}) for i in range(3)], timeout=5.0, max_chars=0)
    assert [c.result for c in out] == ["met"] * 3
    assert max(b for b, _ in spans) < min(e for _, e in spans)


def _rollout(tool, **over):
    model, tok = plain_caller()
    cfg = build_config({"rollout.max_completion_length": 120, "model.device": "cpu", **over})
    agent = Agent([tool], None, seed=0)
    torch.manual_seed(0)
    rollout = agent.sample(model, tok, [Example(p, "", {}) for p in PROMPTS], 2, cfg)
    return rollout


def failing_multiply(kind: str):
    """A 'multiply' tool (the name the model calls) that raises, returns None or hangs."""
    if kind == "hangs":
        async def multiply(a: int, b: int) -> str:
            """Multiply, never in time.

            Args:
                a: First.
                b: Second.
            """
            await asyncio.sleep(10)
            return "never"
    else:
        def multiply(a: int, b: int) -> str:
            """Multiply, badly.

            Args:
                a: First.
                b: Second.
            """
            if kind == "raises":
                raise RuntimeError("boom")
            return None
    return multiply


@pytest.mark.parametrize("kind,why", [("raises", "RuntimeError: boom"), ("none", "NoneType"),
                                      ("hangs", "timed out")])
def test_a_failing_tool_gives_the_model_its_error_and_the_rollout_goes_on(kind, why):
    r = _rollout(failing_multiply(kind), **{"rollout.tool_timeout": 0.2})
    calls = [c for t in r.trajectories for c in t.calls]
    assert calls and all(c.error is not None and why in c.error for c in calls)
    tok = plain_caller()[1]
    fed = [tok.decode(ids[turn.end:turn.env_end].tolist()) for t, ids in zip(r.trajectories, r.completion_ids)
           for turn in t.turns if turn.env_end > turn.end]
    assert fed and all(text.startswith('<tool_response>{"error": ') for text in fed)   # what the model read
    stats = trajectory_stats(r)
    assert stats["tools/failure_frequency"] == 1.0
    assert stats["tools/timeout_frequency"] == (1.0 if kind == "hangs" else 0.0)


def test_limits_iterations_budget_and_output_cut():
    none_run = _rollout(as_tool(add), **{"rollout.max_tool_calling_iterations": 0})
    calling = [t for t in none_run.trajectories if t.turns[0].message.get("tool_calls")]
    assert calling and all(t.stop == "iterations" and t.env_tokens == 0 for t in calling)
    tight = _rollout(as_tool(add), **{"rollout.max_completion_length": 45})   # a call is ~38 tokens
    assert any(t.stop == "budget" for t in tight.trajectories)
    assert all(t.env_tokens == 0 for t in tight.trajectories if t.stop == "budget")
    assert tight.completion_ids.shape[1] <= 45
