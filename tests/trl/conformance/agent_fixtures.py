"""A tiny offline model that plays the scripted agent turns of TRL's tool and environment tests.

TRL's tests replace `model.generate` with fixed token ids; grpokit samples in its own decode loop, so the
conformance cases use a model that *says* those turns instead: a character-level Qwen2 with ChatML tokens
and a Hermes tool template (`<tool_call>{json}</tool_call>`, results as `<tool_response>` user turns),
taught by 180 supervised steps on the conversations below (the loss is at its floor, the
entropy of the random last turn, from about step 175). Each prompt decides what the
first turn does (a valid call, a call with a wrong argument or tool name, no call, a malformed call),
so the tool metrics of a batch are exact; the last turn is "Done" with one to three "!" drawn at random,
so the completions of a group differ and the update moves every weight.

`tokenizer.response_template` is transformers' description of the template's assistant turn (a
`<tool_call>` block of JSON, then the content): what TRL asks users to set for a template it does not
recognise, and what both implementations parse tool calls with.
"""

from __future__ import annotations

import torch

from grpokit.agents.formats import HERMES_TEMPLATE

RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
FINALS = ["Done!", "Done!!", "Done!!!"]          # the last turn: which one is drawn at random
ERRORS = ["{'error': 'no such argument'}", '{"error": "tool not found"}']   # results the model has seen

# (tool names in the system line, user message) -> the first turn: a call (name, arguments), or text
SCRIPT = {
    (("multiply_tool",), "Use it."): ("multiply_tool", {"a": 3, "b": 4}),
    (("multiply_tool",), "Misuse it."): ("multiply_tool", {"a": 3, "c": 4}),
    (("multiply_tool",), "Skip it."): "I don't know any tool",
    (("increment",), "A"): ("increment", {"step": 1}),
    (("increment",), "B"): ("decrement", {"step": 2}),
    (("increment",), "C"): "I won't increment",
    (("increment",), "Count."): ("increment", {"step": 1}),
    (("increment",), "Count?"): "I won't",
    (("shout",), "Echo."): ("shout", {"text": "hi"}),
    (("shout",), "Echo?"): "Done",
    ((), "Guess the 5-letter word."): "Done",
}
MALFORMED = (("multiply_tool",), "Break it.")
MALFORMED_TURNS = ['<tool_call>{"arguments": {"a": 3, "b": 4}}</tool_call>',
                   '<toolcall>{"arguments": {"a": 3, "b": 4}}</toolcall>',
                   '<tool_call>{"arguments": {a: 3, b: 4}}</tool_call>']


def agent_tokenizer():
    from grpokit.model.loading import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = HERMES_TEMPLATE
    tok.response_template = RESPONSE_TEMPLATE
    return tok


def _schemas(names) -> list[dict]:
    return [{"type": "function", "function": {"name": n}} for n in names]


def _conversations(tok) -> tuple[list[str], list[str]]:
    """(rendered prompt, the rest of the rendered conversation) for every scripted turn."""
    prompts, targets = [], []

    def add(names, user, turns):
        tools = _schemas(names)
        head = tok.apply_chat_template([user], tools=tools, add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template([user, *turns], tools=tools, tokenize=False)
        prompts.append(head)
        targets.append(full[len(head):].removesuffix("<|im_end|>\n"))       # encode_pairs adds the EOS

    for (names, text), first in SCRIPT.items():
        user = {"role": "user", "content": text}
        for k, final in enumerate(FINALS):
            if isinstance(first, str):
                add(names, user, [{"role": "assistant", "content": first + "!" * k}])
                continue
            call = {"type": "function", "function": {"name": first[0], "arguments": first[1]}}
            add(names, user, [{"role": "assistant", "content": "", "tool_calls": [call]},
                              {"role": "tool", "name": first[0], "content": ["12", *ERRORS][k]},
                              {"role": "assistant", "content": final}])
    for turn in MALFORMED_TURNS:
        add(MALFORMED[0], {"role": "user", "content": MALFORMED[1]}, [{"role": "assistant", "content": turn}])
    return prompts, targets


def agent_model(folder, steps: int = 180):
    """Teach the scripted turns to a tiny Qwen2 and save it with its tokenizer in `folder`."""
    from grpokit.model.loading import tiny_random_model
    from grpokit.train.sft import encode_pairs, sft_loss

    tok = agent_tokenizer()
    prompts, targets = _conversations(tok)
    model = tiny_random_model(tok, seed=0)
    ids, att, mask = encode_pairs(tok, prompts, targets, mask_tool_results=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(steps):
            sft_loss(model, ids, att, mask).backward()
            opt.step()
            opt.zero_grad()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)
