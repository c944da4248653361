"""What a learned reward model reads: one text per (prompt, completion), and where its steps end.

The same two functions feed scoring (`grpokit.rewards.outcome_rm`) and training (`grpokit rm`), so a
reward model is trained on exactly the texts it later scores:

    text, start = rm_input(tokenizer, prompt, completion)   # completion = text[start:]
    spans = split_steps(completion, "\\n")                   # [(start, end), ...] char spans of its steps

A chat prompt (a list of messages) goes through the reward tokenizer's chat template with the
completion as the assistant turn (TRL's format); a plain prompt is joined with its completion. With
`last_turn=True` a chat prompt keeps only its system messages and its last message (the question): the
policy's few-shot demonstrations, earlier turns of the same prompt, are not the RM's to read, and on
GSM8K with two demonstrations they are two thirds of every input's tokens. A folder trained so records
it (grpokit_rm.json "last_turn") and scores the same way.
"""

from __future__ import annotations

import bisect
from typing import Any

from grpokit.rewards.steps import token_char_ends

ESCAPES = {"\\n": "\n", "\\t": "\t", "\\r": "\r", "\\\\": "\\"}


def separator_flag(text: str) -> str:
    """A step separator as given on the command line, its backslash escapes read: `--step-separator '\\n'`
    (what a shell passes for '\\n') is a newline, as in the config file's "\\n"."""
    out, i = [], 0
    while i < len(text):
        pair = text[i:i + 2]
        if pair in ESCAPES:
            out.append(ESCAPES[pair])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def completion_text(completion: Any) -> str:
    """A completion as text: a string, or the content of the last message of a chat completion."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def question_turns(prompt: list) -> list:
    """A chat prompt's system messages and its last message: what `rm_input(last_turn=True)` reads."""
    return [m for m in prompt[:-1] if isinstance(m, dict) and m.get("role") == "system"] + prompt[-1:]


def rm_input(tokenizer: Any, prompt: Any, completion: Any, *, last_turn: bool = False) -> tuple[str, int]:
    """The reward model's text for one sample and the char index where the completion starts in it."""
    body = completion_text(completion)
    if isinstance(prompt, list) and last_turn:
        prompt = question_turns(prompt)
    if isinstance(prompt, list):
        messages = [*prompt, {"role": "assistant", "content": body}]
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False)
        else:
            text = "\n".join(str(m["content"]) for m in messages)
        start = text.rfind(body) if body else len(text)
        return text, max(start, 0)
    head = str(prompt)
    return head + body, len(head)


def split_steps(text: str, separator: str) -> list[tuple[int, int]]:
    """Char spans (start, end) of the reasoning steps of a completion.

    A step is the text up to and including the next `separator`; the text after the last separator
    is the final step. Pieces that are only whitespace are not steps (they join no span).

        split_steps("12+34=46. \\\\boxed{46}", ". ")  ->  [(0, 10), (10, 20)]
    """
    spans, start = [], 0
    while start < len(text):
        cut = text.find(separator, start)
        end = len(text) if cut < 0 else cut + len(separator)
        if text[start:end].strip():
            spans.append((start, end))
        start = end
    return spans


def rm_tokens(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """The reward model's token ids for `text` (no special tokens added: a chat template writes its own)
    and the char end of each token in `text` (non-decreasing; token t covers text up to ends[t])."""
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ends, top = [], 0
        for _, end in enc["offset_mapping"]:
            top = max(top, int(end))
            ends.append(top)
        return list(enc["input_ids"]), ends
    # a slow tokenizer has no offsets: decode prefixes instead
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids), token_char_ends(tokenizer, ids, skip_special_tokens=False)


def step_token_positions(text: str, ends: list[int], completion_start: int,
                         spans: list[tuple[int, int]]) -> list[int]:
    """The RM token index that scores each step: the token holding the step's last non-space character.

    `spans` are `split_steps` spans of the completion (relative to `completion_start` in `text`);
    `ends` the token char ends from `rm_tokens`. The separator's trailing whitespace is not part of
    the step's score position, so a tokenizer that glues a space to the next word does not let the
    next step leak into this step's score.
    """
    positions = []
    for start, end in spans:
        piece = text[completion_start + start:completion_start + end]
        last = completion_start + start + len(piece.rstrip()) - 1   # the step's last non-space char
        positions.append(min(bisect.bisect_right(ends, last), len(ends) - 1))
    return positions
