"""Micro-batches for the log-prob passes: which rows run together, so padding and prompts cost little.

A pass over rows R costs about (token-slots of its decoder input) + a fixed launch cost. Two layouts:

- every row runs its own prompt (`length_buckets` over prompt + completion lengths):
  |R| x max_len(R) + overhead;
- rows that share a prompt run it once (`shared_prompts.shared_prompt_hidden`; a GRPO group of G rows):
  U(R) x max_prompt(R) + |R| x max_completion(R) + overhead, with U(R) the distinct prompts in R.

`micro_batches` picks the second cost model when it is given the prompts (the caller knows the model
shares them). Sorting every row by total length, as the first does, mixes rows of different prompts, so
a micro-batch of 8 rows from 8 prompts runs 8 prompts: on GSM8K (prompts of ~470 tokens, completions of
~160) that is about twice the token-slots of one group per micro-batch.
"""

from __future__ import annotations

import torch


def length_buckets(lengths: torch.Tensor, max_rows: int, overhead_tokens: float) -> list[torch.Tensor]:
    """Split rows into micro-batches of similar length, so padding costs little.

    Each micro-batch is trimmed to its longest row, so its cost is rows x max_length token-slots, plus a
    fixed launch cost of `overhead_tokens` (Python and kernel overhead of one forward + backward, in
    token-equivalents). Rows are sorted by length (longest first) and cut by dynamic programming into
    consecutive groups of at most `max_rows` that minimize

        sum_groups (rows_g * max_len_g + overhead_tokens).

    Equal lengths give ceil(N / max_rows) groups in order, the plain micro-batching.

    Args:
        lengths: [N] tokens per row (prompt + completion, or completion alone).
        max_rows: largest micro-batch.
        overhead_tokens: the launch cost of one micro-batch in token-slots.

    Returns:
        Index tensors (long) of the rows of each micro-batch, longest group first.
    """
    N = lengths.numel()
    order = torch.sort(lengths, descending=True, stable=True).indices
    if N == 0 or bool((lengths == lengths.max()).all()):
        return [order[s:s + max_rows] for s in range(0, N, max_rows)] if N else []
    sl = lengths[order].tolist()
    best = [0.0] + [float("inf")] * N                                     # best[j]: cost of rows [0, j)
    cut = [0] * (N + 1)
    for j in range(1, N + 1):
        for i in range(max(0, j - max_rows), j):                          # group [i, j) has max length sl[i]
            c = best[i] + (j - i) * sl[i] + overhead_tokens
            if c < best[j]:
                best[j], cut[j] = c, i
    groups, j = [], N
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def prompt_buckets(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_lengths: torch.Tensor,
                   max_rows: int, overhead_tokens: float) -> list[torch.Tensor]:
    """Micro-batches for a pass that runs each distinct prompt once: rows of one prompt stay together.

    1. Each prompt's rows (a GRPO group) are cut by `length_buckets` on their completion lengths, with
       the prompt's length added to the launch cost: a cut pays the prompt again.
    2. These chunks, longest completion first, are joined into micro-batches of at most `max_rows`
       rows by a DP over consecutive chunks minimizing
       sum (chunks x max_prompt + rows x max_completion + overhead_tokens).

    Args:
        prompt_ids, prompt_mask: [N, P] (left-padded); rows are equal prompts when both rows are equal.
        completion_lengths: [N] completion tokens per row.
        max_rows: largest micro-batch.
        overhead_tokens: the launch cost of one micro-batch in token-slots.

    Returns:
        Index tensors (long) of the rows of each micro-batch; together a partition of range(N).
    """
    return _by_prompt(_prompt_index(prompt_ids, prompt_mask), prompt_mask.sum(-1), completion_lengths,
                      max_rows, overhead_tokens)


def _prompt_index(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """[N] row -> index of its distinct prompt (ids and mask both equal)."""
    keys = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], 1)
    return torch.unique(keys, dim=0, return_inverse=True)[1]


