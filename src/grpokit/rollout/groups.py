"""[A] Group sampling: G completions per prompt, and the `Rollout` contract between sampling and update.

Nothing downstream of a Rollout touches the sampler or re-tokenizes text: the completion token ids
are kept exactly as generated. Two masks mean two things: `completion_mask`, what the model attends to
(every real completion token), and `loss_mask`, what the loss trains (the tokens the policy sampled). In
a single-turn rollout they are the same tensor; a multi-turn rollout (tools, environments:
`grpokit.rollout.turns`) also has the environment's tokens between model turns, attended and never
trained, and a `Trajectory` per row (`grpokit.rollout.trajectory`) with its turns and tool calls.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.model.loading import eval_mode
from grpokit.rewards.scoring import RewardBatch
from grpokit.rollout import sampler
from grpokit.rollout.trajectory import Trajectory
from grpokit.rollout.tree import TreeSpec
from grpokit.rollout.turns import TurnDriver, turn_masks

log = logging.getLogger("grpokit")
prompt_log = logging.getLogger("grpokit.prompts")  # over-long prompts; evaluation reports them once itself


@dataclass
class Rollout:
    """One generation batch: N = B * G completions, the G of each prompt contiguous.

    Shapes: P = longest prompt (left-padded), T = longest completion (right-padded).
    """

    prompt_ids: torch.Tensor          # [N, P] long, left-padded with pad_token_id
    prompt_mask: torch.Tensor         # [N, P] long, 1 on real prompt tokens
    completion_ids: torch.Tensor      # [N, T] long, as sampled (and inserted); pad after the end
    completion_mask: torch.Tensor     # [N, T] long, attention: 1 up to and including the first EOS (one
                                      # turn) / the last token of the trajectory (several turns)
    group_ids: torch.Tensor           # [N] long, index of the prompt (0..B-1) each row answers
    completions: list[Any]            # N decoded texts (special tokens skipped); chat multi-turn: messages
    prompts: list[Any]                # N prompts (text or chat messages), each repeated G times
    truncated: torch.Tensor           # [N] bool, no EOS within max_new_tokens
    group_size: int                   # G
    # [N, T] each sampled token's log-prob as the sampler reports it: grpokit's decode loop, under the
    # temperature-scaled full distribution (the trainer's own pi_old); vLLM, after its top-k / top-p as
    # well ("processed"), the same thing only when top_p = 1 and top_k = 0 (docs/vllm.md)
    sampling_logprobs: torch.Tensor | None = None
    # [N, T] long, 1 on the tokens the policy sampled, 0 on environment tokens and padding; None: every
    # completion token was sampled (one turn: the same as completion_mask)
    model_mask: torch.Tensor | None = None
    trajectories: list[Trajectory] | None = None  # N records (turns, tool calls, stop); None: one turn
    policy_lag: int = 0   # rollout.async: policy versions between the sampling weights and the trainer's

    @property
    def loss_mask(self) -> torch.Tensor:
        """[N, T] the tokens the loss trains: the policy's own (environment tokens are attended only)."""
        return self.completion_mask if self.model_mask is None else self.model_mask

    @property
    def input_ids(self) -> torch.Tensor:
        """[N, P + T] prompt then completion, the layout `per_token_logprobs` takes."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[N, P + T]: prompt mask then completion mask."""
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """[N] valid tokens per completion (EOS included)."""
        return self.completion_mask.sum(-1)

    def to(self, device: torch.device | str | None) -> Rollout:
        """The same rollout with its tensors on `device` (itself when they are there already, or None):
        rollouts built on the CPU (a vLLM server's samples, a rollout_func's ids) meet a CUDA policy."""
        fields = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "group_ids", "truncated",
                  "sampling_logprobs", "model_mask")
        tensors = {f: getattr(self, f) for f in fields if getattr(self, f) is not None}
        if device is None or all(t.device == torch.device(device) for t in tensors.values()):
            return self
        return dataclasses.replace(self, **{f: t.to(device) for f, t in tensors.items()})

    def select(self, rows: torch.Tensor | Sequence[int]) -> Rollout:
        """A Rollout of the given rows (whole groups, in order), e.g. for dynamic sampling."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        pick = idx.tolist()
        lp = None if self.sampling_logprobs is None else self.sampling_logprobs[idx]
        model = None if self.model_mask is None else self.model_mask[idx]
        trajectories = None if self.trajectories is None else [self.trajectories[i] for i in pick]
        return Rollout(self.prompt_ids[idx], self.prompt_mask[idx], self.completion_ids[idx],
                       self.completion_mask[idx], self.group_ids[idx], [self.completions[i] for i in pick],
                       [self.prompts[i] for i in pick], self.truncated[idx], self.group_size, lp, model,
                       trajectories, self.policy_lag)


def concat_rollouts(parts: Sequence[Rollout], pad_token_id: int) -> Rollout:
    """Stack rollouts (prompts re-padded on the left, completions on the right); group ids renumbered."""
    P = max(r.prompt_ids.shape[1] for r in parts)
    T = max(r.completion_ids.shape[1] for r in parts)

    def lpad(x: torch.Tensor, width: int, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def rpad(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    group_ids, offset = [], 0
    for r in parts:
        group_ids.append(r.group_ids - r.group_ids.min() + offset if r.group_ids.numel() else r.group_ids)
        offset += int(r.group_ids.numel() // r.group_size)
    has_lp = all(r.sampling_logprobs is not None for r in parts)
    turns = any(r.model_mask is not None for r in parts)
    return Rollout(
        prompt_ids=torch.cat([lpad(r.prompt_ids, P, pad_token_id) for r in parts]),
        prompt_mask=torch.cat([lpad(r.prompt_mask, P, 0) for r in parts]),
        completion_ids=torch.cat([rpad(r.completion_ids, T, pad_token_id) for r in parts]),
        completion_mask=torch.cat([rpad(r.completion_mask, T, 0) for r in parts]),
        group_ids=torch.cat(group_ids),
        completions=[c for r in parts for c in r.completions],
        prompts=[p for r in parts for p in r.prompts],
        truncated=torch.cat([r.truncated for r in parts]),
        group_size=parts[0].group_size,
        sampling_logprobs=torch.cat([rpad(r.sampling_logprobs, T, 0.0) for r in parts]) if has_lp else None,
        model_mask=torch.cat([rpad(r.loss_mask, T, 0) for r in parts]) if turns else None,
        trajectories=[t for r in parts for t in (r.trajectories or [Trajectory()] * len(r.prompts))]
        if turns else None,
    )


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen if isinstance(gen, (list, tuple)) else [gen])
    return sorted(i for i in ids if i is not None)


def completion_mask_from_ids(completion_ids: torch.Tensor,
                             eos_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask covering tokens up to and including the first EOS; and whether each row has no EOS.

    Returns: (mask [N, T] long, truncated [N] bool).
    """
    T = completion_ids.shape[1]
    is_eos = torch.isin(completion_ids, torch.tensor(list(eos_ids), device=completion_ids.device))
    has_eos = is_eos.any(-1)                                              # [N]
    first = torch.where(has_eos, is_eos.int().argmax(-1), torch.full_like(has_eos, T, dtype=torch.long))
    mask = (torch.arange(T, device=completion_ids.device)[None, :] <= first[:, None]).long()
    return mask, ~has_eos


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
    mask, truncated = completion_mask_from_ids(completion_ids, eos_ids)
    completion_ids = torch.where(mask.bool(), completion_ids,
                                 torch.full_like(completion_ids, tokenizer.pad_token_id))
    sampling_logprobs = _pad_cat(logps, T, 0) * mask if use_fast else None        # [N, T]
    texts_out = tokenizer.batch_decode(completion_ids.tolist(), skip_special_tokens=True)
    rep = prompt_ids.repeat_interleave(group_size, 0), prompt_mask.repeat_interleave(group_size, 0)
    texts_in = [p for p in prompts for _ in range(group_size)]
    return Rollout(prompt_ids=rep[0], prompt_mask=rep[1], completion_ids=completion_ids, completion_mask=mask,
                   group_ids=torch.arange(B, device=device).repeat_interleave(group_size),
                   completions=texts_out, prompts=texts_in, truncated=truncated, group_size=group_size,
                   sampling_logprobs=sampling_logprobs)


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
                         f"({getattr(model.config, 'model_type', '?')}) or rollout.backend={backend}: "
                         f"use a model of {', '.join(sampler.FAST_MODEL_TYPES)} and rollout.backend=auto")
    rows = [row[m.bool()].tolist() for row, m in zip(prompt_ids, prompt_mask)]
    driver.begin([r for r in rows for _ in range(group_size)])


