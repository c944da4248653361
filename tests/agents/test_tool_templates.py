"""The chat format under the real chat templates TRL 1.16 ships (trl/chat_templates/*.jinja): the tool-result
text inserted after an assistant's tool call, which template family reads the calls, and the refusals."""

from __future__ import annotations

import pathlib

import pytest
from agent_models import template_tokenizer
from jinja2 import TemplateError

from grpokit.agents.formats import ChatFormat
from grpokit.agents.tools import as_tool
from grpokit.errors import ConfigError
from grpokit.rollout.trajectory import ToolCall

trl = pytest.importorskip("trl")
TEMPLATES = pathlib.Path(trl.__file__).parent / "chat_templates"

# The ids each family's generation config stops on (the strings of its EOS tokens).
QWEN = ["<|im_end|>", "<|endoftext|>"]
LLAMA = ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"]
GPTOSS = ["<|return|>", "<|call|>", "<|endoftext|>"]
GLM = ["<|endoftext|>", "<|user|>", "<|observation|>"]
GEMMA4 = ["<turn|>", "<eos>", "<|tool_response>"]   # the turn ends where TRL's gemma4 parser ends content

QWEN_RESULT = "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
NEMOTRON_RESULT = ("\n<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\n")
LLAMA_RESULT = ('<|start_header_id|>ipython<|end_header_id|>\n\n"408"<|eot_id|>'
                "<|start_header_id|>assistant<|end_header_id|>\n\n")
GEMMA4_RESULT = 'response:multiply{value:<|"|>408<|"|>}<tool_response|>'
LFM2_RESULT = "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"

# template file -> (EOS strings, the exact text after the assistant's EOS when multiply returned 408)
RESULTS = {
    "qwen2_5": (QWEN, QWEN_RESULT),
    "qwen3": (QWEN, QWEN_RESULT),
    "qwen3_instruct_2507": (QWEN, QWEN_RESULT),
    "qwen3_vl": (QWEN, QWEN_RESULT),
    "qwen3_5_think": (QWEN, QWEN_RESULT + "<think>\n"),
    "qwen3_5_nothink": (QWEN, QWEN_RESULT + "<think>\n\n</think>\n\n"),
    "qwen3_6": (QWEN, QWEN_RESULT + "<think>\n"),
    "qwen3_8": (QWEN, QWEN_RESULT + "<think>\n"),
    "nemotron_3_nano": (QWEN, NEMOTRON_RESULT),
    "nemotron_3_super": (QWEN, NEMOTRON_RESULT),
    "nemotron_3_ultra": (QWEN, NEMOTRON_RESULT),
    "nemotron_3_5_lightning": (QWEN, NEMOTRON_RESULT),
    "llama3_1": (LLAMA, LLAMA_RESULT),
    "llama3_2": (LLAMA, LLAMA_RESULT),
    "gptoss": (GPTOSS, "<|start|>functions.multiply to=assistant<|channel|>commentary<|message|>"
                       "\"408\"<|end|><|start|>assistant"),
    "glm4moe": (GLM, "\n<tool_response>\n408\n</tool_response><|assistant|>"),
    "gemma4": (GEMMA4, GEMMA4_RESULT),
    "gemma4_v2": (GEMMA4, "\n<|turn>tool\n408<turn|>\n<|turn>model\n"),
    "gemma4_v3": (GEMMA4, GEMMA4_RESULT),
    "gemma4_v4": (GEMMA4, GEMMA4_RESULT),
    "gemma4_v5": (GEMMA4, GEMMA4_RESULT),
    "lfm2_v2": (QWEN, "\n<|im_start|>tool\n<|tool_response_start|>408<|tool_response_end|><|im_end|>\n"
                      "<|im_start|>assistant\n"),
    "lfm2_2_5": (QWEN, LFM2_RESULT),
    "lfm2_2_5_v2": (QWEN, LFM2_RESULT),
    "lfm2_2_5_vl": (QWEN, LFM2_RESULT),
}


