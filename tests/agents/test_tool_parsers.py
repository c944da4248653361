"""Each template family's tool calls as its models write them: names and arguments read, several calls in
one turn, a malformed call giving the model an error; and a Llama-3.1-style tool rollout whose tool runs."""

from __future__ import annotations

import pytest
import torch
from agent_models import PROMPTS, chat_messages, llama_caller, product

from grpokit.agents.agent import agent_from_config
from grpokit.agents.builtin import multiply
from grpokit.agents.tool_parsers import (
    PARSERS,
    RawCall,
    family_of,
    gemma_arguments,
    requests_of,
)
from grpokit.agents.tools import as_tool
from grpokit.config.schema import build_config
from grpokit.tasks.base import Example


def echo(text: str) -> str:
    """Echo.

    Args:
        text: Anything.
    """
    return text


TOOLS = {"multiply": as_tool(multiply), "echo": as_tool(echo)}
TWO = [("multiply", {"a": 3, "b": 4}, None), ("echo", {"text": "007"}, None)]

# family -> (a turn with two calls as the family's models write it, its content)
OUTPUTS = {
    "hermes": ('<think>\nMultiply first.\n</think>\n\n<tool_call>\n{"name": "multiply", "arguments": '
               '{"a": 3, "b": 4}}\n</tool_call>\n<tool_call>\n{"name": "echo", "arguments": {"text": "007"}}'
               '\n</tool_call>',
               "<think>\nMultiply first.\n</think>"),
    "xml": ("Let me compute.\n\n<tool_call>\n<function=multiply>\n<parameter=a>\n3\n</parameter>\n"
            "<parameter=b>\n4\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=echo>\n<parameter=text>\n007\n"
            "</parameter>\n</function>\n</tool_call>", "Let me compute."),
    "glm4": ("<think>Two calls.</think>\n<tool_call>multiply\n<arg_key>a</arg_key>\n"
             "<arg_value>3</arg_value>\n<arg_key>b</arg_key>\n<arg_value>4</arg_value>\n</tool_call>\n"
             "<tool_call>echo\n<arg_key>text</arg_key>\n<arg_value>007</arg_value>\n</tool_call>",
             "<think>Two calls.</think>"),
    "llama3": ('{"name": "multiply", "parameters": {"a": 3, "b": 4}}; {"name": "echo", "parameters": '
               '{"text": "007"}}', ""),
    "gemma4": ('<|channel>thought\nTwo calls.<channel|><|tool_call>call:multiply{a:3,b:4}<tool_call|>'
               '<|tool_call>call:echo{text:<|"|>007<|"|>}<tool_call|>', ""),
    "lfm2": ("<|tool_call_start|>[multiply(a=3, b=4), echo(text='007')]<|tool_call_end|>", ""),
}


@pytest.mark.parametrize("family", sorted(OUTPUTS))
def test_two_calls_in_one_turn_are_read_with_their_arguments(family):
    """XML-style values (xml, glm4) are text: '3' for an integer parameter is 3, '007' for a string stays."""
    text, content = OUTPUTS[family]
    got_content, calls = PARSERS[family](text)
    assert got_content == content
    assert [(q.name, q.kwargs, q.error) for q in requests_of(calls, TOOLS)] == TWO


@pytest.mark.parametrize("text", [
    # as GPT-OSS writes it: the recipient after the channel, a <|constrain|> type; the turn ends at <|call|>
    '<|channel|>analysis<|message|>Multiply.<|end|><|start|>assistant<|channel|>commentary '
    'to=functions.multiply <|constrain|>json<|message|>{"a": 3, "b": 4}',
    # as its chat template renders it: the recipient in the role part
    ' to=functions.multiply<|channel|>commentary json<|message|>{"a": 3, "b": 4}<|call|>'])
def test_gpt_oss_calls_are_read_in_either_header_order(text):
    content, calls = PARSERS["harmony"](text)
    assert content == ""
    assert [(c.name, c.arguments, c.error) for c in calls] == [("multiply", {"a": 3, "b": 4}, None)]


def test_a_gpt_oss_answer_is_its_final_channel():
    text = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 12."
    assert PARSERS["harmony"](text) == ("It is 12.", [])


