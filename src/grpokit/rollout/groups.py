"""[A] Group sampling: G completions per prompt, as a `Rollout` (the contract: grpokit.rollout.contract).

Prompts are rendered (chat template, tools), encoded and left-padded here; the decode loop is
grpokit's sampler (`grpokit.rollout.sampler`) or `model.generate`; the ids it returns are laid out by
`assemble_rollout`, the one constructor every source of rollouts shares.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch

from grpokit.model.loading import eval_mode
from grpokit.rewards.scoring import RewardBatch
from grpokit.rollout import sampler
from grpokit.rollout.contract import Rollout, assemble_rollout, concat_rollouts, row_ends
from grpokit.rollout.tree import TreeSpec
from grpokit.rollout.turns import TurnDriver, turn_masks

log = logging.getLogger("grpokit")
prompt_log = logging.getLogger("grpokit.prompts")  # over-long prompts; evaluation reports them once itself


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen if isinstance(gen, (list, tuple)) else [gen])
    return sorted(i for i in ids if i is not None)


def completion_mask_from_ids(completion_ids: torch.Tensor,
                             eos_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask covering tokens up to and including the first EOS; and whether each row has no EOS.

    Returns: (mask [N, T] long, truncated [N] bool) (`row_ends` for rows of the full width).
    """
    return row_ends(completion_ids, eos_ids, None, cut_at_eos=True)


class PromptTooLongError(ValueError):
    """A prompt exceeds max_prompt_length and truncate_prompt is 'error'."""


def encode_prompts(tokenizer, texts: Sequence[str], max_prompt_length: int | None,
                   truncate: str = "left",
                   add_special_tokens: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask [B, P]; over-long prompts lose their oldest tokens (or raise)."""
    rows = [tokenizer(t, add_special_tokens=add_special_tokens)["input_ids"] for t in texts]
    long = [i for i, ids in enumerate(rows) if max_prompt_length is not None and len(ids) > max_prompt_length]
    if long:
        i = long[0]
        if truncate == "error":
            raise PromptTooLongError(
                f"prompt {i} has {len(rows[i])} tokens > rollout.max_prompt_length={max_prompt_length}: "
                "raise the limit or set rollout.truncate_prompt=left")
        more = (f"; {len(long) - 1} more of these {len(rows)} prompts were cut the same way"
                if len(long) > 1 else "")
        prompt_log.warning("prompt %d has %d tokens; keeping its last %d (rollout.max_prompt_length)%s",
                           i, len(rows[i]), max_prompt_length, more)  # one line per batch, not per prompt
        rows = [ids[-max_prompt_length:] for ids in rows]
    P = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (P - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask


def merge_kept_groups(parts, B: int, G: int, pad_id: int):
    """Dynamic sampling: the first B kept groups across rounds, as one rollout with matching rewards.

    parts: (rollout, reward batch, correctness or None, kept group indices) per round.
    """
    rolls, totals, per_func, corrects, steps, left = [], [], {}, [], [], B
    for rollout, scores, correct, keep in parts:
        keep = keep[:left]
        left -= len(keep)
        if not keep:
            continue
        rows = [g * G + j for g in keep for j in range(G)]
        rolls.append(rollout.select(rows))
        totals.append(scores.total[rows])
        for k, v in scores.per_func.items():
            per_func.setdefault(k, []).append(v[rows])
        corrects.append(correct[rows] if correct is not None else torch.full((len(rows),), float("nan")))
        if scores.step_rewards is not None:
            steps.extend(scores.step_rewards[i] for i in rows)
    if not rolls:  # every group was uniform in every round: keep the last round, it gives zero advantage
        rollout, scores, correct, _ = parts[-1]
        return rollout, scores, correct
    merged = RewardBatch(torch.cat(totals), {k: torch.cat(v) for k, v in per_func.items()},
                         sum(p[1].num_errors for p in parts), steps or None)
    return concat_rollouts(rolls, pad_id), merged, torch.cat(corrects)


@torch.no_grad()
def _generate_backend(model, prompt_ids, prompt_mask, max_new_tokens: int, *, temperature: float,
                      top_p: float, top_k: int, eos_ids: list[int], pad_id: int, suppress_eos: bool,
                      greedy: bool = False) -> torch.Tensor:
    """Completion ids [N, <=T] from `model.generate` (the fallback sampler)."""
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": pad_id,
                              "eos_token_id": eos_ids}
    if greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
    if suppress_eos:
        kwargs["min_new_tokens"] = max_new_tokens
    with eval_mode(model):
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
    return out[:, prompt_ids.shape[1]:]


def render_prompts(tokenizer, prompts: Sequence[Any], max_prompt_length: int | None, truncate_prompt: str,
                   chat_template_kwargs: dict | None = None,
                   tools: Sequence[list[dict] | None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts (text, or chat messages rendered with the chat template) -> left-padded ids, mask [B, P].

    tools: per prompt, the tool schemas the chat template renders into it (text prompts: unused)."""
    chat = [isinstance(p, list) for p in prompts]
    extra = [{} if tools is None or not tools[i] else {"tools": tools[i]} for i in range(len(prompts))]
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False,
                                           **(chat_template_kwargs or {}), **extra[i]) if c else p
             for i, (p, c) in enumerate(zip(prompts, chat))]
    return encode_prompts(tokenizer, texts, max_prompt_length, truncate_prompt,
                          add_special_tokens=not any(chat))


