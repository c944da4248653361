"""[A] The `Rollout` contract between sampling and update, and the one place a Rollout is laid out from
sampled ids: grpokit's sampler (one turn and tool turns), a vLLM engine's samples, MCTS's trajectories and
TRL's `rollout_func` all end in `assemble_rollout`.

Nothing downstream of a Rollout touches the sampler or re-tokenizes text: the completion token ids
are kept exactly as generated. Two masks mean two things: `completion_mask`, what the model attends to
(every real completion token), and `loss_mask`, what the loss trains (the tokens the policy sampled). In
a single-turn rollout they are the same tensor; a multi-turn rollout (tools, environments:
`grpokit.rollout.turns`) also has the environment's tokens between model turns, attended and never
trained, and a `Trajectory` per row (`grpokit.rollout.trajectory`) with its turns and tool calls.

    assemble_rollout(tokenizer=..., prompts=B prompts, prompt_ids=[B, P], prompt_mask=[B, P],
                     completion_ids=[N, T], group_size=G, eos_ids=..., lengths=[N] | None, ...)

What it decides, once for every source:
- a row's valid tokens are its first `lengths[i]` (all T when None), ended after its first EOS when
  `cut_at_eos` (one turn; a multi-turn row's EOS ends a model turn, not the row);
- ids past a row's end are the pad id; `sampling_logprobs` are 0 wherever the loss does not train;
- `truncated`: the row's last valid token is not an EOS (an empty row is truncated);
- prompts are one per group, repeated G times (or one per row: `prompts_per_row`), group ids 0..B-1;
- every tensor on `device` (default: the prompt ids' device).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.rollout.trajectory import Trajectory
from grpokit.rollout.tree import TreeSpec


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
    # What the sampler knows of its rows, said here rather than re-derived from the config downstream:
    tree: TreeSpec | None = None      # the groups were sampled as trees of this shape (rollout.tree.*):
                                      # advantages add each segment's term, metrics count nodes once
    unrun: torch.Tensor | None = None  # [N] bool, MCTS: simulations the token budget left unrun (empty
                                       # rows: rewards NaN, out of their group's mean and std)
    reward_kwargs: dict[str, list] = field(default_factory=dict)  # per-row keywords for the reward
                                      # functions beside the columns: environments=, rollout_func's fields
    sampler_stats: dict[str, float] = field(default_factory=dict)  # the sampler's sums for the step's
                                      # metrics (MCTS: decoded and prefill tokens, nodes, values)

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
        tensors = {f: getattr(self, f) for f in _TENSOR_FIELDS if getattr(self, f) is not None}
        if device is None or all(t.device == torch.device(device) for t in tensors.values()):
            return self
        return dataclasses.replace(self, **{f: t.to(device) for f, t in tensors.items()})

    def select(self, rows: torch.Tensor | Sequence[int]) -> Rollout:
        """A Rollout of the given rows (whole groups, in order), e.g. for dynamic sampling."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        pick = idx.tolist()
        tensors = {f: getattr(self, f)[idx] for f in _TENSOR_FIELDS if getattr(self, f) is not None}
        lists = {f: [getattr(self, f)[i] for i in pick] for f in ("completions", "prompts", "trajectories")
                 if getattr(self, f) is not None}
        kwargs = {k: [v[i] for i in pick] for k, v in self.reward_kwargs.items()}
        return dataclasses.replace(self, **tensors, **lists, reward_kwargs=kwargs)


_TENSOR_FIELDS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "group_ids", "truncated",
                  "sampling_logprobs", "model_mask", "unrun")


def plain_fields(rollout: Rollout) -> dict[str, Any]:
    """The Rollout's fields as tensors, lists, numbers and dicts (loadable with weights_only=True): the
    tree as its two tuples; without the trajectories and the reward keywords (live objects, read before
    a rollout is stored)."""
    out = {f.name: getattr(rollout, f.name) for f in dataclasses.fields(rollout)
           if f.name not in ("trajectories", "reward_kwargs", "tree")}
    out["tree"] = None if rollout.tree is None else (rollout.tree.widths, rollout.tree.branch_at)
    return out


def from_plain(fields: dict[str, Any], **more: Any) -> Rollout:
    """The Rollout `plain_fields` describes (plus `more`, e.g. its trajectories)."""
    tree = fields.get("tree")
    spec = None if tree is None else TreeSpec(tuple(tree[0]), tuple(tree[1]))
    return Rollout(**{**fields, "tree": spec}, **more)


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
        tree=parts[0].tree if all(r.tree == parts[0].tree for r in parts) else None,
        unrun=torch.cat([r.unrun if r.unrun is not None else torch.zeros_like(r.truncated) for r in parts])
        if any(r.unrun is not None for r in parts) else None,
        reward_kwargs={k: [v for r in parts for v in r.reward_kwargs.get(k, [None] * len(r.prompts))]
                       for k in dict.fromkeys(k for r in parts for k in r.reward_kwargs)},
        sampler_stats={k: sum(r.sampler_stats.get(k, 0.0) for r in parts)
                       for k in dict.fromkeys(k for r in parts for k in r.sampler_stats)},
    )


