"""A problem's beams as rows of one KV cache kept from round to round (the prompt prefilled once).

The readable beam (`grpokit.search.beam.search_one`, through `Decoder.extend`) prefills the prompt and
every beam's partial solution again each round. Here one `LeanDecoder` (the sampler's) holds a
problem's rows for the whole search:

    prefill the prompt once                  (its slots shared by every row)
    each round after the first:
        fork(parents)    row i <- a copy of row parents[i]'s cache (a kept beam, once per expansion); the
                         copied slots are packed to the right end (slots a row left empty are dropped)
        feed(pending)    each row's last sampled token, not yet in its cache, goes in
    decode_round         rows sample in lockstep, one token a step; a row whose step has ended waits
                         (its later slots masked out of its keys, its draws discarded) until all have ended

A row's key mask says which cache slots it reads, and its token positions count only those slots, so
its keys, positions and log-probs are those of a fresh prefill of prompt + partial solution
(tests/search/test_kept_cache.py compares them). Every token is decoded once: the prompt, and each
sampled token when it is fed. What it costs instead: a waiting row still takes a row of each step until
its round ends, and each fork copies the kept rows' solution slots (never the prompt's: they are shared).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from grpokit.rollout.decode_loop import Draw, Rows, decode
from grpokit.rollout.sampler import LeanDecoder, choose_backend, lean_supported


def supported(model, backend: str, prompt_len: int, limit: int) -> bool:
    """Whether the lean decoder runs this model (else beam search takes the readable path)."""
    return choose_backend(model, backend) and lean_supported(model, capacity(prompt_len, limit))


def capacity(prompt_len: int, limit: int) -> int:
    """Cache slots a search needs: the prompt, at most `limit` packed solution slots, and one round of at
    most `limit` sampled tokens plus the fed pending one."""
    return prompt_len + 2 * limit + 1


class KeptRows:
    """One prompt's rows in a LeanDecoder cache: prefilled once, then forked, fed and decoded in rounds.

    State per row: `key_mask` [n, S] (the slots it reads), `pos` [n] (its next token position = slots it
    reads); `slot` is the next free slot (the same for every row: rows step in lockstep)."""

    def __init__(self, model, prompt: Sequence[int], rows: int, limit: int) -> None:
        device = model.get_input_embeddings().weight.device
        P, S = len(prompt), capacity(len(prompt), limit)
        self.P, self.n = P, rows
        self.dec = LeanDecoder(model, rows, S, prompts=1, prompt_len=P)
        ids = torch.tensor([list(prompt)], device=device)                 # [1, P]
        self.first = self.dec.prefill(ids, torch.ones_like(ids), rows)    # [1, V]: after the prompt
        self.key_mask = torch.zeros(rows, S, dtype=torch.bool, device=device)
        self.key_mask[:, :P] = True
        self.pos = torch.full((rows,), P, dtype=torch.long, device=device)
        self.slot = P
        self.spare: torch.Tensor | None = None                             # the other cache buffer

    def fork(self, parents: Sequence[int]) -> None:
        """Row i becomes a copy of row parents[i] (a parent may be copied several times, or dropped): its
        solution slots, packed to end at the same slot for every row; the prompt's slots stay put."""
        P, base, old = self.P, self.dec.base, self.dec.kv     # kv [L, 2, rows, kv_heads, S - base, hd]
        own = self.key_mask[:, P:self.slot]                   # [n, C] each row's solution slots
        counts = [int(own[p].sum()) for p in parents]
        end = P + max(counts, default=0)
        new = self.spare if self.spare is not None else torch.empty_like(old)
        mask = torch.zeros(len(parents), self.key_mask.shape[1], dtype=torch.bool, device=old.device)
        mask[:, :P] = True
        for i, (p, m) in enumerate(zip(parents, counts)):
            if base == 0:                                     # each row holds its own copy of the prompt
                new[:, :, i, :, :P] = old[:, :, p, :, :P]
            src = own[p].nonzero().squeeze(-1) + P - base     # [m] the parent's slots, in order
            new[:, :, i, :, P - base:end - m - base] = 0.0    # unread, but the kernels weigh values by 0
            new[:, :, i, :, end - m - base:end - base] = old[:, :, p, :, src]
            mask[i, end - m:end] = True
        self.dec.kv, self.spare = new, old
        if self.dec.prefix_row is not None:                   # every row reads the one prompt's slots
            self.dec.prefix_row = self.dec.prefix_row.new_zeros(len(parents))
        self.key_mask, self.n, self.slot = mask, len(parents), end
        self.pos = mask.sum(-1)

    def step(self, tok: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Feed tok [n] into the next slot of the active rows (the others' slot stays unread). Returns the
        next logits [n, V] (an inactive row's are meaningless)."""
        slot = self.slot
        self.key_mask[:, slot] = active
        logits = self.dec.step(tok, self.pos, slot, self.key_mask)
        self.pos += active.long()
        self.slot += 1
        return logits


class RoundRows(Rows):
    """One beam round's rows for the decode loop (`grpokit.rollout.decode_loop.decode`), and its engine:
    a row whose step has ended waits (compact=False: its later slots masked out of its keys, its draws
    discarded) until every row's has. The loop returns per row (ids, sampling log-probs)."""

    compact = False

    def __init__(self, rows: KeptRows, logits: torch.Tensor, limits: Sequence[int],
                 ended: Callable[[list[int]], bool]) -> None:
        n = logits.shape[0]
        self.rows, self.logits, self.limits, self.ended = rows, logits, list(limits), ended
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.lps: list[list[float]] = [[] for _ in range(n)]
        self.active = torch.ones(n, dtype=torch.bool, device=logits.device)
        self.every = 1

    @property
    def native(self):
        return self.rows.dec.native

    def start(self, engine) -> torch.Tensor:
        return self.logits

    def step(self, tok: torch.Tensor, t: int) -> torch.Tensor:
        """The engine's step: tok [n] into the next slot of the rows still in their step."""
        return self.rows.step(tok, self.active)

    def drawn(self, t: int, tok: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
        toks, lps = tok.tolist(), lp.tolist()                             # one host copy a step
        for r in self.active.nonzero().squeeze(-1).tolist():
            self.ids[r].append(toks[r])
            self.lps[r].append(lps[r])
            if len(self.ids[r]) >= self.limits[r] or self.ended(self.ids[r]):
                self.active[r] = False
        return tok

    def finished(self) -> torch.Tensor:
        return ~self.active

    def result(self, steps: int) -> list[tuple[list[int], list[float]]]:
        return list(zip(self.ids, self.lps))


def decode_round(rows: KeptRows, logits: torch.Tensor, limits: Sequence[int],
                 ended: Callable[[list[int]], bool], *, temperature: float, top_p: float,
                 top_k: int) -> list[tuple[list[int], list[float]]]:
    """Every row samples from `logits` [n, V] onwards until `ended(its ids)` or its limit; returns per row
    (ids, sampling log-probs). Each row's last id is sampled, not fed: it is the next round's pending id."""
    round_rows = RoundRows(rows, logits, limits, ended)
    return decode(round_rows, round_rows, max(1, *limits), Draw(temperature, top_p, top_k))
