"""The tool loop's semantics for one batch of rows: the `TurnDriver` the decode loop consults.

Per row: where its current model turn started, how many tool rounds it had, its `Trajectory`. When a
row samples a token that may end a turn (`format.stop_ids`), `after_token` decides, in this order:

    1. the format says the turn did not end            -> keep sampling
    2. the turn has no tool call                        -> the trajectory ends (stop "done")
    3. max_tool_calling_iterations rounds already ran   -> it ends, the calls are not run ("iterations")
    4. the calls run (every row that ended a turn at this step together, `run_calls`), their results
       are rendered (`format.render`); if those tokens and one more model token do not fit in the
       completion budget, the trajectory ends with the results not inserted ("budget", as TRL)
    5. else the row is fed the result tokens and samples its next turn

A row still going when the budget runs out stops mid-turn ("length"). TRL's `max_completion_length`
semantics: the budget bounds the whole completion, model and environment tokens together.

Two loops consult it: grpokit's decode loop (`after_token`, every row at the same column, then `finish`)
and the vLLM loop (`end_turns` with each row's completion so far, rows at any columns, then `close` per
row; grpokit.rollout.vllm_turns). Both go through `end_turns`, so the semantics are written once.
"""

from __future__ import annotations

import torch

from grpokit.agents.tools import Tool, run_calls
from grpokit.rollout.trajectory import Trajectory, Turn


class ToolDriver:
    """Tool turns of N rows (`grpokit.rollout.turns.TurnDriver`).

    Args:
        fmt: a `grpokit.agents.formats` format (PlainFormat, ChatFormat).
        row_tools: per row, the tools it may call by name.
        max_new_tokens: the completion budget T (model and environment tokens).
        max_iterations: tool rounds per trajectory (None: no limit but the budget).
        timeout: seconds per call; max_chars: tool results cut to this many characters (0: no cut).
    """

    def __init__(self, fmt, row_tools: list[dict[str, Tool]], *, max_new_tokens: int,
                 max_iterations: int | None, timeout: float, max_chars: int) -> None:
        self.fmt, self.row_tools, self.prompts = fmt, row_tools, [[] for _ in row_tools]
        self.max_new_tokens, self.max_iterations = max_new_tokens, max_iterations
        self.timeout, self.max_chars = timeout, max_chars
        self.stop_ids = fmt.stop_ids
        n = len(row_tools)
        self.trajectories = [Trajectory() for _ in range(n)]
        self.lengths = [0] * n          # completion tokens of each row, once it ended
        self._start = [0] * n           # column where the row's current model turn started
        self._rounds = [0] * n          # tool rounds run

    def begin(self, prompts: list[list[int]]) -> None:
        """The rows' prompt ids (the context a chat template's parser may need)."""
        if len(prompts) != len(self.row_tools):
            raise ValueError(f"the driver has {len(self.row_tools)} rows, the batch {len(prompts)}")
        self.prompts = prompts

    def after_token(self, row0: int, rows: list[int], column: int,
                    tokens: torch.Tensor) -> tuple[dict[int, list[int]], list[int]]:
        """See `grpokit.rollout.turns.TurnDriver.after_token`."""
        feed, ended = self.end_turns({row0 + r: tokens[r, :column + 1].tolist() for r in rows})
        return {g - row0: env for g, env in feed.items()}, [g - row0 for g in ended]

    def end_turns(self, rows: dict[int, list[int]]) -> tuple[dict[int, list[int]], list[int]]:
        """Rows (global ids) whose completion so far, `rows[g]`, ends with a stop id: steps 1-5 above, the
        calls of all of them run together. Rows need not be at the same column (the vLLM loop's rounds).

        Returns ({row: env token ids to insert next}, rows whose trajectory ended)."""
        ended, pending = [], []                               # pending: (row, turn, requests, ids, column)
        for g, ids in rows.items():
            column = len(ids) - 1
            turn_ids = ids[self._start[g]:]
            if not self.fmt.turn_ended(turn_ids):
                continue
            prefix = self.prompts[g] + ids[:self._start[g]]
            message, requests = self.fmt.parse(turn_ids, prefix, self.row_tools[g])
            turn = Turn(self._start[g], column + 1, column + 1, [], message)
            self.trajectories[g].turns.append(turn)
            if not requests:
                ended.append(self._end(g, "done", column + 1))
            elif self.max_iterations is not None and self._rounds[g] >= self.max_iterations:
                ended.append(self._end(g, "iterations", column + 1))
            else:
                pending.append((g, turn, requests, turn_ids, column))
        calls = run_calls([q for _, _, reqs, _, _ in pending for q in reqs], self.timeout, self.max_chars)
        feed, i = {}, 0
        for g, turn, requests, turn_ids, column in pending:
            turn.calls, i = calls[i:i + len(requests)], i + len(requests)
            env = self.fmt.render(turn.calls, turn_ids)
            if column + 1 + len(env) >= self.max_new_tokens:   # results plus one model token must fit
                ended.append(self._end(g, "budget", column + 1))
                continue
            turn.env_end = column + 1 + len(env)
            self._rounds[g] += 1
            self._start[g] = turn.env_end
            feed[g] = env
        return feed, ended

    def _end(self, g: int, stop: str, length: int) -> int:
        self.trajectories[g].stop, self.lengths[g] = stop, length
        return g

    def finish(self, row0: int, tokens: torch.Tensor) -> None:
        """Decoding ended with `tokens` [n, steps]: rows still sampling were cut by the budget mid-turn."""
        for r in range(tokens.shape[0]):
            self.close(row0 + r, tokens[r].tolist())

    def close(self, g: int, ids: list[int]) -> None:
        """Row g's decoding is over with completion `ids`: if its trajectory had not ended, the budget cut
        it mid-turn (stop "length", the turn so far recorded)."""
        traj = self.trajectories[g]
        if self.lengths[g] == 0:
            text = self.fmt.tokenizer.decode(ids[self._start[g]:], skip_special_tokens=True)
            message = {"role": "assistant", "content": text}
            traj.turns.append(Turn(self._start[g], len(ids), len(ids), [], message))
            self._end(g, "length", len(ids))
        if not self.fmt.prefix_preserving:   # each later turn's context differs from a re-render
            traj.non_prefix_turns = max(0, len(traj.turns) - 1)