def _pad_cat(pieces: list[torch.Tensor], T: int, value: float) -> torch.Tensor:
    """Row blocks [n_i, T_i] right-padded with `value` to T columns, stacked: [sum n_i, T]."""
    return torch.cat([torch.nn.functional.pad(p, (0, T - p.shape[1]), value=value) for p in pieces])


def sample_groups(
    model,
    tokenizer,
    prompts: Sequence[Any],
    group_size: int,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_prompt_length: int | None = None,
    truncate_prompt: str = "left",
    backend: str = "auto",
    suppress_eos: bool = False,
    generation_batch_size: int = 0,
    greedy: bool = False,
    chat_template_kwargs: dict | None = None,
    tools: Sequence[list[dict] | None] | None = None,
    driver: TurnDriver | None = None,
    tree: TreeSpec | None = None,
) -> Rollout:
    """Sample G completions for each prompt with the current policy.

    Args:
        model: a causal LM (its train/eval mode is restored afterwards).
        tokenizer: its tokenizer; prompts are left-padded with its pad token.
        prompts: B prompts, plain text or chat messages (rendered with the chat template).
        group_size: G completions per prompt.
        max_new_tokens: T, the completion length limit.
        temperature: the sampling temperature.
        top_p: nucleus sampling's probability mass (1.0 keeps all tokens).
        top_k: sample among the k likeliest tokens (0 keeps all tokens).
        max_prompt_length: the longest prompt in tokens (None: no limit).
        truncate_prompt: an over-long prompt keeps its last tokens ("left") or raises ("error").
        backend: "auto" (fast sampler when the architecture supports it), "fast" or "generate".
        suppress_eos: never end early (fixed-length completions, for benchmarks).
        generation_batch_size: completions decoded at once (0 = all N), a multiple of G.
        greedy: argmax decoding instead of sampling (evaluation; use group_size=1).
        chat_template_kwargs: extra keywords for the chat template (task.chat_template_kwargs).
        tools: per prompt, the tool schemas rendered into a chat prompt (None: none).
        driver: the N rows' tool loop (`grpokit.agents.driver.ToolDriver`); None: one turn, as always.
        tree: tree rollouts (`grpokit.rollout.tree.TreeSpec`, G = its leaves): each group's completions
            share prefixes, decoded once (grpokit's sampler only).

    Returns:
        A Rollout with N = B * G rows (multi-turn: with model_mask and trajectories).
    """
    prompt_ids, prompt_mask = render_prompts(tokenizer, prompts, max_prompt_length, truncate_prompt,
                                             chat_template_kwargs, tools)
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    eos_ids = eos_token_ids(model, tokenizer)
    use_fast = sampler.choose_backend(model, backend)
    if tree is not None:
        tree.check(backend, use_fast, driver is not None, group_size)
    if driver is not None:
        _begin_turns(model, backend, use_fast, driver, prompt_ids, prompt_mask, group_size)
    B = prompt_ids.shape[0]
    chunk = max(1, (generation_batch_size or B * group_size) // group_size)  # prompts per decode call
    kw = dict(temperature=temperature, top_p=top_p, top_k=top_k, eos_ids=eos_ids,
              pad_id=tokenizer.pad_token_id, suppress_eos=suppress_eos, greedy=greedy)
    pieces, logps = _decode_chunks(model, prompt_ids, prompt_mask, group_size, max_new_tokens, chunk,
                                   use_fast, kw, driver, tree)
    T = max(p.shape[1] for p in pieces)
    completion_ids = _pad_cat(pieces, T, tokenizer.pad_token_id)                  # [N, T]
    if driver is not None:
        return turns_rollout(tokenizer, prompts, prompt_ids, prompt_mask, group_size, completion_ids,
                             _pad_cat(logps, T, 0), driver, eos_ids)
    return assemble_rollout(tokenizer=tokenizer, prompts=prompts, prompt_ids=prompt_ids,
                            prompt_mask=prompt_mask, completion_ids=completion_ids, group_size=group_size,
                            eos_ids=eos_ids, sampling_logprobs=_pad_cat(logps, T, 0) if use_fast else None,
                            tree=tree)


def _decode_chunks(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                   max_new_tokens: int, chunk: int, use_fast: bool, kw: dict[str, Any],
                   driver: TurnDriver | None, tree: TreeSpec | None = None
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Completion ids (and, fast sampler, log-probs) per chunk of `chunk` prompts: [chunk * G, <=T] each."""
    pieces, logps = [], []
    for s in range(0, prompt_ids.shape[0], chunk):
        p_ids, p_mask = prompt_ids[s:s + chunk], prompt_mask[s:s + chunk]
        if use_fast:
            ids, lp = sampler.fast_sample(model, p_ids, p_mask, group_size, max_new_tokens, **kw,
                                          driver=driver, row0=s * group_size, tree=tree)
            logps.append(lp)
        else:
            rep_ids, rep_mask = (p_ids.repeat_interleave(group_size, 0),
                                 p_mask.repeat_interleave(group_size, 0))
            ids = _generate_backend(model, rep_ids, rep_mask, max_new_tokens, **kw)
        pieces.append(ids)
    return pieces, logps


def _begin_turns(model, backend: str, use_fast: bool, driver: TurnDriver, prompt_ids: torch.Tensor,
                 prompt_mask: torch.Tensor, group_size: int) -> None:
    """Multi-turn: grpokit's sampler is required; the driver gets each row's prompt ids."""
    if not use_fast:
        raise ValueError(f"tool calling needs grpokit's sampler, which does not cover this architecture "
                         f"({getattr(model.config, 'model_type', '?')}) or rollout.backend={backend}: use "
                         f"rollout.backend=auto and one of the {len(sampler.FAST_MODEL_TYPES)} "
                         "architectures of grpokit.model.shared_prompts.CACHE_MODEL_TYPES (hybrid "
                         "linear-attention ones are not)")
    rows = [row[m.bool()].tolist() for row, m in zip(prompt_ids, prompt_mask)]
    driver.begin([r for r in rows for _ in range(group_size)])


def turns_rollout(tokenizer, prompts: Sequence[Any], prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                  group_size: int, completion_ids: torch.Tensor, logps: torch.Tensor, driver: TurnDriver,
                  eos_ids: list[int]) -> Rollout:
    """The Rollout of a multi-turn decode (grpokit's sampler or an engine's, grpokit.rollout.vllm_turns):
    completion_ids and logps [N, T]; masks and ends from the driver's trajectories."""
    T = completion_ids.shape[1]
    _, model = turn_masks(driver.trajectories, driver.lengths, T, completion_ids.device)    # [N, T]
    rollout = assemble_rollout(tokenizer=tokenizer, prompts=prompts, prompt_ids=prompt_ids,
                               prompt_mask=prompt_mask, completion_ids=completion_ids, group_size=group_size,
                               eos_ids=eos_ids, lengths=driver.lengths, cut_at_eos=False,
                               sampling_logprobs=logps, model_mask=model, trajectories=driver.trajectories)
    if not any(isinstance(p, list) for p in prompts):
        return rollout
    chat = [traj.messages() if isinstance(p, list) else text          # a chat row's completion: messages
            for p, traj, text in zip(rollout.prompts, driver.trajectories, rollout.completions)]
    return dataclasses.replace(rollout, completions=chat)