@pytest.mark.parametrize("family,text,why", [
    ("hermes", '<tool_call>\n{"name": "multiply", "arguments": {"a": 3,}}\n</tool_call>', "not valid JSON"),
    ("hermes", 'Sure.<tool_call>\n{"name": "multiply", "arguments": {"a": 3}}', "without </tool_call>"),
    ("xml", "<tool_call>\n<parameter=a>\n3\n</parameter>\n</tool_call>", "needs <function=NAME>"),
    ("glm4", "<tool_call>\n<arg_key>a</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", "name first"),
    ("llama3", '{"name": "multiply", "parameters": {"a": 3', "not valid JSON"),
    ("llama3", '{"function": "multiply", "parameters": {}}', "needs {"),
    ("harmony", " to=functions.multiply<|channel|>commentary json<|message|>{a: 3}", "not valid JSON"),
    ("gemma4", '<|tool_call>call:echo{text:<|"|>007}<tool_call|>', "not closed"),
    ("gemma4", "<|tool_call>multiply{a:3}<tool_call|>", "call:NAME"),
    ("lfm2", "<|tool_call_start|>[multiply(a=3, b=]<|tool_call_end|>", "must read"),
])
def test_a_malformed_call_becomes_an_error_the_model_reads(family, text, why):
    _, calls = PARSERS[family](text)
    requests = requests_of(calls, TOOLS)
    assert len(requests) == 1 and why in requests[0].error and requests[0].tool is None


@pytest.mark.parametrize("family", ["hermes", "xml", "glm4", "llama3", "gemma4", "lfm2"])
def test_a_turn_without_a_call_is_content(family):
    assert PARSERS[family]("The product is 12.") == ("The product is 12.", [])


def test_gemma_arguments_read_nested_values_and_keep_strings_whole():
    assert gemma_arguments('{q:<|"|>a, b: {c}<|"|>,n:[1,2.5],m:{<|"|>k<|"|>:true},z:null}') == {
        "q": "a, b: {c}", "n": [1, 2.5], "m": {"k": True}, "z": None}


def test_an_xml_value_the_schema_does_not_type_is_json_when_it_parses():
    call = RawCall("other", {"n": "3", "s": "three", "l": "[1, 2]"}, as_text=True)
    assert requests_of([call], TOOLS)[0].kwargs == {"n": 3, "s": "three", "l": [1, 2]}


def test_a_template_without_known_markup_has_no_family():
    assert family_of("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert family_of(None) is None
    assert family_of({"default": "<tool_call>{{ x }}</tool_call>", "rag": "..."}) == "hermes"


def test_a_llama_style_rollout_runs_the_tool_and_feeds_its_result():
    """The tiny model calls multiply as Llama 3.1 does (bare JSON, no <tool_call>): the call is read, the
    tool runs, its result comes back as an ipython turn, and the model answers after it. Before: the Hermes
    parser found no call, every turn ended as "done" and no tool ever ran."""
    model, tok = llama_caller()
    cfg = build_config({"rollout.tools": ["grpokit.agents.builtin:multiply"],
                        "rollout.max_completion_length": 200, "model.device": "cpu"})
    torch.manual_seed(0)
    examples = [Example(chat_messages(p), "", {}) for p in PROMPTS]
    r = agent_from_config(cfg).sample(model, tok, examples, 2, cfg)
    assert all(t.turns[0].calls for t in r.trajectories)   # each first turn is a call (some garbled: errors)
    ran = [(i, t.turns[0].calls[0]) for i, t in enumerate(r.trajectories)
           if t.turns[0].calls[0].error is None]
    assert len(ran) >= 2, [t.turns[0].calls[0].error for t in r.trajectories]
    assert any(call.arguments == dict(zip("ab", product(PROMPTS[i // 2])[:2])) for i, call in ran)
    for i, call in ran:   # the tool ran on what the model wrote (a sampled turn may take other numbers)
        a, b = call.arguments["a"], call.arguments["b"]
        assert (call.name, call.result) == ("multiply", str(a * b))
        assert [m["role"] for m in r.completions[i]][:2] == ["assistant", "tool"]
        function = r.completions[i][0]["tool_calls"][0]["function"]
        assert function == {"name": "multiply", "arguments": {"a": a, "b": b}}
    i, call = ran[0]
    text = tok.decode(r.completion_ids[i], skip_special_tokens=False)
    assert f"<|start_header_id|>ipython<|end_header_id|>\n\n{call.result}<|eot_id|>" in text
