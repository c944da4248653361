"""[B] Rewards that shape rather than verify: DAPO's soft overlong punishment and the exact arithmetic step
verifier (a process reward). Both are built-ins of `grpokit.rewards.scoring.REWARDS` (length / overlong,
steps)."""

from __future__ import annotations

import bisect
from typing import Any

from grpokit.rewards.calls import _as_text, need
from grpokit.rewards.steps import check_steps


def overlong_reward(prompts: list, completions: list, completion_ids: list | None = None,
                    max_completion_length: int | None = None, overlong_buffer: int = 0,
                    overlong_penalty: float = 1.0, **kwargs: Any) -> list[float]:
    """DAPO soft overlong punishment (eq. 13), scaled by `overlong_penalty`.

    With L_max = max_completion_length and L_cache = overlong_buffer, a completion of length L gets
    0 when L <= L_max - L_cache, ((L_max - L_cache) - L) / L_cache inside the buffer (down to -1 at
    L_max) and -1 beyond L_max. Lengths are ``len(completion_ids[i])``.
    """
    ids = need(completion_ids, "completion_ids", "length", "token ids of each completion")
    l_max = need(max_completion_length, "max_completion_length", "length", "the rollout's T")
    start = l_max - overlong_buffer
    out = []
    for seq in ids:
        n = len(seq)
        if n <= start:
            out.append(0.0)
        elif n <= l_max:
            out.append(-overlong_penalty * (n - start) / overlong_buffer)
        else:
            out.append(-float(overlong_penalty))
    return out


# ---------------------------------------------------------------------------------------------
# Process reward: exact arithmetic steps
# ---------------------------------------------------------------------------------------------

def steps_reward(prompts: list, completions: list, completion_char_ends: list | None = None,
                 step_correct_reward: float = 1.0, step_wrong_reward: float = -1.0,
                 **kwargs: Any) -> list[list[tuple[int, float]]]:
    """Process reward: one (end_token_index, reward) per arithmetic equation the model writes.

    Each equation found by `grpokit.rewards.steps.check_steps` earns `step_correct_reward` when its
    left side evaluates exactly to its result, else `step_wrong_reward`. The step ends at the
    token holding the last character of its result, found from ``completion_char_ends[i]`` (see
    `token_char_ends`). Several steps may end on the same token; each stays a separate step.
    """
    char_ends = need(completion_char_ends, "completion_char_ends", "steps",
                      "token_char_ends of each completion")
    out = []
    for text, ends in zip(map(_as_text, completions), char_ends):
        pairs = []
        for step in check_steps(text):
            if not ends:
                break
            token = min(bisect.bisect_left(ends, step.end), len(ends) - 1)
            pairs.append((token, float(step_correct_reward if step.correct else step_wrong_reward)))
        out.append(pairs)
    return out


steps_reward.process = True  # type: ignore[attr-defined]
