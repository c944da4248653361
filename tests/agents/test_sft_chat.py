"""What SmolLM2-135M-Instruct with the calculator needs (docs/agents.md): `grpokit sft` tokenizes chat
prompts as the sampler renders them and trains with bf16 matmuls under model.precision=bf16; calculator
traces from chat prompts; the plain format when a BPE token runs past </tool_call> (SmolLM2's '><')."""

from __future__ import annotations

import json

import torch
from agent_models import chat_tokenizer, plain_trace

from grpokit.agents.builtin import demonstrations
from grpokit.agents.formats import PlainFormat
from grpokit.cli.main import main as cli_main
from grpokit.model.loading import tiny_random_model
from grpokit.model.precision import set_compute_dtype
from grpokit.rollout.groups import render_prompts
from grpokit.rollout.trajectory import ToolCall
from grpokit.tasks.arithmetic import calculator_trace
from grpokit.tasks.base import Example
from grpokit.train.sft import encode_pairs, train_sft

MESSAGES = [{"role": "system", "content": "Call multiply."}, {"role": "user", "content": "What is 12*34?"}]


def test_chat_prompt_tokens_are_the_samplers():
    tok = chat_tokenizer()
    target = plain_trace("What is 12*34?")
    ids, att, mask = encode_pairs(tok, [MESSAGES], [target], mask_tool_results=True)
    prompt_ids, _ = render_prompts(tok, [MESSAGES], None, "left")
    P = prompt_ids.shape[1]
    assert ids[0, :P].tolist() == prompt_ids[0].tolist()
    assert mask[0, :P].sum() == 0 and att[0].sum() == P + len(tok(target, add_special_tokens=False)
                                                              ["input_ids"]) + 1
    text = tok.decode(ids[0, P:][mask[0, P:] > 0])
    assert text == "<tool_call>multiply(12,34)</tool_call>\\boxed{408}<|im_end|>"   # the result not trained


def _linear_output_dtypes(bf16: bool) -> set[torch.dtype]:
    tok = chat_tokenizer()
    model = tiny_random_model(tok, seed=0)
    set_compute_dtype(model, torch.bfloat16 if bf16 else None)
    seen: set[torch.dtype] = set()
    layer = model.model.layers[0].mlp.down_proj
    layer.register_forward_hook(lambda module, args, out: seen.add(out.dtype))
    examples = [Example(MESSAGES, "408", {"solution": plain_trace("What is 12*34?")})]
    train_sft(model, tok, examples, steps=1, batch_size=1, learning_rate=1e-3, warmup_steps=1, seed=0,
              mask_tool_results=True)
    assert next(model.parameters()).dtype == torch.float32   # master weights stay fp32
    return seen


def test_sft_follows_the_compute_dtype():
    assert _linear_output_dtypes(bf16=True) == {torch.bfloat16}
    assert _linear_output_dtypes(bf16=False) == {torch.float32}


def test_calculator_traces_from_chat_prompts_and_text_with_examples():
    assert calculator_trace(MESSAGES) == plain_trace("What is 12*34?")
    shown = "Example:\nWhat is 2*3?\n<tool_call>multiply(2,3)</tool_call>\n\nWhat is 12*34?"
    assert calculator_trace(shown) == plain_trace("What is 12*34?")   # the last question, not the example
    (demo,) = demonstrations("calculator", [Example(MESSAGES, "408", {})], 1, seed=0)
    assert demo.prompt == MESSAGES and demo.columns["solution"] == plain_trace("What is 12*34?")


def test_a_token_past_the_call_close_ends_the_turn_and_is_not_repeated():
    tok = chat_tokenizer()
    tok.add_tokens(["><"])                     # a BPE merge as SmolLM2's: '</tool_call>' + '<tool_response>'
    fmt = PlainFormat(tok, [tok.eos_token_id])
    turn = tok("<tool_call>multiply(12,34)</tool_call><", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(turn[-1:]) == ["><"] and turn[-1] in fmt.stop_ids.tolist()
    assert fmt.turn_ended(turn) and not fmt.turn_ended(turn[:-1])
    message, (request,) = fmt.parse(turn, [], {})
    assert (request.name, request.args) == ("multiply", (12, 34))
    result = [ToolCall("multiply", {"a": 12, "b": 34}, "408")]
    stream = tok.decode(turn + fmt.render(result, turn))
    assert stream == "<tool_call>multiply(12,34)</tool_call><tool_response>408</tool_response>"
    assert tok.decode(fmt.render(result)) == "<tool_response>408</tool_response>"     # no overhang
    spaced = tok("<tool_call>multiply(12,34)</tool_call> ", add_special_tokens=False)["input_ids"]
    # an overhang that does not start <tool_response> stays the model's text, the result follows whole
    assert tok.decode(spaced + fmt.render(result, spaced)).endswith("> <tool_response>408</tool_response>")


def test_sft_cli_from_a_model_records_it_and_not_the_demo_shape(tmp_path):
    out = tmp_path / "warm"
    argv = ["sft", "configs/agents_calculator.yaml", "--init", "builtin:arith-demo", "--traces", "calculator",
            "--num-traces", "8", "--batch-size", "4", "--steps", "2", "--eval-limit", "0", "--threads", "1",
            "--out", str(out)]
    assert cli_main(argv) == 0
    report = json.loads((out / "sft_report.json").read_text())
    assert report["shape"] is None and report["recipe"]["init"] == "builtin:arith-demo"
    assert [row["step"] for row in report["log"]] == [2] and (out / "config.json").is_file()
