"""`grpokit plot RUN_DIR [RUN_DIR ...]`: PNG figures of the signals that explain a GRPO run.

    grpokit plot runs/demo                      # -> runs/demo/plots/*.png
    grpokit plot runs/a runs/b --out cmp/       # the two runs overlaid, one colour per run
    grpokit plot runs/demo --smooth 0.9         # heavier smoothing (0 = raw values only)

Figures (from metrics.jsonl, plus eval.jsonl's held-out accuracy when present):

    reward.png    reward mean (and each reward function's mean), training and held-out accuracy
    zero_std.png  share of groups with zero reward std, split into graduated (all right) and stuck
                  (all wrong): those groups give no gradient; and the mean within-group reward std
    kl_clip.png   approx KL to the reference, clip fractions (low: ratio < 1 - eps with A < 0;
                  high: ratio > 1 + eps with A > 0), mean importance ratio
    length.png    completion length (mean, min-max band) and the share truncated at the limit
    training.png  loss and policy loss, token entropy, gradient norm, learning rate
    time.png      seconds per step by phase (stacked area, one panel per run) and tokens/s
    time_to_accuracy.png   runs with held-out evaluations: accuracy against training minutes
                  (grpokit.observe.accuracy_time; --target draws the line and names the time to it)
    reward_vs_verified.png   runs with a learned reward (rm:PATH) only: its mean beside the verified
                  accuracy of the same samples and the held-out accuracy (reward hacking shows as a gap)

Smoothing is the debiased exponential moving average TensorBoard uses:
    s_t = w * s_{t-1} + (1 - w) * x_t,  shown as s_t / (1 - w^t);  raw values stay as faint lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit.errors import UserError, check_out_dir, written_aside
from grpokit.observe.accuracy_time import accuracy_time_figure
from grpokit.observe.metrics import PHASES, read_metrics
from grpokit.observe.tracking import short_name

DEFAULT_SMOOTH = 0.6
SUBPHASES = {"optimizer": "update"}  # timers nested inside a top-level phase: shown as a split of it
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
STYLES = ["-", "--", ":", "-."]


@dataclass
class Run:
    """One run folder's rows: metrics.jsonl (per step) and eval.jsonl (tagged evaluations)."""

    name: str
    metrics: list[dict[str, Any]]
    evals: list[dict[str, Any]] = field(default_factory=list)

    def keys(self) -> set[str]:
        return {k for row in self.metrics for k in row}

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(steps, values) of the rows that have `key` (non-finite values kept as NaN)."""
        xs, ys = [], []
        for row in self.metrics:
            v = row.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                xs.append(float(row.get("step", len(xs) + 1)))
                ys.append(float(v))
        return xs, ys


@dataclass
class Panel:
    """One axes: a y label (with units) and the series to draw, as (metrics key, legend label)."""

    title: str
    ylabel: str
    series: list[tuple[str, str]]
    band: tuple[str, str] | None = None      # (low key, high key) shaded around the first series (one run)
    unit_range: bool = False                 # a share: y from 0 to 1
    eval_key: str | None = None              # eval.jsonl key drawn as markers


FIGURES: dict[str, tuple[str, list[Panel]]] = {
    "reward": ("Reward and accuracy", [
        Panel("Reward", "reward (mean over completions)", [("reward_mean", "total"), ("rewards/*", "")]),
        Panel("Accuracy", "share of completions correct", [("accuracy", "train (sampled)")], unit_range=True,
              eval_key="accuracy")]),
    "zero_std": ("Groups with zero reward std (no gradient)", [
        Panel("Zero-std groups", "share of groups", [("frac_zero_std", "zero std (all)"),
              ("frac_graduated", "graduated (all right)"), ("frac_stuck", "stuck (all wrong)")],
              unit_range=True),
        Panel("Within-group spread", "mean within-group reward std", [("reward_group_std_mean", "std")])]),
    "kl_clip": ("Policy drift: KL and clipping", [
        Panel("KL to reference", "approx KL (k3, nats/token)", [("approx_kl", "KL")]),
        Panel("Clip fraction", "share of tokens clipped", [
            ("clip_ratio_low", "low (A<0)"), ("clip_ratio_high", "high (A>0)"),
            ("clip_ratio_low/iter*", "low, update {n}"), ("clip_ratio_high/iter*", "high, update {n}")]),
        Panel("Importance ratio", "mean ratio pi/pi_old", [("mean_ratio", "ratio"),
                                                           ("mean_ratio/iter*", "update {n}")])]),
    "length": ("Completion length", [
        Panel("Length", "tokens per completion", [("completion_length_mean", "mean")],
              band=("completion_length_min", "completion_length_max")),
        Panel("Truncated", "share cut at max_completion_length", [("frac_truncated", "truncated")],
              unit_range=True)]),
    "training": ("Optimization", [
        Panel("Loss", "loss (minimized)", [("loss", "loss"), ("policy_loss", "policy (clip term)")]),
        Panel("Entropy", "token entropy (nats)", [("entropy", "entropy")]),
        Panel("Gradient norm", "grad norm (before clipping)", [("grad_norm", "grad norm")]),
        Panel("Learning rate", "learning rate", [("learning_rate", "lr")])]),
}


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Debiased exponential moving average (TensorBoard's smoothing); NaNs are skipped, kept as NaN."""
    if weight <= 0:
        return list(values)
    out, acc, n = [], 0.0, 0
    for v in values:
        if math.isnan(v):
            out.append(float("nan"))
            continue
        acc, n = weight * acc + (1 - weight) * v, n + 1
        out.append(acc / (1 - weight ** n))
    return out


