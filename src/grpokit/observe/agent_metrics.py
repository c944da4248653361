"""Multi-turn figures for metrics.jsonl and evaluations, from a rollout's trajectories.

Per step (`trajectory_stats`, keys only present when the run has tools or environments):

    turns/mean, turns/max            model turns per trajectory
    turns/non_prefix                 turns whose context differs from the chat template's re-rendering
                                     (a template that is not prefix-preserving; the stream is kept as sampled)
    tools/call_frequency             tool calls per trajectory (TRL's name)
    tools/failure_frequency          calls that failed (raised, timed out, bad call, non-text result) / calls
    tools/timeout_frequency          calls that timed out / calls
    tools/truncated_outputs          results cut to rollout.max_tool_output_chars (count)
    tools/latency_mean_s             mean wall time of a call
    tokens/model_mean, tokens/env_mean   sampled vs inserted tokens per trajectory
    cut/max_iterations, cut/budget, cut/length   share of trajectories ended by each limit (`Trajectory.stop`)
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def per_trajectory(rollout) -> dict[str, torch.Tensor]:
    """[N] per-row figures (empty for a single-turn rollout): turns, tool calls, failed calls."""
    trajs = rollout.trajectories
    if trajs is None:
        return {}
    return {"turns": torch.tensor([float(len(t.turns)) for t in trajs]),
            "tool_calls": torch.tensor([float(len(t.calls)) for t in trajs]),
            "tool_errors": torch.tensor([float(sum(c.error is not None for c in t.calls)) for t in trajs])}


def trajectory_means(per: dict[str, torch.Tensor]) -> dict[str, float]:
    """An evaluation's turns_mean, tool_calls_mean and tool_error_rate (errors / calls)."""
    if "turns" not in per:
        return {}
    calls = float(per["tool_calls"].sum())
    return {"turns_mean": float(per["turns"].mean()), "tool_calls_mean": float(per["tool_calls"].mean()),
            "tool_error_rate": float(per["tool_errors"].sum()) / calls if calls else 0.0}


def trajectory_stats(rollout,
                     gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
    """The step's multi-turn metrics (module docstring); gather: all ranks' rows (one process: as is)."""
    trajs = rollout.trajectories
    if trajs is None:
        return {}
    calls = [c for t in trajs for c in t.calls]
    rows = torch.tensor([[len(t.turns), len(t.calls), t.model_tokens, t.env_tokens, t.non_prefix_turns,
                          t.stop == "iterations", t.stop == "budget", t.stop == "length"] for t in trajs],
                        dtype=torch.float64)                              # [N, 8]
    counts = torch.tensor([[len(calls), sum(c.error is not None for c in calls),
                            sum(c.timed_out for c in calls), sum(c.truncated for c in calls),
                            sum(c.latency_s for c in calls)]], dtype=torch.float64)   # [1, 5]
    gather = gather or (lambda x: x)
    rows, counts = gather(rows), gather(counts).sum(0)
    n_calls = float(counts[0]) or 1.0
    mean = rows.mean(0)
    return {"turns/mean": float(mean[0]), "turns/max": float(rows[:, 0].max()),
            "turns/non_prefix": float(rows[:, 4].sum()),
            "tools/call_frequency": float(mean[1]), "tools/failure_frequency": float(counts[1]) / n_calls,
            "tools/timeout_frequency": float(counts[2]) / n_calls,
            "tools/truncated_outputs": float(counts[3]),
            "tools/latency_mean_s": float(counts[4]) / n_calls,
            "tokens/model_mean": float(mean[2]), "tokens/env_mean": float(mean[3]),
            "cut/max_iterations": float(mean[5]), "cut/budget": float(mean[6]), "cut/length": float(mean[7])}
