"""The one decode loop behind every way grpokit samples: a flat group, tool turns, a tree, beam rounds.

    logits = rows.start(engine)                       # [n, V] after the prompts
    for t in range(max_new_tokens):
        logits = rows.before_draw(t, logits, engine)  # a tree forks here; a single turn may suppress EOS
        tok, lp = pick_tokens(logits, ...)            # one draw per live row, every step
        tok = rows.drawn(t, tok, lp)                  # written; a multi-turn row may be fed a token instead
        last column: stop
        if rows.check(t):                             # a host sync: every step, or a cadence on CUDA
            done = rows.finished()                    # [n] bool
            every row done: stop
            keep = rows_to_keep(done)                 # drop finished rows in batches (rows.compact)
            rows.keep(keep); engine.keep_rows(keep, t)
        logits = engine.step(tok, t)
    return rows.result(steps)

What differs between the ways is in the rows object (`Rows`): `SingleTurn` here, `turns.TurnRows`
(tool results fed through the same step), `tree.TreeRows` (rows fork at branch points) and
`search.kept_cache.RoundRows` (rows that finished wait, masked, instead of leaving: compact=False). The
engine (`sampler._LeanEngine`, `cached_engine.CachedEngine`, `kept_cache.RoundRows` itself) holds the KV
cache and answers `first_logits`, `step(tok, t)` and `keep_rows(keep, t)`.

Determinism: the loop draws once per live row every step, in the same order of operations whatever the
rows object, so a run is bit-identical given its seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpokit.rollout.sampling import pick_tokens, rows_to_keep

# On CUDA the loop asks how many rows finished (a host sync) every this many steps, not every step: a
# finished row decodes a few more tokens (masked out after its EOS) instead of the GPU idling each step.
CUDA_CHECK_EVERY = 8


def check_every(device) -> int:
    """Steps between looks at the finished rows on `device` (1 on the CPU: a look costs nothing there)."""
    return CUDA_CHECK_EVERY if torch.device(device).type == "cuda" else 1


@dataclass(frozen=True)
class Draw:
    """How a token is drawn from a row's logits (`grpokit.rollout.sampling.pick_tokens`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


class Rows:
    """The rows of one decode: their output buffers and what the loop asks between steps.

    tokens / logps: [N, max_new_tokens] (pad_id / 0 until written). Subclasses say how a draw is written
    (`drawn`) and which live rows are done (`finished`); the defaults are a plain batch."""

    compact = True                     # drop finished rows from the engine (else they wait, masked)

    def __init__(self, N: int, max_new_tokens: int, pad_id: int, device, every: int = 1) -> None:
        self.tokens = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)
        self.logps = torch.zeros((N, max_new_tokens), dtype=torch.float32, device=device)
        self.every = every

    def start(self, engine) -> torch.Tensor:
        """The first logits [n, V] (after the prompts)."""
        return engine.first_logits()

    def before_draw(self, t: int, logits: torch.Tensor, engine) -> torch.Tensor:
        """The logits column t is drawn from (fp32)."""
        return logits.float()

    def drawn(self, t: int, tok: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
        """Record column t's draws (tok, lp [n]); returns the tokens the engine steps on."""
        raise NotImplementedError

    def check(self, t: int) -> bool:
        """Whether to look at the finished rows after column t."""
        return (t + 1) % self.every == 0

    def finished(self) -> torch.Tensor:
        """[n] bool: the live rows whose decoding is over."""
        raise NotImplementedError

    def keep(self, keep: torch.Tensor, t: int) -> None:
        """Only the live rows `keep` [n'] go on."""
        raise NotImplementedError

    def result(self, steps: int) -> Any:
        """What the loop returns after `steps` columns: (tokens [N, steps], log-probs [N, steps])."""
        return self.tokens[:, :steps], self.logps[:, :steps]


@torch.no_grad()
def decode(engine, rows: Rows, max_new_tokens: int, draw: Draw) -> Any:
    """Decode up to max_new_tokens columns of `rows` with `engine`; returns `rows.result(steps)`."""
    logits = rows.start(engine)                                           # [n, V]
    native = getattr(engine, "native", None)
    steps = 0
    for t in range(max_new_tokens):
        logits = rows.before_draw(t, logits, engine)
        tok, lp = pick_tokens(logits, draw.temperature, draw.top_k, draw.top_p, draw.greedy, native)
        tok = rows.drawn(t, tok, lp)
        steps = t + 1
        if t + 1 == max_new_tokens:
            break
        if rows.check(t):
            done = rows.finished()                                        # [n]
            if bool(done.all()):
                break
            keep = rows_to_keep(done) if rows.compact else None
            if keep is not None:
                rows.keep(keep, t)
                engine.keep_rows(keep, t)
                tok = tok[keep]
        logits = engine.step(tok, t)
    return rows.result(steps)


class SingleTurn(Rows):
    """One turn per row, to EOS or the length budget (suppress_eos: EOS never drawn, every row runs on)."""

    def __init__(self, N: int, max_new_tokens: int, pad_id: int, device, *, eos_ids: list[int],
                 suppress_eos: bool = False, every: int = 1) -> None:
        super().__init__(N, max_new_tokens, pad_id, device, every)
        self.eos = torch.tensor(eos_ids, device=device)
        self.suppress = suppress_eos
        self.rows: torch.Tensor | None = None                             # original ids of live rows
        self.done = torch.zeros(N, dtype=torch.bool, device=device)       # [n]

    def before_draw(self, t: int, logits: torch.Tensor, engine) -> torch.Tensor:
        logits = logits.float()
        if self.suppress:
            logits[:, self.eos] = float("-inf")
        return logits

    def drawn(self, t: int, tok: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            self.tokens[:, t], self.logps[:, t] = tok, lp
        else:
            self.tokens[self.rows, t], self.logps[self.rows, t] = tok, lp
        if not self.suppress:
            self.done |= torch.isin(tok, self.eos)
        return tok

    def check(self, t: int) -> bool:
        return not self.suppress and super().check(t)

    def finished(self) -> torch.Tensor:
        return self.done

    def keep(self, keep: torch.Tensor, t: int) -> None:
        self.rows = keep if self.rows is None else self.rows[keep]
        self.done = self.done[keep]