def turns_rollout(tokenizer, prompts: Sequence[Any], prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                  group_size: int, completion_ids: torch.Tensor, logps: torch.Tensor, driver: TurnDriver,
                  eos_ids: list[int]) -> Rollout:
    """The Rollout of a multi-turn decode (grpokit's sampler or an engine's, grpokit.rollout.vllm_turns):
    completion_ids and logps [N, T]; masks and ends from the driver's trajectories."""
    N, T = completion_ids.shape
    mask, model = turn_masks(driver.trajectories, driver.lengths, T, completion_ids.device)    # [N, T] each
    completion_ids = torch.where(mask.bool(), completion_ids, torch.full_like(completion_ids,
                                                                              tokenizer.pad_token_id))
    ends = (torch.tensor(driver.lengths, device=mask.device) - 1).clamp(min=0)[:, None]   # [N, 1]
    truncated = ~torch.isin(completion_ids.gather(1, ends)[:, 0],
                            torch.tensor(eos_ids, device=mask.device))              # [N] no EOS at the end
    rows = [p for p in prompts for _ in range(group_size)]
    texts = tokenizer.batch_decode(completion_ids.tolist(), skip_special_tokens=True)
    completions = [traj.messages() if isinstance(p, list) else text
                   for p, traj, text in zip(rows, driver.trajectories, texts)]
    B = prompt_ids.shape[0]
    return Rollout(prompt_ids=prompt_ids.repeat_interleave(group_size, 0),
                   prompt_mask=prompt_mask.repeat_interleave(group_size, 0), completion_ids=completion_ids,
                   completion_mask=mask,
                   group_ids=torch.arange(B, device=mask.device).repeat_interleave(group_size),
                   completions=completions, prompts=rows, truncated=truncated, group_size=group_size,
                   sampling_logprobs=logps * model, model_mask=model, trajectories=driver.trajectories)