def real(name: str, eos: list[str]):
    """The char tokenizer under TRL's copy of a model's chat template, its EOS tokens `eos`."""
    tok = template_tokenizer((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"), eos)
    return tok, [tok.convert_tokens_to_ids(e) for e in eos]


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_the_tool_result_is_exactly_what_the_template_writes_after_the_assistant_eos(name):
    """Qwen3's template writes <think>\\n\\n</think>\\n\\n on the last assistant turn only: before the fix the
    result was cut where the call rendered alone and the call rendered before the results first differ,
    inside the assistant turn, and the model read 'ool_call>\\n{"name": "multiply", "arguments": {}}\\n
    </tool_call><|im_end|>...' (a token's tail and a second, empty call) before the real result."""
    eos, want = RESULTS[name]
    tok, ids = real(name, eos)
    fmt = ChatFormat(tok, ids)
    assert tok.decode(fmt.render([ToolCall("multiply", {"a": 12, "b": 34}, "408")])) == want


def test_two_results_follow_one_turn_in_the_order_called():
    tok, ids = real("qwen3", QWEN)
    calls = [ToolCall("multiply", {}, "408"), ToolCall("add", {}, "7")]
    text = tok.decode(ChatFormat(tok, ids).render(calls))
    assert text == ("\n<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<tool_response>\n7\n"
                    "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_a_template_whose_calls_grpokit_cannot_read_is_refused_unless_it_has_a_response_template():
    """Muse Glimmer's ATEM calls (<atem:invoke ...>) have no parser here: refused at once, naming what to set
    (before: a template of no known family was read as Hermes, found no call, and trained without tools)."""
    tok, ids = real("muse_glimmer", ["<|eot|>"])
    with pytest.raises(ConfigError, match="set tokenizer.response_template"):
        ChatFormat(tok, ids)
    tok.response_template = {"defaults": {"role": "assistant"}, "fields": {}}   # its checkpoint ships one
    assert ChatFormat(tok, ids).family is None


def test_a_template_with_no_eos_after_the_call_is_refused():
    """GLM-4's turn with a call ends at <|observation|>: a model whose EOS ids lack it cannot be cut."""
    tok, ids = real("glm4moe", ["<|endoftext|>"])
    with pytest.raises(ConfigError, match="no EOS .* ends the assistant's tool call"):
        ChatFormat(tok, ids)


FAMILIES = {"qwen2_5": "hermes", "qwen3": "hermes", "qwen3_instruct_2507": "hermes", "qwen3_vl": "hermes",
            "qwen3_5_think": "xml", "qwen3_5_nothink": "xml", "qwen3_6": "xml", "qwen3_8": "xml",
            "nemotron_3_nano": "xml", "nemotron_3_super": "xml", "nemotron_3_ultra": "xml",
            "nemotron_3_5_lightning": "xml", "llama3_1": "llama3", "llama3_2": "llama3", "gptoss": "harmony",
            "glm4moe": "glm4", "gemma4": "gemma4", "gemma4_v2": "gemma4", "gemma4_v3": "gemma4",
            "gemma4_v4": "gemma4", "gemma4_v5": "gemma4", "lfm2_v2": "lfm2", "lfm2_2_5": "lfm2",
            "lfm2_2_5_v2": "lfm2", "lfm2_2_5_vl": "lfm2"}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_template_is_read_by_its_family_and_its_own_rendered_calls_parse_back(name):
    """The assistant turn the real template renders for two calls (or one, where it allows only one) is read
    back by the family's parser into the same names and arguments, typed by the tools' schemas."""
    def multiply(a: int, b: int) -> int:
        """Multiply.

        Args:
            a: First.
            b: Second.
        """
        return a * b

    def echo(text: str) -> str:
        """Echo.

        Args:
            text: Anything.
        """
        return text

    eos = RESULTS[name][0]
    tok, ids = real(name, eos)
    fmt = ChatFormat(tok, ids)
    assert fmt.family == FAMILIES[name]
    calls = [("multiply", {"a": 3, "b": 4}), ("echo", {"text": "007"})]
    user = [{"role": "user", "content": "q"}]
    for n in (2, 1):   # Llama 3.1 / 3.2 and GPT-OSS render one call per turn
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": c, "arguments": a}} for c, a in calls[:n]]}
        try:
            text = tok.apply_chat_template(user + [message], tokenize=False)
            break
        except TemplateError:   # the template's raise_exception on a second call
            continue
    head = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    start = next(i for i, (a, b) in enumerate(zip(head + "\0", text)) if a != b)
    turn = tok(text[start:], add_special_tokens=False)["input_ids"]
    ends = [i for i, t in enumerate(turn) if t in ids]
    turn = turn[:ends[0] + 1] if ends else turn + [ids[-1]]   # it stops at EOS (GLM: <|observation|>)
    n = 1 if "echo" not in text[start:] else n                # GPT-OSS renders a turn's first call only
    _, requests = fmt.parse(turn, [], {"multiply": as_tool(multiply), "echo": as_tool(echo)})
    assert [(q.name, q.kwargs, q.error) for q in requests] == [(c, a, None) for c, a in calls[:n]]