def load_runs(run_dirs: Sequence[str | Path]) -> list[Run]:
    """Read each run folder; names are the folder names (with their parent when two names clash)."""
    paths = [Path(p) for p in run_dirs]
    for p in paths:
        if not (p / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"{p} has no metrics.jsonl: give a run folder "
                                    "(run.output_dir of a training run)")
    names = [p.resolve().name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.resolve().parent.name}/{p.resolve().name}" for p in paths]
    runs = []
    for p, name in zip(paths, names):
        rows = _rows(p / "metrics.jsonl")
        if not rows:
            raise FileNotFoundError(f"{p / 'metrics.jsonl'} is empty: the run has not finished a step yet")
        evals = _rows(p / "eval.jsonl") if (p / "eval.jsonl").is_file() else []
        runs.append(Run(name, rows, evals))
    return runs


def _rows(path: Path) -> list[dict[str, Any]]:
    """The JSON-object rows of a run's .jsonl file; a file with lines but none readable is an error
    (a last line cut by a kill is only skipped: `read_metrics`)."""
    try:
        rows = [r for r in read_metrics(path) if isinstance(r, dict)]
    except UnicodeDecodeError:
        raise UserError(f"{path} is unreadable (not UTF-8 text): it is not a grpokit log; "
                        "give the run folder that training wrote") from None
    text = path.read_bytes()
    if not rows and (text.strip().count(b"\n") or text.endswith(b"\n")):  # not just one line cut by a kill
        raise UserError(f"{path} is unreadable: none of its lines is a JSON object; "
                        "give the run folder that training wrote")
    return rows


def _expand(series: list[tuple[str, str]], keys: set[str]) -> list[tuple[str, str]]:
    """Series present in the run: 'rewards/*' -> one per reward function; 'x/iter*' -> one per extra
    policy update (mu > 1 logs updates 2..mu as x/iter1..), labelled with the template's {n}."""
    out = []
    for key, label in series:
        if key.endswith("/*"):
            prefix = key[:-1]
            out += [(k, short_name(k[len(prefix):])) for k in sorted(keys) if k.startswith(prefix)]
        elif key.endswith("/iter*"):
            prefix = key[:-1]
            its = sorted(int(k[len(prefix):]) for k in keys
                         if k.startswith(prefix) and k[len(prefix):].isdigit())
            out += [(f"{prefix}{i}", label.format(n=i + 1)) for i in its]
        elif key in keys:
            out.append((key, label))
    return out


