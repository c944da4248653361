"""The per-sample record of a multi-turn rollout: its model turns, the tool calls each made, why it ended.

A multi-turn completion is one token stream, exactly as it was decoded:

    prompt | model turn 1 | env tokens 1 | model turn 2 | env tokens 2 | ... | model turn K

Model turns are the tokens the policy sampled (the loss trains them: `Rollout.loss_mask` is 1 there);
env tokens are what grpokit inserted between turns, the tool results rendered in the chat template's
tool messages (or the plain format's ``<tool_response>`` text): the model attends to them when it goes on,
the loss never trains them. `Rollout.completion_ids` holds the whole stream; a `Trajectory` says where
each turn starts and ends in it (completion columns), and what each tool call did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STOPS = ("done", "iterations", "budget", "length")  # Trajectory.stop: see the field's comment


@dataclass
class ToolCall:
    """One tool call of a model turn, as run."""

    name: str                         # the tool the model named ('' when its call could not be parsed)
    arguments: dict[str, Any]         # keyword arguments it passed (positional ones bound to their names)
    result: str                       # the text the model was given back (the error text on failure)
    error: str | None = None          # None: the tool ran and returned text; else what went wrong
    timed_out: bool = False           # the call ran past rollout.tool_timeout (error says so too)
    truncated: bool = False           # the result was cut to rollout.max_tool_output_chars
    latency_s: float = 0.0            # wall time of the call (0 for a call that never ran)


@dataclass
class Turn:
    """One model turn and the environment tokens inserted after it (completion columns, end exclusive)."""

    start: int                        # first column the model sampled in this turn
    end: int                          # one past its last sampled column
    env_end: int                      # one past the env tokens that follow (== end: none, the last turn)
    calls: list[ToolCall] = field(default_factory=list)   # the calls this turn made (run or not)
    message: dict[str, Any] = field(default_factory=dict)  # the turn as a chat message (content, tool_calls)


@dataclass
class Trajectory:
    """What one row of a multi-turn rollout did."""

    turns: list[Turn] = field(default_factory=list)
    # why it ended: done (the model answered: EOS, or a chat turn with no tool call), iterations (it called a
    # tool past rollout.max_tool_calling_iterations: that turn's calls did not run), budget (the tool result
    # would not fit in rollout.max_completion_length: not inserted), length (the budget ran out mid-turn)
    stop: str = "done"
    # turns after the first whose context, as sampled, is not what the chat template renders for the
    # conversation so far (a template that is not prefix-preserving); the stream is kept as sampled
    non_prefix_turns: int = 0

    @property
    def calls(self) -> list[ToolCall]:
        return [c for t in self.turns for c in t.calls]

    @property
    def model_tokens(self) -> int:
        return sum(t.end - t.start for t in self.turns)

    @property
    def env_tokens(self) -> int:
        return sum(t.env_end - t.end for t in self.turns)

    def messages(self) -> list[dict[str, Any]]:
        """The completion as TRL's chat messages: each assistant turn, then one 'tool' message per call
        that ran (its result, or its error text)."""
        out: list[dict[str, Any]] = []
        for turn in self.turns:
            out.append(turn.message or {"role": "assistant", "content": ""})
            if turn.env_end > turn.end:
                out += [{"role": "tool", "name": c.name, "content": c.result} for c in turn.calls]
        return out
