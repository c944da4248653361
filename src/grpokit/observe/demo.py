"""What `grpokit train` with no arguments shows at the end: the before/after table and one plot.

The demo run writes eval.jsonl (one row per held-out evaluation, tagged 'before', 'stepN', 'after')
and metrics.jsonl (one row per GRPO step). From them:

    before_after_table(run_dir)  ->  a plain-text table, held-out figures before vs after GRPO
    format_before_after(b, a)    ->  the same table from two eval rows
    demo_plot(run_dir, path)     ->  one PNG: reward, accuracy (train + held-out), KL, completion length
"""

from __future__ import annotations

import math
from pathlib import Path

from grpokit.observe.metrics import read_metrics
from grpokit.observe.plots import Panel, draw_panel, load_runs, new_figure

# (eval.jsonl key, row label, shown as a percentage)
TABLE_ROWS = (("accuracy", "greedy accuracy (pass@1)", True), ("reward_mean", "mean reward", False),
              ("format_rate", "format rate (boxed answer)", True),
              ("completion_length_mean", "mean completion length (tokens)", False))


def before_after_table(run_dir: str | Path) -> str:
    """The held-out figures of the 'before' and 'after' evaluations of a run, side by side.

    Raises:
        FileNotFoundError: the run has no eval.jsonl with both rows (run.eval_limit was 0).
    """
    path = Path(run_dir) / "eval.jsonl"
    rows = {r.get("tag"): r for r in read_metrics(path)} if path.is_file() else {}
    if "before" not in rows or "after" not in rows:
        raise FileNotFoundError(f"{path} lacks the 'before'/'after' evaluations: "
                                "run with run.eval_limit != 0")
    return format_before_after(rows["before"], rows["after"])


def format_before_after(before: dict, after: dict) -> str:
    """Two eval.jsonl rows as the demo's table (the README's: from raw rows, scripts/update_readme.py)."""
    n = int(before.get("num_problems", 0))
    lines = [f"held-out problems: {n} (never trained on); greedy decoding",
             f"{'':34}{'before':>10}{'after':>10}{'change':>10}",
             f"{'step':34}{before['step']:>10}{after['step']:>10}{'':>10}"]
    per_func = [(k, f"mean {k}", False) for k in before if k.startswith("rewards/") and k in after]
    for key, label, pct in TABLE_ROWS + tuple(per_func):
        if key not in before or key not in after or math.isnan(float(before[key])):
            continue  # no answer column (a TRL dataset): no accuracy to show
        b, a = float(before[key]), float(after[key])
        if pct:
            lines.append(f"{label:34}{100 * b:>9.1f}%{100 * a:>9.1f}%{100 * (a - b):>+9.1f} pt")
        else:
            lines.append(f"{label:34}{b:>10.3f}{a:>10.3f}{a - b:>+10.3f}")
    return "\n".join(lines)


def demo_plot(run_dir: str | Path, path: str | Path | None = None, smooth: float = 0.6) -> Path:
    """One 2x2 PNG of a run: reward, accuracy (sampled in training; greedy held-out as markers),
    KL to the reference, completion length. Default path: <run_dir>/demo_plot.png."""
    runs = load_runs([run_dir])
    panels = [Panel("Reward", "mean reward per completion", [("reward_mean", "train (sampled)")],
                    eval_key="reward_mean"),
              Panel("Accuracy", "share correct", [("accuracy", "train (sampled)")], unit_range=True,
                    eval_key="accuracy"),
              Panel("KL to reference", "approx KL (k3, nats/token)", [("approx_kl", "KL")]),
              Panel("Completion length", "tokens per completion", [("completion_length_mean", "mean")],
                    band=("completion_length_min", "completion_length_max"))]
    fig, axes = new_figure(len(panels), "GRPO demo", runs, smooth)
    for ax, panel in zip(axes, panels):
        draw_panel(ax, panel, runs, smooth)
    out = Path(path) if path is not None else Path(run_dir) / "demo_plot.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out