def draw_panel(ax, panel: Panel, runs: list[Run], smooth: float) -> None:
    keys = set().union(*(r.keys() for r in runs))
    series = _expand(panel.series, keys)
    multi = len(runs) > 1
    for ri, run in enumerate(runs):
        for si, (key, label) in enumerate(series):
            xs, ys = run.series(key)
            if not xs:
                continue
            color = COLORS[(ri if multi else si) % len(COLORS)]
            style = STYLES[si % len(STYLES)] if multi else "-"
            name = (f"{run.name}: {label}" if len(series) > 1 else run.name) if multi else label
            if smooth > 0:
                ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8, linestyle=style)
            ax.plot(xs, ema(ys, smooth), color=color, linewidth=1.8, linestyle=style, label=name)
            if panel.band and si == 0 and not multi:
                _, lo = run.series(panel.band[0])
                _, hi = run.series(panel.band[1])
                if len(lo) == len(hi) == len(xs):
                    ax.fill_between(xs, lo, hi, color=color, alpha=0.12, label="min-max")
        if panel.eval_key:
            pts = [(float(e.get("step", 0)), e[panel.eval_key]) for e in run.evals if panel.eval_key in e]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "D", color=COLORS[ri % len(COLORS)] if multi
                        else "black", markersize=6, label=f"{run.name}: held-out (greedy)" if multi else
                        "held-out (greedy)")
    _style(ax, panel.title, panel.ylabel)
    if panel.unit_range:
        ax.set_ylim(-0.03, 1.03)
    if not ax.lines:
        ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes,
                color="gray")


