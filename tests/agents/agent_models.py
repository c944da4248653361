"""Tiny models that call tools, made in seconds: a random-init Qwen2 memorizes a few tool-calling traces.

    model, tok = plain_caller()   # "What is 12*34?" -> <tool_call>multiply(12,34)</tool_call>...
    model, tok = chat_caller()    # the same as Hermes chat turns (<|im_start|> ... <|im_end|>)
    model, tok = llama_caller()   # the same as Llama 3.1 turns: bare JSON {"name", "parameters"}, <|eot_id|>
    tok = template_tokenizer(text, eos)   # the char tokenizer under any chat template's text (e.g. TRL's)

Memorizing (a few hundred full-batch Adam steps on a handful of traces) makes the model emit the calls
with high probability even when sampling, so multi-turn rollouts have tool turns to test.
"""

from __future__ import annotations

import functools
import re

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
    "{% if KEEP %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{% elif loop.index0 == ns.last and m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
    "{% elif loop.last %}<think></think>{% endif %}{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# Llama 3.1's tool markup (header ids, a call as bare JSON with "parameters", results as ipython turns,
# <|eot_id|> ending each turn) in a short template: the real one's system prompt is ~600 characters.
LLAMA = (
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\n"
    "{% for t in tools %}{{ t.function.name }} {% endfor %}<|eot_id|>{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% for c in m.tool_calls %}"
    "{\"name\": \"{{ c.function.name }}\", \"parameters\": {{ c.function.arguments | tojson }}}{% endfor %}"
    "<|eot_id|>{% elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

# What a template writes as one token: <|x|>, <|x>, <x|>, DeepSeek's <｜x｜>, Gemma's <eos> / <bos>.
_SPECIAL = re.compile(r"<\|[^<>|\s]+\|>|<\|[a-z_]+>|<[a-z_]+\|>|<｜[^｜]+｜>|<eos>|<bos>")


def template_tokenizer(template: str, eos: list[str]):
    """The char tokenizer with `template` as its chat template: every special-token spelling in the
    template (and in `eos`) one token, non-ASCII characters added; the tokenizer's EOS is eos[0]."""
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": sorted(set(_SPECIAL.findall(template)) | set(eos))})
    tok.add_tokens(sorted({c for c in template if ord(c) > 126}))
    tok.eos_token = eos[0]
    tok.chat_template = template
    return tok


def chat_tokenizer(prefix_preserving: bool = True):
    """The char tokenizer with ChatML special tokens and a Hermes-style tool template; EOS is <|im_end|>.
    prefix_preserving=False: the template keeps only the last assistant turn's reasoning, and, as Qwen3's,
    writes an empty <think></think> on an assistant turn that is the conversation's last message only (so a
    tool-calling turn renders differently once its results follow)."""
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


def _chat_traces(tok) -> tuple[list[str], list[str]]:
    """(prompts, targets): each prompt rendered by `tok`'s template, its target the conversation's rest
    (a multiply call, its result, the boxed answer) without the final EOS, which encode_pairs adds."""
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
        targets.append(full[len(head):].removesuffix("\n").removesuffix(tok.eos_token))
    return prompts, targets


@functools.lru_cache(maxsize=2)
def _chat_state(prefix_preserving: bool) -> dict:
    prompts, targets = _chat_traces(chat_tokenizer(prefix_preserving))
    # lr 5e-3: at 1e-2 Adam's loss spikes near step 130-150 (0.26 at step 150 with 1 thread, 0.05 with 2),
    # so whether the caller calls its tool depended on the thread count; at 5e-3 the loss is 0.005 at both
    return _memorize(chat_tokenizer(prefix_preserving), prompts, targets, 150, seed=1, lr=5e-3).state_dict()


def chat_caller(prefix_preserving: bool = True):
    """(model, chat tokenizer): PROMPTS as chat turns calling multiply, Hermes-style, then the answer."""
    tok = chat_tokenizer(prefix_preserving)
    model = tiny_random_model(tok, seed=1)
    model.load_state_dict(_chat_state(prefix_preserving))
    return model, tok


def llama_tokenizer():
    """The char tokenizer under the Llama-3.1-style template `LLAMA`; EOS is <|eot_id|>."""
    return template_tokenizer(LLAMA, ["<|eot_id|>"])


@functools.lru_cache(maxsize=1)
def _llama_state() -> dict:
    tok = llama_tokenizer()
    prompts, targets = _chat_traces(tok)
    return _memorize(tok, prompts, targets, 150, seed=1, lr=5e-3).state_dict()


def llama_caller():
    """(model, Llama-style tokenizer): PROMPTS answered with a bare-JSON multiply call, then the answer."""
    tok = llama_tokenizer()
    model = tiny_random_model(tok, seed=1)
    model.load_state_dict(_llama_state())
    return model, tok
