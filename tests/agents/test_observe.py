"""What a run with tools shows: metrics.jsonl's turn and tool figures, the completions log's conversations
with their calls, the HTML report, and evaluation's turn counts."""

from __future__ import annotations

import json

from agent_models import PROMPTS, plain_caller, product

from grpokit.config.schema import build_config
from grpokit.observe.report import build_report
from grpokit.observe.tracking import conversation_text
from grpokit.tasks.base import Example
from grpokit.train.loop import train_grpo


def test_a_tool_run_logs_turns_calls_and_conversations(tmp_path):
    model, tok = plain_caller()
    cfg = build_config({"rollout.tools": ["grpokit.agents.builtin:multiply"], "model.device": "cpu",
                        "rollout.max_completion_length": 120, "reward.funcs": {"accuracy": 1.0},
                        "rollout.num_generations": 2, "rollout.prompts_per_step": 2, "run.max_steps": 2,
                        "run.output_dir": str(tmp_path), "run.progress": False,
                        "run.log_completions_steps": 1, "run.eval_limit": -1})
    examples = [Example(p, str(product(p)[2]), {"answer": str(product(p)[2])}) for p in PROMPTS]
    train_grpo(cfg, model, tok, train_examples=examples, eval_examples=examples[:2])
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for key in ("turns/mean", "turns/max", "tools/call_frequency", "tools/failure_frequency",
                "tools/timeout_frequency", "tools/latency_mean_s", "tokens/model_mean", "tokens/env_mean",
                "cut/max_iterations", "cut/budget", "cut/length", "turns/non_prefix"):
        assert all(key in r for r in rows), key
    entries = [json.loads(x) for x in (tmp_path / "completions.jsonl").read_text().splitlines()]
    logged = [c for e in entries for c in e["completions"]]
    called = [c for c in logged if c["calls"]]
    assert called and all(c["turns"] >= 1 and c["stop"] in ("done", "iterations", "budget", "length")
                          for c in logged)
    first = called[0]["calls"][0]
    assert first["tool"] == "multiply" and set(first) == {"tool", "arguments", "result", "error", "latency_s"}
    assert "tool calls:" in build_report(tmp_path) and "multiply(" in build_report(tmp_path)
    evals = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert all(e["turns_mean"] >= 1 and "tool_calls_mean" in e and "tool_error_rate" in e for e in evals)


def test_chat_conversations_read_as_lines():
    messages = [{"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
                {"role": "tool", "name": "f", "content": "2"}, {"role": "assistant", "content": "done"}]
    assert conversation_text(messages) == '[assistant]  -> calls f({"x": 1})\n[tool f] 2\n[assistant] done'
    assert conversation_text("plain") == "plain"