def _style(ax, title: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")


def new_figure(n_panels: int, title: str, runs: list[Run], smooth: float):
    from matplotlib.figure import Figure

    rows = 1 if n_panels <= 3 else 2                   # wide figures wrap onto two rows
    cols = math.ceil(n_panels / rows)
    fig = Figure(figsize=(5.0 * cols, 4.2 * rows), dpi=100, layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False).flatten()
    for ax in grid[n_panels:]:
        ax.set_visible(False)
    axes = grid[:n_panels]
    note = f"smoothing {smooth:g} (EMA; raw values faint)" if smooth > 0 else "raw values"
    fig.suptitle(f"{title}  —  {', '.join(r.name for r in runs)}  ({note})", fontsize=12)
    return fig, axes


def phase_series(run: Run) -> dict[str, list[float]]:
    """Seconds per step of each phase for a stacked plot: top-level phases (nested sub-phases split out
    of their parent) and 'other' = time/step - sum of phases (the untimed glue); they add up to time/step."""
    keys = run.keys()
    names = [p for p in PHASES if f"time/{p}" in keys]
    out: dict[str, list[float]] = {}
    rows = [r for r in run.metrics if "time/step" in r]
    for p in names:
        vals = [float(r.get(f"time/{p}", 0.0)) for r in rows]
        subs = [s for s, parent in SUBPHASES.items() if parent == p and f"time/{s}" in keys]
        for s in subs:
            sub = [float(r.get(f"time/{s}", 0.0)) for r in rows]
            vals = [v - w for v, w in zip(vals, sub)]
            out[s] = sub
        out[p if not subs else f"{p} (rest)"] = vals
    total = [float(r["time/step"]) for r in rows]
    out["other"] = [max(0.0, t - sum(v[i] for v in out.values())) for i, t in enumerate(total)]
    return out


def time_figure(runs: list[Run], smooth: float):
    """Stacked area of seconds per phase, one panel per run (shared y), then tokens/s overlaid."""
    fig, axes = new_figure(len(runs) + 1, "Wall time per step", runs, smooth)
    for ax, run in zip(axes, runs):
        steps = [float(r["step"]) for r in run.metrics if "time/step" in r]
        phases = phase_series(run)
        if steps and phases:
            labels = list(phases)
            stacks = [ema(phases[k], smooth) for k in labels]
            colors = [COLORS[i % len(COLORS)] for i in range(len(labels))]
            colors[-1] = "#bbbbbb"  # "other" in grey
            ax.stackplot(steps, *stacks, labels=labels, colors=colors, alpha=0.85)
        _style(ax, f"Time per phase: {run.name}", "seconds per step")
        handles, labels = ax.get_legend_handles_labels()
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        if handles and ax is axes[len(runs) - 1]:  # one legend, top of the stack first, outside the plot
            ax.legend(handles[::-1], labels[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if len(runs) > 1:
        top = max(ax.get_ylim()[1] for ax in axes[:-1])
        for ax in axes[:-1]:
            ax.set_ylim(0, top)
    draw_panel(axes[-1], Panel("Throughput", "completion tokens / second (step)",
                                [("tokens_per_s", "end to end"), ("generate_tokens_per_s", "generation")]),
                runs, smooth)
    return fig


# A learned reward (rm.transform=sigmoid puts it on the accuracy's 0-1 scale) beside what the answer
# checker says of the same samples: the two part ways when the policy exploits the reward model.
LEARNED_VS_VERIFIED = Panel("Learned reward vs verified accuracy", "mean RM reward / share correct",
                            [("rewards/*", ""), ("accuracy", "verified accuracy (sampled)")],
                            eval_key="accuracy")


# Code rewards (grpokit.rewards.code): what the programs did in the sandbox, and the time it took.
CODE_PANELS = [
    Panel("Sandbox outcomes", "completions per step", [
        ("code/passed", "passed"), ("code/failed", "failed"), ("code/timeout", "timeout"),
        ("code/crash", "crash"), ("code/memory", "memory"), ("code/output_too_large", "output too large"),
        ("code/no_program", "no program")]),
    Panel("Sandbox time", "seconds per step", [("code/wall_s", "the reward phase's wait"),
                                               ("code/sandbox_s", "in the sandbox, summed over programs")])]


def figures(runs: list[Run], smooth: float = DEFAULT_SMOOTH, target: float | None = None) -> dict[str, Any]:
    """{name: matplotlib Figure} for the given runs (no files, no pyplot state); `target`: the accuracy
    line of the time-to-accuracy figure (drawn when a run has held-out evaluations)."""
    out = {}
    for name, (title, panels) in FIGURES.items():
        fig, axes = new_figure(len(panels), title, runs, smooth)
        for ax, panel in zip(axes, panels):
            draw_panel(ax, panel, runs, smooth)
        out[name] = fig
    out["time"] = time_figure(runs, smooth)
    if any(k.startswith("rewards/rm:") for r in runs for k in r.keys()):  # a learned RM: is it hacked?
        fig, (ax,) = new_figure(1, "Learned reward vs verified accuracy", runs, smooth)
        fig.set_size_inches(10.0, 5.0)  # one panel: the legend names the runs, the title only the figure
        fig.suptitle(f"Learned reward vs verified accuracy (smoothing {smooth:g})", fontsize=12)
        draw_panel(ax, LEARNED_VS_VERIFIED, runs, smooth)
        out["reward_vs_verified"] = fig
    if any(k.startswith("code/") for r in runs for k in r.keys()):   # code rewards: the sandbox's figure
        fig, axes = new_figure(len(CODE_PANELS), "Code rewards: the sandbox", runs, smooth)
        for ax, panel in zip(axes, CODE_PANELS):
            draw_panel(ax, panel, runs, smooth)
        out["code"] = fig
    if any(r.evals for r in runs):
        out["time_to_accuracy"] = accuracy_time_figure(runs, target, COLORS)
    return out


def plot_run(run_dirs: str | Path | Sequence[str | Path], out_dir: str | Path | None = None,
             smooth: float = DEFAULT_SMOOTH, target: float | None = None) -> list[Path]:
    """Write the PNG figures of one run, or of several overlaid.

    Args:
        run_dirs: one run folder or several (each with a metrics.jsonl).
        out_dir: where the PNGs go; default <run>/plots for one run, ./plots-compare for several.
        smooth: EMA weight in [0, 1); 0 draws raw values only.
        target: held-out accuracy marked on time_to_accuracy.png (None: no line).

    Returns:
        The paths written, e.g. [.../reward.png, .../zero_std.png, ...].
    """
    dirs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    if not 0 <= smooth < 1:
        raise ValueError(f"smoothing must be in [0, 1), got {smooth}: e.g. --smooth 0.6")
    out = Path(out_dir) if out_dir is not None else (Path(dirs[0]) / "plots" if len(dirs) == 1
                                                     else Path("plots-compare"))
    runs = load_runs(dirs)
    check_out_dir(out, "--out")  # before any figure is drawn
    paths = []
    for name, fig in figures(runs, smooth, target).items():
        path = out / f"{name}.png"
        with written_aside(path) as tmp:  # .tmp-<name>.png, then renamed: never half a figure
            fig.savefig(tmp, dpi=100)
        paths.append(path)
    return paths
