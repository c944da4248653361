"""Tree rollouts: each group of G completions is a tree whose leaves share prefixes (`rollout.tree.*`).

    rollout.tree.widths   = [w_0, w_1, ..., w_D]     children per node at each depth; G = w_0 * ... * w_D
    rollout.tree.branch_at = [b_1 < ... < b_D]       token counts where every path branches

The root (the prompt) has w_0 children; each path decodes its first b_1 tokens once, then forks into w_1
paths that share those tokens, each decodes up to b_2, forks into w_2, and so on; below the last branch
point every path decodes on to EOS or `max_completion_length`. Branch points are fixed token counts (not
step separators or high-entropy tokens): every live path forks at the same column, so the decode batch
stays one rectangle and the leaf layout is known before sampling. A leaf is a full completion, so the
rest of GRPO sees an ordinary Rollout: leaf j of group b is row b*G + j, and leaves below one node are
contiguous (node at depth d covers G / (w_0 * ... * w_d) rows).

Forking the KV cache: the decode loop (`decode_loop.decode` with `TreeRows`) runs the sampler's own
engines; at a branch point each live row's cache (prompt and the tokens so far) is copied into w_d rows
by the engine's `keep_rows` with repeated indices (the same call that drops finished rows), and the w_d
children draw their next tokens independently. No prefix is decoded twice: a node's tokens are decoded
by one row and written to every leaf below it. A path that ends (EOS) before a branch point does not
fork: its leaves are copies of it (identical completions, decoded once), so every group still has G
leaves.

Generated tokens: `decoded_tokens` counts each node's tokens once (what the loop decoded); flat sampling
of the same leaves would decode the sum of their lengths. Advantages over the tree:
`grpokit.core.advantages.tree_advantages`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpokit.rollout.decode_loop import Rows


@dataclass(frozen=True)
class TreeSpec:
    """The shape of every group's tree: children per depth, and the token counts where paths fork."""

    widths: tuple[int, ...]
    branch_at: tuple[int, ...]

    @property
    def leaves(self) -> int:
        """G: leaves per tree."""
        return math.prod(self.widths)

    def block(self, depth: int) -> int:
        """Leaves below one node at `depth` (0: a child of the root)."""
        return self.leaves // math.prod(self.widths[:depth + 1])

    def segments(self, T: int) -> list[tuple[int, int]]:
        """Column range [start, end) of each depth's tokens, for completions of width T."""
        cuts = [0, *(min(b, T) for b in self.branch_at), T]
        return list(zip(cuts[:-1], cuts[1:]))

    def check(self, backend: str, fast: bool, turns: bool, group_size: int) -> None:
        """Raise ValueError unless grpokit's sampler decodes one turn of `group_size` = G leaves."""
        if not fast or turns or self.leaves != group_size:
            raise ValueError(f"tree rollouts need grpokit's sampler (backend={backend} chose "
                             f"{'it' if fast else 'model.generate'}), one turn, and group_size = the tree's "
                             f"{self.leaves} leaves (got {group_size})")

    @staticmethod
    def of(rollout_cfg) -> TreeSpec | None:
        """The config's tree (rollout.tree.widths / branch_at), or None for flat sampling."""
        if not rollout_cfg.tree_widths:
            return None
        return TreeSpec(tuple(int(w) for w in rollout_cfg.tree_widths),
                        tuple(int(b) for b in rollout_cfg.tree_branch_at))


def decoded_tokens(completion_mask: torch.Tensor, spec: TreeSpec) -> int:
    """Tokens the tree sampler decoded for these rows: each node's segment once (its first leaf's).

    completion_mask: [N, T] (N = B * G, a group's leaves contiguous, in the tree's order)."""
    total = 0
    for depth, (s, e) in enumerate(spec.segments(completion_mask.shape[1])):
        first = completion_mask[::spec.block(depth)]                         # [nodes at depth, T]
        total += int(first[:, s:e].sum())
    return total


class TreeRows(Rows):
    """A tree's rows for the decode loop (`grpokit.rollout.decode_loop.decode`): the live rows are nodes;
    at a branch point each forks into w children (the engine's `keep_rows` with repeated indices); each
    draw is written to every leaf below its node.

    N = B * G leaves (the engine holds each prompt prefilled once, row b*G for prompt b). every: look for
    finished rows every this many steps (a host sync on CUDA; forks always look). The loop returns
    (tokens [N, T'], sampling log-probs [N, T']), the leaves in tree order; past a row's EOS: padding."""

    def __init__(self, N: int, spec: TreeSpec, max_new_tokens: int, pad_id: int, device, *,
                 eos_ids: list[int], every: int = 1) -> None:
        super().__init__(N, max_new_tokens, pad_id, device, every)
        self.G, self.eos = spec.leaves, torch.tensor(eos_ids, device=device)
        # live rows: the root's w_0 children of each prompt; row r writes leaves first[r] .. + size - 1
        self.size = spec.block(0)
        self.first = torch.arange(0, N, self.size, device=device)                 # [B * w_0]
        self.forks = {b: w for b, w in zip(spec.branch_at, spec.widths[1:]) if w > 1}   # width 1: no fork
        self.done = torch.zeros(self.first.numel(), dtype=torch.bool, device=device)

    def start(self, engine) -> torch.Tensor:
        keep = (self.first // self.G) * self.G               # the engine's prompt rows: b*G holds prompt b
        logits = engine.first_logits()[keep]
        engine.keep_rows(keep, 0)
        return logits

    def before_draw(self, t: int, logits: torch.Tensor, engine) -> torch.Tensor:
        if t in self.forks:             # fork: each live row into w children (finished rows stop here)
            w = self.forks[t]
            self.size //= w
            live = (~self.done).nonzero().squeeze(-1)
            keep = live.repeat_interleave(w)
            self.first = (self.first[live][:, None]
                          + torch.arange(w, device=live.device) * self.size).reshape(-1)
            logits, self.done = logits[keep], self.done[keep]
            engine.keep_rows(keep, t)
        return logits.float()

    def drawn(self, t: int, tok: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
        leaves = self.first[:, None] + torch.arange(self.size, device=tok.device)  # [n, size]
        self.tokens[leaves, t] = tok[:, None].expand_as(leaves)  # after a row's EOS: masked by the caller
        self.logps[leaves, t] = lp[:, None].expand_as(leaves)
        self.done |= torch.isin(tok, self.eos)
        return tok

    def check(self, t: int) -> bool:
        return super().check(t) or (t + 1) in self.forks

    def finished(self) -> torch.Tensor:
        return self.done

    def keep(self, keep: torch.Tensor, t: int) -> None:
        self.first, self.done = self.first[keep], self.done[keep]