def pad_rows(rows: Sequence[Sequence[float]], width: int, value: float, *, left: bool = False,
             dtype: torch.dtype = torch.long) -> torch.Tensor:
    """[len(rows), width]: each row padded with `value` on the right (or the left) to `width` columns."""
    pads = [[value] * (width - len(r)) for r in rows]
    return torch.tensor([list(p) + list(r) if left else list(r) + list(p) for p, r in zip(pads, rows)],
                        dtype=dtype).reshape(len(rows), width)


def row_ends(completion_ids: torch.Tensor, eos_ids: Sequence[int], lengths: torch.Tensor | None,
             cut_at_eos: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(completion_mask [N, T] long, truncated [N] bool) by the rules in this module's docstring."""
    N, T = completion_ids.shape
    cols = torch.arange(T, device=completion_ids.device)[None, :]                  # [1, T]
    within = (cols < lengths[:, None]) if lengths is not None else torch.ones(N, T, dtype=torch.bool,
                                                                             device=cols.device)
    is_eos = torch.isin(completion_ids, torch.tensor(list(eos_ids), device=cols.device)) & within  # [N, T]
    if cut_at_eos:
        has_eos = is_eos.any(-1)                                                    # [N]
        first = torch.where(has_eos, is_eos.int().argmax(-1), torch.full_like(has_eos, T, dtype=torch.long))
        return ((cols <= first[:, None]) & within).long(), ~has_eos
    n = within.sum(-1)                                                              # [N] valid tokens
    last = is_eos.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0]                    # [N] last one an EOS
    return within.long(), ~(last & (n > 0))


def assemble_rollout(*, tokenizer, prompts: Sequence[Any], prompt_ids: torch.Tensor,
                     prompt_mask: torch.Tensor, completion_ids: torch.Tensor, group_size: int,
                     eos_ids: Sequence[int],
                     lengths: torch.Tensor | Sequence[int] | None = None, cut_at_eos: bool = True,
                     sampling_logprobs: torch.Tensor | None = None, model_mask: torch.Tensor | None = None,
                     trajectories: list[Trajectory] | None = None, completions: list[Any] | None = None,
                     prompts_per_row: bool = False, device: torch.device | str | None = None,
                     tree: TreeSpec | None = None, unrun: torch.Tensor | None = None,
                     reward_kwargs: dict[str, list] | None = None,
                     sampler_stats: dict[str, float] | None = None) -> Rollout:
    """A Rollout of N = B * G rows from its sampled ids.

    Args:
        prompts: B prompts (or N with `prompts_per_row`); prompt_ids / prompt_mask: [B or N, P] left-padded.
        completion_ids: [N, T] as sampled; whatever stands past a row's end is replaced by the pad id.
        lengths: [N] each row's own length (an engine's sample, a turn loop's trajectory); None: T.
        cut_at_eos: the row ends at its first EOS (one turn); False: at `lengths` (tool turns, MCTS,
            rollout_func, whose EOS ends a turn or the row's last token).
        sampling_logprobs: [N, T] the sampler's log-probs, zeroed where the loss does not train; None: none.
        model_mask: [N, T] the tokens the policy sampled (multi-turn); None: every valid token.
        trajectories: per row, kept as given (multi-turn); None: one turn.
        completions: per row, kept as given; None: the decoded ids (special tokens skipped).
        tree: the groups' tree shape (tree rollouts); None: flat.
        unrun: [N] bool, rows the sampler did not run (MCTS); None: every row ran.
        reward_kwargs: per-row keywords for the reward functions; sampler_stats: the sampler's sums.
    """
    device = prompt_ids.device if device is None else torch.device(device)
    ids = completion_ids.to(device)
    n_len = None if lengths is None else torch.as_tensor(lengths, dtype=torch.long, device=device)
    mask, truncated = row_ends(ids, eos_ids, n_len, cut_at_eos)                    # [N, T], [N]
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, tokenizer.pad_token_id))
    model = None if model_mask is None else model_mask.to(device) * mask
    trained = mask if model is None else model
    logps = None if sampling_logprobs is None else sampling_logprobs.to(device) * trained
    G, N = group_size, ids.shape[0]
    repeat = 1 if prompts_per_row else G
    if completions is None:
        completions = tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)
    return Rollout(prompt_ids=prompt_ids.to(device).repeat_interleave(repeat, 0),
                   prompt_mask=prompt_mask.to(device).repeat_interleave(repeat, 0), completion_ids=ids,
                   completion_mask=mask, group_ids=torch.arange(N // G, device=device).repeat_interleave(G),
                   completions=list(completions), prompts=[p for p in prompts for _ in range(repeat)],
                   truncated=truncated, group_size=G, sampling_logprobs=logps, model_mask=model,
                   trajectories=trajectories, tree=tree,
                   unrun=None if unrun is None else unrun.to(device).bool(),
                   reward_kwargs=dict(reward_kwargs or {}), sampler_stats=dict(sampler_stats or {}))
