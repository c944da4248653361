"""The chat format: tool schemas in the prompt, Hermes calls, results as the template's tool messages, and a
template that is not prefix-preserving (the stream continues as sampled; such turns are counted)."""

from __future__ import annotations

import torch
from agent_models import PROMPTS, chat_caller, chat_messages, chat_tokenizer

from grpokit.agents.agent import agent_from_config
from grpokit.agents.formats import ChatFormat, template_is_prefix_preserving
from grpokit.agents.tools import as_tool
from grpokit.config.schema import build_config
from grpokit.model.logprobs import per_token_logprobs
from grpokit.observe.agent_metrics import trajectory_stats
from grpokit.rollout.trajectory import ToolCall
from grpokit.tasks.base import Example

CFG = {"rollout.tools": ["grpokit.agents.builtin:multiply"], "rollout.max_completion_length": 200,
       "model.device": "cpu"}


def test_results_are_the_template_tool_message_after_the_assistant_eos():
    tok = chat_tokenizer()
    fmt = ChatFormat(tok, [tok.eos_token_id])
    ids = fmt.render([ToolCall("multiply", {"a": 1}, "408")])
    assert tok.decode(ids) == ("\n<|im_start|>user\n<tool_response>408</tool_response><|im_end|>\n"
                               "<|im_start|>assistant\n")


def test_a_template_that_renders_the_last_assistant_turn_apart_still_gives_the_bare_result():
    """The non-prefix-preserving template writes <think></think> on the last assistant turn only (as Qwen3):
    before, the result was cut where [user, call] and [user, call, result] first differ, inside the assistant
    turn, and began with the call's own text ('tool_call>{...}</tool_call><|im_end|>...')."""
    tok = chat_tokenizer(prefix_preserving=False)
    ids = ChatFormat(tok, [tok.eos_token_id]).render([ToolCall("multiply", {"a": 1}, "408")])
    assert tok.decode(ids) == ("\n<|im_start|>user\n<tool_response>408</tool_response><|im_end|>\n"
                               "<|im_start|>assistant\n")


def test_hermes_calls_are_parsed_and_the_content_kept():
    tok = chat_tokenizer()
    fmt = ChatFormat(tok, [tok.eos_token_id])
    from grpokit.agents.builtin import multiply
    turn = tok('Let me.<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
               '<tool_call>{"name": "divide", "arguments": {}}</tool_call><|im_end|>',
               add_special_tokens=False)["input_ids"]
    message, requests = fmt.parse(turn, [], {"multiply": as_tool(multiply)})
    assert message["content"] == "Let me."
    got = [(q.name, q.kwargs, q.tool is not None) for q in requests]
    assert got == [("multiply", {"a": 3, "b": 4}, True), ("divide", {}, False)]


def test_a_tokenizer_response_template_reads_the_calls(monkeypatch):
    """With `response_template` set, transformers' parse_response (TRL's parser) decides the calls."""
    tok = chat_tokenizer()
    fmt = ChatFormat(tok, [tok.eos_token_id])
    seen = {}

    def parse_response(ids, prefix=None, tools=None):
        seen.update(ids=ids, prefix=prefix, tools=tools)
        call = {"type": "function", "function": {"name": "multiply", "arguments": '{"a": 5}'}}
        return {"role": "assistant", "content": "ok", "tool_calls": [call]}

    monkeypatch.setattr(tok, "response_template", {"x": 1}, raising=False)   # this tokenizer object only
    monkeypatch.setattr(tok, "parse_response", parse_response, raising=False)
    from grpokit.agents.builtin import multiply
    message, requests = fmt.parse([5, 6], [1, 2], {"multiply": as_tool(multiply)})
    assert seen["ids"] == [5, 6] and seen["prefix"] == [1, 2]
    assert seen["tools"][0]["function"]["name"] == "multiply"
    assert message["content"] == "ok" and requests[0].kwargs == {"a": 5}


def test_a_parsed_call_without_a_name_is_read_as_plain_content(monkeypatch):
    """parse_response reads `<tool_call>{"arguments": ...}</tool_call>` as a call with no name: TRL takes such
    a turn as plain text (no tool round), and so does grpokit (before: a KeyError stopped the run)."""
    tok = chat_tokenizer()
    fmt = ChatFormat(tok, [tok.eos_token_id])
    turn = tok('<tool_call>{"arguments": {"a": 3}}</tool_call><|im_end|>',
               add_special_tokens=False)["input_ids"]

    def parse_response(ids, prefix=None, tools=None):
        nameless = {"type": "function", "function": {"arguments": {"a": 3}}}
        return {"role": "assistant", "tool_calls": [nameless]}

    monkeypatch.setattr(tok, "response_template", {"x": 1}, raising=False)   # this tokenizer object only
    monkeypatch.setattr(tok, "parse_response", parse_response, raising=False)
    message, requests = fmt.parse(turn, [1, 2], {})
    assert requests == [] and message["content"] == '<tool_call>{"arguments": {"a": 3}}</tool_call>'


def test_tools_render_into_the_prompt_and_completions_are_messages():
    model, tok = chat_caller()
    cfg = build_config(CFG)
    torch.manual_seed(0)
    examples = [Example(chat_messages(p), "", {}) for p in PROMPTS]
    r = agent_from_config(cfg).sample(model, tok, examples, 2, cfg)
    prompt = tok.decode(r.prompt_ids[0][r.prompt_mask[0].bool()])
    assert prompt.startswith("<|im_start|>system\nmultiply <|im_end|>")
    two = [i for i, t in enumerate(r.trajectories) if len(t.turns) == 2 and t.turns[0].calls]
    assert two, "the chat caller should call multiply"
    msgs = r.completions[two[0]]
    assert [m["role"] for m in msgs] == ["assistant", "tool", "assistant"]
    assert msgs[0]["tool_calls"][0]["function"]["name"] == "multiply" and msgs[1]["content"].isdigit()


def test_a_template_that_is_not_prefix_preserving_keeps_the_stream_and_counts_the_turns():
    assert template_is_prefix_preserving(chat_tokenizer(True))
    assert not template_is_prefix_preserving(chat_tokenizer(False))   # drops an earlier turn's reasoning
    model, tok = chat_caller(prefix_preserving=False)
    cfg = build_config(CFG)
    torch.manual_seed(0)
    examples = [Example(chat_messages(p), "", {}) for p in PROMPTS]
    r = agent_from_config(cfg).sample(model, tok, examples, 2, cfg)
    turns = [len(t.turns) for t in r.trajectories]
    assert max(turns) >= 2
    assert [t.non_prefix_turns for t in r.trajectories] == [n - 1 for n in turns]
    assert trajectory_stats(r)["turns/non_prefix"] == sum(turns) - len(turns)
    T = r.completion_ids.shape[1]      # the continuation turns were sampled after the stream as it was
    with torch.no_grad():
        full = per_token_logprobs(model, r.input_ids, r.attention_mask, T)
    trained = r.loss_mask.bool()
    assert torch.allclose(r.sampling_logprobs[trained], full[trained], atol=2e-4)
