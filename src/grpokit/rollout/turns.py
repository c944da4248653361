"""The multi-turn decode loop: rows stop at a tool call, tools run, their tokens go into the row's cache.

The same loop as the single-turn one (`grpokit.rollout.decode_loop.decode`, rows `TurnRows`), with one
change: a row may be *fed* tokens instead of sampling them. When a row's model turn ends with a tool
call, the driver (`grpokit.agents.driver.ToolDriver`, the semantics: which token ends a turn, the
parsing, the tools, the limits) runs the calls and hands back the result tokens; from the next step on
the row takes those tokens one per step, through the same decode step as sampled ones, then samples
again:

    column   t      t+1    ...   t+k    t+k+1
    row i    </call> env_0  ...   env_k  sampled       (rows advance independently: another row is
    row j    sampled sampled ...  sampled sampled       mid-turn while row i reads its tool result)

So every token's keys and values are computed once, in order, into the row's own KV cache (no prefix is
decoded twice, no re-tokenization), every column of every row is one step of one token, and the cache
layout, positions and activation record are exactly the single-turn ones. Tools of the rows whose turn
ended at the same step run concurrently (`grpokit.agents.tools.run_calls`); the batch waits for them.

Determinism: the loop draws one sample per live row every step (a fed row's draw is discarded), and
which rows are live depends on the tokens only, never on how long a tool took; so a run is
bit-identical given its seed, tools and environment states.
"""

from __future__ import annotations

from typing import Protocol

import torch

from grpokit.rollout.decode_loop import Rows
from grpokit.rollout.trajectory import Trajectory


class TurnDriver(Protocol):
    """What the decode loop asks between steps (implemented by `grpokit.agents.driver.ToolDriver`)."""

    stop_ids: torch.Tensor   # [S] token ids after which a turn may have ended (EOS, a call's closing tokens)
    trajectories: list[Trajectory]   # one per row: its turns (completion columns) and tool calls
    lengths: list[int]               # completion tokens of each row (model and environment), once decoded

    def begin(self, prompts: list[list[int]]) -> None:
        """The rows' prompt token ids (no padding), before decoding."""
        ...

    def after_token(self, row0: int, rows: list[int], column: int,
                    tokens: torch.Tensor) -> tuple[dict[int, list[int]], list[int]]:
        """Rows (local ids; global = row0 + id) sampled a stop id at `column` of `tokens` [n, T].

        Returns ({row: env token ids to feed next}, rows whose trajectory ended at this column)."""
        ...

    def finish(self, row0: int, tokens: torch.Tensor) -> None:
        """Decoding ended with `tokens` [n, steps]: rows still going were cut by the length budget."""
        ...

    def end_turns(self, rows: dict[int, list[int]]) -> tuple[dict[int, list[int]], list[int]]:
        """`after_token` for rows (global ids) at any columns, each given its completion so far (the
        engine loop's rounds, grpokit.rollout.vllm_turns): ({row: env ids to append}, rows that ended)."""
        ...

    def close(self, g: int, ids: list[int]) -> None:
        """Row g's decoding is over with completion `ids` (a row still going was cut by the budget)."""
        ...


class TurnRows(Rows):
    """Rows with tool turns for the decode loop (`grpokit.rollout.decode_loop.decode`): a row whose turn
    ended at a tool call is fed the driver's result tokens, one per step, instead of its draws.

    The loop returns (tokens [N, T'], sampling log-probs [N, T'], 0 where fed). Which columns the policy
    sampled, and where each row ends, the driver's trajectories say; past a row's end: unspecified."""

    def __init__(self, N: int, max_new_tokens: int, pad_id: int, device, *, driver: TurnDriver,
                 row0: int) -> None:
        super().__init__(N, max_new_tokens, pad_id, device)               # every step: the driver asks
        self.driver, self.row0 = driver, row0
        self.stop_ids = driver.stop_ids.to(device)
        self.feed: dict[int, list[int]] = {}                              # row -> env tokens still to feed
        self.live = torch.arange(N, device=device)                        # the engine's rows, in order
        self.ended = torch.zeros(N, dtype=torch.bool, device=device)

    def drawn(self, t: int, tok: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
        live, feed = self.live, self.feed
        drew = ~self.ended[live]                                          # [n] rows that keep this draw
        for j, r in enumerate(live.tolist()):
            if r in feed:
                tok[j], lp[j], drew[j] = feed[r].pop(0), 0.0, False
                if not feed[r]:
                    del feed[r]
        self.tokens[live, t], self.logps[live, t] = tok, lp
        asks = live[drew & torch.isin(tok, self.stop_ids)].tolist()       # a turn may have ended here
        if asks:
            more, done = self.driver.after_token(self.row0, asks, t, self.tokens)
            feed.update(more)
            self.ended[done] = True
        return tok

    def finished(self) -> torch.Tensor:
        return self.ended[self.live]

    def keep(self, keep: torch.Tensor, t: int) -> None:
        self.live = self.live[keep]

    def result(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.driver.finish(self.row0, self.tokens[:, :steps])
        return super().result(steps)


def turn_masks(trajectories: list[Trajectory], lengths: list[int], T: int,
               device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(completion_mask [N, T], model_mask [N, T]) long: attention on every token of a row's completion,
    training on its model turns only."""
    N = len(trajectories)
    cols = torch.arange(T, device=device)[None, :]                        # [1, T]
    attend = (cols < torch.tensor(lengths, device=device)[:, None]).long()  # [N, T]
    model = torch.zeros(N, T, dtype=torch.long, device=device)
    for i, traj in enumerate(trajectories):
        for turn in traj.turns:
            model[i, turn.start:turn.end] = 1
    return attend, model
