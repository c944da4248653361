"""TRL's `rollout_func`: the user's own generation (an agent framework, a game server) as a `Rollout`.

    out = rollout_func(prompts, trainer)     # prompts: the batch's N = B * G prompts, each example G times
    out = {"prompt_ids": [[...]] * N, "completion_ids": [[...]] * N, "logprobs": [[...]] * N,
           "env_mask": [[1, 1, 0, 0, 1, ...]] * N,    # optional: 1 model token, 0 environment token
           "any_other_key": [...] * N}                # passed to the reward functions by keyword

The ids are taken as they are (token in, token out); `env_mask` becomes the rollout's loss mask (the
environment's tokens attended, not trained) and its runs of model tokens the trajectory's turns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from grpokit.errors import ConfigError
from grpokit.rollout.contract import Rollout, assemble_rollout, pad_rows
from grpokit.rollout.trajectory import Trajectory, Turn

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


def _check(out: Any, n: int) -> None:
    if not isinstance(out, dict) or any(k not in out for k in REQUIRED):
        got = ", ".join(map(str, out)) if isinstance(out, dict) else type(out).__name__
        raise ConfigError(f"rollout_func must return a dict with {', '.join(REQUIRED)} (and optionally "
                          f"env_mask); got {got}")
    for key, value in out.items():
        if not isinstance(value, (list, tuple)) or len(value) != n:
            size = len(value) if hasattr(value, "__len__") else "?"
            raise ConfigError(f"rollout_func returned {key} with {size} entries for {n} prompts: return one "
                              "per prompt (each example's G copies included)")
    for key in ("logprobs", "env_mask"):
        for i, (ids, vals) in enumerate(zip(out["completion_ids"], out.get(key, out["completion_ids"]))):
            if len(vals) != len(ids):
                raise ConfigError(f"rollout_func row {i}: {key} has {len(vals)} values for {len(ids)} "
                                  "completion ids: give one per completion token")


def _trajectory(env_mask: list[int]) -> Trajectory:
    """Turns from an env mask: each run of 1s a model turn, the 0s after it its environment tokens."""
    traj, t = Trajectory(), 0
    while t < len(env_mask):
        start = t
        while t < len(env_mask) and env_mask[t]:
            t += 1
        end = t
        while t < len(env_mask) and not env_mask[t]:
            t += 1
        traj.turns.append(Turn(start, end, t))
    return traj


def rollout_from_func(fn: Callable, trainer: Any, rows: list[dict], tokenizer, group_size: int,
                      eos_ids: list[int]) -> Rollout:
    """Call TRL's rollout_func on the batch's prompts: a rollout, its extra fields (for the rewards) in
    its `reward_kwargs`."""
    n = len(rows)
    out = fn([row["prompt"] for row in rows], trainer)
    _check(out, n)
    pad = tokenizer.pad_token_id
    P = max(len(p) for p in out["prompt_ids"])
    T = max(1, max(len(c) for c in out["completion_ids"]))
    env = out.get("env_mask")
    rollout = assemble_rollout(
        tokenizer=tokenizer, prompts=[row["prompt"] for row in rows], prompts_per_row=True,
        group_size=group_size, eos_ids=eos_ids,
        prompt_ids=pad_rows(out["prompt_ids"], P, pad, left=True),
        prompt_mask=pad_rows([[1] * len(p) for p in out["prompt_ids"]], P, 0, left=True),
        completion_ids=pad_rows(out["completion_ids"], T, pad),
        lengths=[len(c) for c in out["completion_ids"]], cut_at_eos=False,         # the ids as they are
        sampling_logprobs=pad_rows(out["logprobs"], T, 0.0, dtype=torch.float32),
        model_mask=None if env is None else pad_rows(env, T, 0),
        trajectories=None if env is None else [_trajectory(list(e)) for e in env],
        reward_kwargs={k: list(v) for k, v in out.items() if k not in (*REQUIRED, "env_mask")})
    return rollout
