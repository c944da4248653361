"""Held-out accuracy against training wall time: the time-to-accuracy figure and table of `grpokit plot`.

    grpokit plot runs/smollm2_arith runs/trl_arith --out cmp/ --target 0.95
    # -> cmp/time_to_accuracy.png, and one printed line per run: seconds to 95% held-out

An evaluation after step s sits at the training seconds of steps 1..s, the sum of metrics.jsonl's
`time/step` (generation, rewards, reference, update, optimizer and checkpoint saves). Model loading
and the evaluations themselves are off the clock, so two runs of different libraries compare on the
work they do to learn (benchmarks/trl_time_to_accuracy.py writes TRL's run in this format).

    time to target = the seconds of the first evaluation with accuracy >= target (None: never reached)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EVAL_KEY = "accuracy"  # greedy held-out pass@1, grpokit.train.evaluate


def eval_seconds(metrics: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]],
                 key: str = EVAL_KEY) -> list[tuple[float, float]]:
    """(training seconds, accuracy) of each evaluation, in step order.

    Args:
        metrics: a run's metrics.jsonl rows (`step`, `time/step`).
        evals: its eval.jsonl rows (`step`, `accuracy`).

    Returns:
        One pair per evaluation that has `key`; a step a resumed run logged twice counts once (the last).
    """
    per_step: dict[int, float] = {}
    for row in metrics:
        if isinstance(row.get("time/step"), (int, float)) and "step" in row:
            per_step[int(row["step"])] = float(row["time/step"])
    points = []
    for row in sorted((e for e in evals if isinstance(e.get(key), (int, float))),
                      key=lambda e: int(e.get("step", 0))):
        step = int(row.get("step", 0))
        points.append((sum(t for s, t in per_step.items() if s <= step), float(row[key])))
    return points


def time_to(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """Training seconds of the first evaluation at or above `target`; None when none reaches it."""
    return next((sec for sec, acc in points if acc >= target), None)


def summary_lines(runs: Sequence[Any], target: float) -> list[str]:
    """One line per run: its seconds to `target`, its best and last accuracy; and the ratio to the first."""
    lines, first = [], None
    for i, run in enumerate(runs):
        pts = eval_seconds(run.metrics, run.evals)
        if not pts:
            lines.append(f"{run.name}: no held-out evaluations (eval.jsonl)")
            continue
        sec = time_to(pts, target)
        best = max(a for _, a in pts)
        reached = (f"{target:.0%} held-out after {sec:.0f} s of training" if sec is not None
                   else f"never reached {target:.0%} in {pts[-1][0]:.0f} s")
        ratio = ""
        if i == 0:
            first = sec
        elif sec is not None and first:
            ratio = f"; {sec / first:.2f}x the first run's time"
        lines.append(f"{run.name}: {reached} (best {best:.1%}, last {pts[-1][1]:.1%}){ratio}")
    return lines


def y_range(accuracies: Sequence[float], target: float | None) -> tuple[float, float]:
    """The accuracy axis: 0-100%, or down to 1.3x the highest point or target when all lie below 60%
    (GSM8K's 1% curves would be flat lines on a 0-100% axis)."""
    top = max([*accuracies, target or 0.0, 0.01])
    return (-0.03, 1.03) if top >= 0.6 else (-0.02 * top, 1.3 * top)


def accuracy_time_figure(runs: Sequence[Any], target: float | None, colors: Sequence[str]):
    """One axes: held-out accuracy (markers and lines) against training minutes, one curve per run."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.0), dpi=100, layout="constrained")
    ax = fig.subplots()
    seen = []
    for i, run in enumerate(runs):
        pts = eval_seconds(run.metrics, run.evals)
        if not pts:
            continue
        label = run.name
        if target is not None:
            sec = time_to(pts, target)
            label += f" ({target:.0%} at {sec / 60:.1f} min)" if sec is not None else f" (<{target:.0%})"
        seen += [a for _, a in pts]
        ax.plot([s / 60 for s, _ in pts], [a for _, a in pts], "o-", color=colors[i % len(colors)],
                linewidth=1.8, label=label)
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", linewidth=1.0, label=f"target {target:.0%}")
    ax.set_title("Held-out accuracy (greedy) against training wall time", fontsize=11)
    ax.set_xlabel("training minutes (evaluations off the clock)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(*y_range(seen, target))
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=9, loc="best")
    else:
        ax.text(0.5, 0.5, "no held-out evaluations in these runs", ha="center", va="center",
                transform=ax.transAxes, color="gray")
    return fig
