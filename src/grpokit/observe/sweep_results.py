"""One sweep's results: a row per finished cell (results.csv, results.json) and one PNG of metric vs axis.

A row holds the cell's labels (variant, axis values), seed, folder, steps, wall_s (seconds the
finishing attempt of the cell took, load and evaluations included), `eval/<key>` for each number of
the cell's last held-out evaluation (eval.jsonl, tag 'after' when there is one) and `mean/<key>`, the
mean over its steps of each number in metrics.jsonl (frac_zero_std, frac_graduated, time/generate...).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpokit.errors import write_text_aside, written_aside
from grpokit.observe.metrics import read_metrics
from grpokit.observe.plots import COLORS

DONE_FILE = "sweep_cell.json"  # written last into a cell's folder: the cell is finished


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def cell_row(folder: Path, labels: dict[str, Any], seed: int) -> dict[str, Any]:
    """The results row of one finished cell, read from its folder."""
    done = json.loads((folder / DONE_FILE).read_text(encoding="utf-8"))
    row: dict[str, Any] = {**labels, "seed": seed, "folder": folder.name, "wall_s": done.get("wall_s"),
                           "resumed": done.get("resumed", False)}
    steps = read_metrics(folder) if (folder / "metrics.jsonl").is_file() else []
    row["steps"] = max((int(r.get("step", 0)) for r in steps), default=0)
    evals = read_metrics(folder, "eval.jsonl") if (folder / "eval.jsonl").is_file() else []
    last = next((r for r in reversed(evals) if r.get("tag") == "after"), evals[-1] if evals else {})
    row.update({f"eval/{k}": v for k, v in last.items() if _number(v) and k != "step"})
    keys = sorted({k for r in steps for k, v in r.items() if _number(v) and k != "step"})
    for key in keys:
        values = [float(r[key]) for r in steps if _number(r.get(key)) and math.isfinite(float(r[key]))]
        row[f"mean/{key}"] = sum(values) / len(values) if values else float("nan")
    return row


def write_table(rows: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    """results.csv and results.json in out_dir (columns: the union over rows, first-seen order)."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    csv_path, json_path = out_dir / "results.csv", out_dir / "results.json"
    write_text_aside(csv_path, text.getvalue())
    write_text_aside(json_path, json.dumps(rows, indent=1) + "\n")
    return csv_path, json_path


def _series(rows: list[dict], x_key: str, group_keys: Sequence[str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in rows:
        name = ", ".join(f"{k.split('.')[-1]}={row[k]}" for k in group_keys) or "all cells"
        out.setdefault(name, []).append(row)
    return out


def _draw_metric(ax, rows: list[dict], metric: str, label_keys: list[str], x_values: list) -> None:
    x_key = label_keys[0] if label_keys else None
    positions = {repr(v): i for i, v in enumerate(x_values)}
    for si, (name, members) in enumerate(_series(rows, x_key, label_keys[1:]).items()):
        color = COLORS[si % len(COLORS)]
        xs, lo, hi, mean = [], [], [], []
        for value in x_values:
            ys = [float(r[metric]) for r in members if (x_key is None or r[x_key] == value)
                  and _number(r.get(metric)) and math.isfinite(float(r[metric]))]
            if not ys:
                continue
            x = positions[repr(value)]
            ax.plot([x] * len(ys), ys, "o", color=color, alpha=0.6, markersize=5)
            xs.append(x)
            lo.append(min(ys))
            hi.append(max(ys))
            mean.append(sum(ys) / len(ys))
        if xs:
            ax.plot(xs, mean, "-", color=color, linewidth=1.8, label=f"{name} (mean; points: seeds)")
            ax.fill_between(xs, lo, hi, color=color, alpha=0.15)
    ax.set_xticks(range(len(x_values)), [str(v) for v in x_values])
    ax.set_xlabel(x_key or "cell")
    ax.set_ylabel(metric)
    ax.set_title(metric, fontsize=11)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    if not ax.lines:
        ax.text(0.5, 0.5, "not in the results", ha="center", va="center", transform=ax.transAxes,
                color="gray")


def sweep_plot(rows: list[dict[str, Any]], *, name: str, label_keys: list[str], x_values: list,
               metrics: Sequence[str], path: Path) -> Path:
    """One PNG, a panel per metric: its value per cell against the first label (variant or axis), one
    line per combination of the other labels, each seed a point, the band the seeds' min-max."""
    from matplotlib.figure import Figure

    cols = min(3, max(1, len(metrics)))
    nrows = math.ceil(len(metrics) / cols) if metrics else 1
    fig = Figure(figsize=(5.0 * cols, 4.0 * nrows), dpi=100, layout="constrained")
    grid = fig.subplots(nrows, cols, squeeze=False).flatten()
    for ax in grid[len(metrics):]:
        ax.set_visible(False)
    for ax, metric in zip(grid, metrics):
        _draw_metric(ax, rows, metric, label_keys, x_values)
    seeds = sorted({r["seed"] for r in rows})
    fig.suptitle(f"sweep {name}: {len(rows)} cells, seeds {seeds}", fontsize=12)
    with written_aside(path) as tmp:
        fig.savefig(tmp, dpi=100)
    return path
