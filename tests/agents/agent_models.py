"""Tiny models that call tools, made in seconds: a random-init Qwen2 memorizes a few tool-calling traces.

    model, tok = plain_caller()   # "What is 12*34?" -> <tool_call>multiply(12,34)</tool_call>...
    model, tok = chat_caller()    # the same as Hermes chat turns (<|im_start|> ... <|im_end|>)

Memorizing (a few hundred full-batch Adam steps on a handful of traces) makes the model emit the calls
with high probability even when sampling, so multi-turn rollouts have tool turns to test.
"""

from __future__ import annotations

import functools

import torch

from grpokit.model.loading import build_char_tokenizer, tiny_random_model
from grpokit.train.sft import encode_pairs, sft_loss

PROMPTS = ["What is 12*34?", "What is 56*78?", "What is 11*22?", "What is 90*13?"]

HERMES = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if m.reasoning_content and (KEEP or loop.index0 == ns.last) %}"
    "<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_tokenizer(prefix_preserving: bool = True):
    """The char tokenizer with ChatML special tokens and a Hermes-style tool template; EOS is <|im_end|>.
    prefix_preserving=False: the template drops an earlier assistant turn's reasoning (as Qwen3's does)."""
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = HERMES.replace("KEEP", "true" if prefix_preserving else "false")
    return tok


def product(prompt: str) -> tuple[int, int, int]:
    a, b = prompt[len("What is "):-1].split("*")
    return int(a), int(b), int(a) * int(b)


def plain_trace(prompt: str) -> str:
    a, b, c = product(prompt)
    return f"<tool_call>multiply({a},{b})</tool_call><tool_response>{c}</tool_response>\\boxed{{{c}}}"


def _memorize(tok, prompts: list[str], targets: list[str], steps: int, seed: int, lr: float = 1e-2, **dims):
    model = tiny_random_model(tok, seed=seed, **dims)
    ids, att, mask = encode_pairs(tok, prompts, targets)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        for _ in range(steps):
            sft_loss(model, ids, att, mask).backward()
            opt.step()
            opt.zero_grad()
    return model


@functools.lru_cache(maxsize=2)
def _plain_state(lr: float, dims: tuple) -> dict:
    tok = build_char_tokenizer()
    traces = [plain_trace(p) for p in PROMPTS]
    return _memorize(tok, PROMPTS, traces, 120, seed=0, lr=lr, **dict(dims)).state_dict()


def plain_caller(lr: float = 1e-2, **dims):
    """(model, char tokenizer): answers PROMPTS with a plain-format multiply call, then the boxed result.
    dims: the tiny model's sizes (`tiny_random_model` keywords; vLLM's CPU attention needs head_dim 64:
    hidden=128, heads=2, kv_heads=1 memorizes with lr=3e-3); lr: the memorizing Adam's."""
    tok = build_char_tokenizer()
    model = tiny_random_model(tok, seed=0, **dims)
    model.load_state_dict(_plain_state(lr, tuple(sorted(dims.items()))))
    return model, tok


def chat_messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


@functools.lru_cache(maxsize=2)
def _chat_state(prefix_preserving: bool) -> dict:
    tok = chat_tokenizer(prefix_preserving)
    schema = [{"type": "function", "function": {"name": "multiply"}}]
    prompts, targets = [], []
    for p in PROMPTS:
        a, b, c = product(p)
        call = [{"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}]
        convo = chat_messages(p) + [
            {"role": "assistant", "content": "", "tool_calls": call},
            {"role": "tool", "name": "multiply", "content": str(c)},
            {"role": "assistant", "content": f"\\boxed{{{c}}}"}]
        head = tok.apply_chat_template(chat_messages(p), tools=schema, add_generation_prompt=True,
                                       tokenize=False)
        full = tok.apply_chat_template(convo, tools=schema, tokenize=False)
        prompts.append(head)
        targets.append(full[len(head):].removesuffix("<|im_end|>\n"))   # encode_pairs adds the EOS
    return _memorize(tok, prompts, targets, 150, seed=1).state_dict()


def chat_caller(prefix_preserving: bool = True):
    """(model, chat tokenizer): PROMPTS as chat turns calling multiply, Hermes-style, then the answer."""
    tok = chat_tokenizer(prefix_preserving)
    model = tiny_random_model(tok, seed=1)
    model.load_state_dict(_chat_state(prefix_preserving))
    return model, tok