def _by_prompt(inv: torch.Tensor, p_len: torch.Tensor, completion_lengths: torch.Tensor, max_rows: int,
               overhead_tokens: float) -> list[torch.Tensor]:
    """`prompt_buckets` given each row's prompt index `inv` [N] and prompt length `p_len` [N]."""
    chunks = []                                                           # (rows, prompt length, max T)
    for u in range(int(inv.max()) + 1 if inv.numel() else 0):
        rows = (inv == u).nonzero().flatten()
        P = float(p_len[rows[0]])
        for part in length_buckets(completion_lengths[rows], max_rows, overhead_tokens + P):
            chunks.append((rows[part], P, int(completion_lengths[rows[part]].max())))
    chunks.sort(key=lambda c: (-c[2], -c[1], int(c[0][0])))             # deterministic: longest first
    n = len(chunks)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        rows, p_max = 0, 0.0
        for i in range(j - 1, -1, -1):                                    # batch = chunks [i, j)
            rows += chunks[i][0].numel()
            if rows > max_rows:
                break
            p_max = max(p_max, chunks[i][1])
            c = best[i] + (j - i) * p_max + rows * chunks[i][2] + overhead_tokens
            if c < best[j]:
                best[j], cut[j] = c, i
    out, j = [], n
    while j > 0:
        out.append(torch.cat([chunks[k][0] for k in range(cut[j], j)]))
        j = cut[j]
    return out[::-1]


def micro_batches(prompt_mask: torch.Tensor, completion_mask: torch.Tensor, max_rows: int,
                  n_params: int = 0, by_length: bool = True,
                  prompt_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Row indices of each micro-batch: prompt-aware buckets, length buckets, or consecutive slices.

    prompt_ids: given when the pass runs each distinct prompt once (`shared_prompts.model_shares_prompts`):
    rows of one prompt are kept together (`prompt_buckets`), if some prompt has several rows.
    The fixed cost of a micro-batch is taken as ~40 ms of forward + backward at ~150 GFLOP/s, i.e.
    1e9 / n_params token-slots (about 900 for a 1M-parameter model, 40 for a 24M one, 7 for 135M): a
    micro-batch pays Python and kernel launches on every layer, and short ones run small, slow
    matmuls; on the 24M bench model, natural lengths, 12 buckets (5 ms) took 2.72 s and 5 (40 ms) 2.34 s.
    """
    N = completion_mask.shape[0]
    if not by_length:
        return [torch.arange(s, min(s + max_rows, N)) for s in range(0, N, max_rows)]
    overhead = launch_tokens(n_params)
    if prompt_ids is not None and N > 1:
        inv = _prompt_index(prompt_ids.cpu(), prompt_mask.cpu())
        if int(inv.max()) + 1 < N:                                        # some prompt runs for several rows
            return _by_prompt(inv, prompt_mask.sum(-1).cpu(), completion_mask.sum(-1).cpu(), max_rows,
                              overhead)
    lengths = (prompt_mask.sum(-1) + completion_mask.sum(-1)).cpu()       # [N]
    return length_buckets(lengths, max_rows, overhead)


def launch_tokens(n_params: int) -> float:
    """The fixed cost of one micro-batch in token-slots (see `micro_batches`)."""
    return 1e9 / max(n_params, 1)


def token_budget_batches(prompt_mask: torch.Tensor, completion_mask: torch.Tensor, max_tokens: int,
                         max_rows: int, prompt_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Micro-batches of packed rows by a token budget: each holds at most `max_tokens` real tokens (a row
    longer than the budget goes alone) and at most `max_rows` rows.

    A row costs its completion's real tokens plus its prompt's; with prompt_ids (the pass runs each
    distinct prompt once) a prompt is paid once per micro-batch, and a group's rows are kept together,
    longest completion first. Rows are taken in that order and a micro-batch closes when the next row
    would overflow it: short completions fill one micro-batch with many rows, long ones with few.

    Returns:
        Index tensors (long) of the rows of each micro-batch; together a partition of range(N).
    """
    N = completion_mask.shape[0]
    if N == 0:
        return []
    p_len = prompt_mask.sum(-1).cpu().tolist()
    c_len = completion_mask.sum(-1).cpu()
    inv = (_prompt_index(prompt_ids.cpu(), prompt_mask.cpu()) if prompt_ids is not None
           else torch.arange(N))
    order = sorted(range(N), key=lambda r: (int(inv[r]), -int(c_len[r]), r))
    out, rows, seen, used = [], [], set(), 0
    for r in order:
        u = int(inv[r])
        cost = int(c_len[r]) + (0 if prompt_ids is not None and u in seen else int(p_len[r]))
        if rows and (used + cost > max_tokens or len(rows) == max_rows):
            out.append(torch.tensor(rows))
            rows, seen, used = [], set(), 0
            cost = int(c_len[r]) + int(p_len[r])
        rows.append(r)
        seen.add(u)
        used += cost
    out.append(torch.tensor(rows))
    return out
