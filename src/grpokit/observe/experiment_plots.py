"""The figures of docs/experiments.md: panels of curves with the seeds as a band, and grouped bars.

    fig = Panels(title="group size k", columns=3)
    fig.curves(seed_bands(rows, sweep_dir, "eval/accuracy", x="completions"), title="held-out accuracy",
               xlabel="completions sampled", ylabel="greedy accuracy")
    fig.bars({"G=8": [0.1, 0.3]}, categories=["0/8", "1/8"], title="gradient share", ylabel="share")
    fig.save("docs/experiments/k.png")

A curve is each cell name's seed mean (solid), its min-max over seeds (band) and, when the seeds' x
values differ (x = training seconds), each seed as a thin line of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from grpokit.errors import written_aside
from grpokit.observe.experiments import Band
from grpokit.observe.plots import COLORS


class Panels:
    """A grid of panels filled in order, saved as one PNG."""

    def __init__(self, *, title: str, columns: int = 3) -> None:
        self.title, self.columns = title, columns
        self._draw: list = []

    def curves(self, bands: Sequence[Band], *, title: str, xlabel: str, ylabel: str,
               percent: bool = False, logx: bool = False) -> None:
        """One panel: a line per Band (the seed mean), its min-max as a band."""
        def draw(ax) -> None:
            for i, band in enumerate(bands):
                color = COLORS[i % len(COLORS)]
                scale = 100.0 if percent else 1.0
                spread = len({tuple(s[0]) for s in band.seeds}) > 1
                if spread:
                    for xs, ys in band.seeds:
                        ax.plot(xs, [y * scale for y in ys], "-", color=color, alpha=0.35, linewidth=0.9)
                ax.plot(band.xs, [y * scale for y in band.mean], "-", color=color, linewidth=1.8,
                        marker="o" if len(band.xs) <= 12 else None, markersize=3,
                        label=f"{band.label} ({len(band.seeds)} seeds)")
                if len(band.seeds) > 1 and not spread:
                    ax.fill_between(band.xs, [y * scale for y in band.lo], [y * scale for y in band.hi],
                                    color=color, alpha=0.15)
            if logx:
                ax.set_xscale("log")
            self._axes(ax, title, xlabel, ylabel + (" (%)" if percent else ""))
        self._draw.append(draw)

    def bars(self, series: dict[str, Sequence[float]], *, categories: Sequence[str], title: str,
             ylabel: str, xlabel: str = "") -> None:
        """One panel: grouped bars, a colour per series, a group per category (NaN drawn as 0)."""
        def draw(ax) -> None:
            width = 0.8 / max(1, len(series))
            for i, (name, values) in enumerate(series.items()):
                xs = [c + (i - (len(series) - 1) / 2) * width for c in range(len(categories))]
                ax.bar(xs, [0.0 if math.isnan(v) else v for v in values], width=width,
                       color=COLORS[i % len(COLORS)], label=name)
            ax.set_xticks(range(len(categories)), list(categories), fontsize=8,
                          rotation=30 if sum(len(c) for c in categories) > 60 else 0)
            self._axes(ax, title, xlabel, ylabel)
        self._draw.append(draw)

    @staticmethod
    def _axes(ax, title: str, xlabel: str, ylabel: str) -> None:
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")

    def save(self, path: str | Path) -> Path:
        """Draw every panel and write the PNG (atomically: written aside, then renamed)."""
        from matplotlib.figure import Figure

        cols = min(self.columns, max(1, len(self._draw)))
        rows = math.ceil(len(self._draw) / cols) if self._draw else 1
        fig = Figure(figsize=(5.2 * cols, 4.0 * rows), dpi=100, layout="constrained")
        grid = fig.subplots(rows, cols, squeeze=False).flatten()
        for ax in grid[len(self._draw):]:
            ax.set_visible(False)
        for ax, draw in zip(grid, self._draw):
            draw(ax)
        fig.suptitle(self.title, fontsize=12)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with written_aside(path) as tmp:
            fig.savefig(tmp, dpi=100)
        return path
