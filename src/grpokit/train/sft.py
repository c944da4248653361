"""Supervised warm-up: the built-in demo checkpoint (`builtin:arith-demo`) is made by this file.

    grpokit sft                                   # rebuild src/grpokit/assets/arith-demo (seed 0)
    grpokit sft --out runs/sft --steps 300 --eval-limit 500

A random-init model cannot learn anything from GRPO: every group scores 0 and the advantages vanish.
So the demo starts from a character-level Qwen2 (about 0.8 M parameters) that saw a short
supervised warm-up on the training split of the built-in arithmetic task, and was stopped early on
purpose: greedy held-out accuracy is 29.4% (500 held-out problems), so most groups of G completions are mixed
(some right, some wrong) and GRPO has a learning signal on them.

The warm-up minimizes the completion-token cross-entropy of prompt -> solution + EOS,

    L = - (1 / sum_i |o_i|) * sum_i sum_t log pi(o_{i,t} | q_i, o_{i,<t})

where o_i is the task's `solution` column (``37+58=95. \\boxed{95}``), with AdamW and a learning rate
that decays linearly to 0 at the last step, so where training stops is a property of the schedule,
not of a lucky step. Everything (init, batch order) comes from `--seed`; on the same machine the
result is bit-identical, on another one within float noise.
"""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Sequence

import torch

from grpokit.model.loading import tiny_random_model
from grpokit.model.precision import autocast_for

log = logging.getLogger("grpokit")
TOOL_RESULT = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)   # the plain format's results

# The shipped model's shape (kept small: the GRPO demo must run in minutes on 2 CPU cores).
DEMO_SHAPE = dict(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384, max_positions=128)
# The shipped recipe: `grpokit sft` with no flags reproduces src/grpokit/assets/arith-demo.
DEFAULTS = dict(steps=800, stop_at=210, batch_size=128, learning_rate=2e-3, warmup_steps=30, seed=0)


def encode_pairs(tokenizer, prompts: Sequence[str | list[dict]], targets: Sequence[str],
                 mask_tool_results: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt + target + EOS ids, attention mask and loss mask (targets and EOS only).

    The prompt is tokenized exactly as `rollout.render_prompts` does (chat messages through the chat
    template, then no added special tokens), so training sees the same prompt tokens that sampling will
    condition on. mask_tool_results: tool-calling traces, whose
    <tool_response>...</tool_response> text is the environment's (attended, not trained: as in GRPO).

    Returns:
        (input_ids [B, L], attention_mask [B, L], loss_mask [B, L]); loss_mask[b, t] = 1 where token t
        is a target token (predicted from position t - 1).
    """
    rows, spans, skip = [], [], []
    for prompt, target in zip(prompts, targets):
        if isinstance(prompt, list):   # chat messages: the template's text, its special tokens already in
            text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            p = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            p = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        enc = tokenizer(target, add_special_tokens=False, return_offsets_mapping=mask_tool_results)
        t = enc["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + t)
        spans.append((len(p), len(p) + len(t)))
        results = [m.span() for m in TOOL_RESULT.finditer(target)] if mask_tool_results else []
        skip.append([len(p) + i for i, (a, _) in enumerate(enc.get("offset_mapping") or [])
                     if any(s <= a < e for s, e in results)])
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros((len(rows), L), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), L), dtype=torch.float32)
    for b, (row, (s, e)) in enumerate(zip(rows, spans)):
        ids[b, :len(row)] = torch.tensor(row)
        att[b, :len(row)] = 1
        loss_mask[b, s:e] = 1.0
        loss_mask[b, skip[b]] = 0.0
    return ids, att, loss_mask


def sft_loss(model, ids: torch.Tensor, att: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over target tokens: logits at t - 1 predict token t."""
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()       # [B, L-1, V]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # [B, L-1]
    m = loss_mask[:, 1:]
    return (nll * m).sum() / m.sum().clamp(min=1.0)


def build_demo_model(tokenizer, seed: int, **shape: int):
    """A random-init character-level Qwen2 of `DEMO_SHAPE` (float32), `shape` overriding its entries
    (the code demo's prompts need max_positions=512)."""
    return tiny_random_model(tokenizer, seed=seed, **(DEMO_SHAPE | shape))


def train_sft(model, tokenizer, examples: Sequence, steps: int, batch_size: int, learning_rate: float,
              warmup_steps: int, seed: int, stop_at: int | None = None, log_every: int = 50,
              mask_tool_results: bool = False) -> list[dict[str, float]]:
    """Supervised fine-tuning on (prompt, columns['solution']) pairs; returns the logged rows.

    Batches are drawn by a seeded shuffle of the examples (reshuffled every epoch). The learning rate
    warms up linearly for `warmup_steps`, then decays linearly to 0 at `steps`; training stops after
    `stop_at` of those steps (default: all; a stop_at past `steps` stops at `steps`: the rate is 0 there),
    which is how the demo model is kept imperfect.
    """
    rng = random.Random(seed)
    order: list[int] = []
    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warmup_steps if s < warmup_steps
                                              else max(0.0, (steps - s) / max(1, steps - warmup_steps)))
    model.train()
    rows, start = [], time.perf_counter()
    last = min(stop_at or steps, steps)
    for step in range(1, last + 1):
        if len(order) < batch_size:
            extra = list(range(len(examples)))
            rng.shuffle(extra)
            order += extra
        batch, order = [examples[i] for i in order[:batch_size]], order[batch_size:]
        ids, att, mask = encode_pairs(tokenizer, [ex.prompt for ex in batch],
                                      [ex.columns["solution"] for ex in batch], mask_tool_results)
        with autocast_for(model):   # model.precision=bf16: bf16 matmuls, fp32 weights and AdamW state
            loss = sft_loss(model, ids, att, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == last:
            rows.append({"step": step, "loss": loss.item(), "lr": sched.get_last_lr()[0],
                         "seconds": time.perf_counter() - start})
            log.info("sft step %d loss=%.4f lr=%.2e (%.0fs)", step, rows[-1]["loss"], rows[-1]["lr"],
                     rows[-1]["seconds"])
    return rows
