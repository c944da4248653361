"""The arithmetic race's seeds as a band: SmolLM2-135M-Instruct, configs/smollm2_arith_cpu.yaml, grpokit and
TRL 1.16 each on one core for the same 60 training minutes (docs/real_model.md).

Each seed's curve is its held-out evaluations at their training seconds (grpokit.observe.accuracy_time).
On a 10-minute grid a seed has a value only where two of its evaluations at most 15 minutes apart bracket
the grid point (linear between them); a side's cell is the mean over the seeds that have one, with the
lowest and highest. TRL's seeds 0 and 1 were evaluated at the start and the end only, so they give no
interior values; its seed 2 was evaluated every 10 steps (~12 minutes).

    python scripts/docs_race_band.py      # draws docs/arith_race_seeds.png from the raw rows
(scripts/update_readme.py writes the table block, tests/cli/test_readme.py checks it.)
"""

from __future__ import annotations

import statistics
from pathlib import Path

from docs_measured import RESULTS, rows, table

from grpokit.observe.accuracy_time import eval_seconds

RACE = "arith_{side}_race_1thread_60min_seed{seed}"
SIDES = (("smollm2", "grpokit"), ("trl", "TRL 1.16"))
GRID = range(0, 61, 10)  # training minutes
MAX_GAP = 15.0  # minutes: a longer gap between two evaluations is not interpolated


def seeds(side: str) -> list[int]:
    """The seeds with raw rows for this side, in order."""
    found = sorted(RESULTS.glob(RACE.format(side=side, seed="*") + "_eval.jsonl"))
    return sorted(int(p.name.split("seed")[1].split("_")[0]) for p in found)


def curve(side: str, seed: int) -> list[tuple[float, float]]:
    """(training minutes, held-out accuracy) of each evaluation of one seed."""
    name = RACE.format(side=side, seed=seed)
    return [(s / 60, a) for s, a in eval_seconds(rows(f"{name}_metrics.jsonl"), rows(f"{name}_eval.jsonl"))]


def at(points: list[tuple[float, float]], minute: float) -> float | None:
    """The curve's value at `minute`, linear between bracketing evaluations at most MAX_GAP apart."""
    for (t0, a0), (t1, a1) in zip(points, points[1:]):
        if t0 <= minute <= t1 and t1 - t0 <= MAX_GAP:
            return a0 if t1 == t0 else a0 + (a1 - a0) * (minute - t0) / (t1 - t0)
    return points[0][1] if minute == 0 else None


def band(side: str) -> dict[int, list[float]]:
    """Grid minute -> the values of the seeds that have one there."""
    curves = [curve(side, s) for s in seeds(side)]
    return {m: [v for c in curves if (v := at(c, m)) is not None] for m in GRID}


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    mean = f"{100 * statistics.mean(values):.1f}"
    if len(values) == 1:
        return f"{mean} (1 seed)"
    return f"{mean} ({100 * min(values):.1f}-{100 * max(values):.1f}, {len(values)} seeds)"


def race_band() -> str:
    """One row per side: mean (lowest-highest, seeds) at each grid minute, and the end of each seed."""
    out = []
    for side, label in SIDES:
        ends = " / ".join(f"{100 * curve(side, s)[-1][1]:.1f}" for s in seeds(side))
        b = band(side)
        out.append([label, ", ".join(map(str, seeds(side))), *(_cell(b[m]) for m in GRID), ends])
    return table(["side", "seeds", *(f"{m} min" for m in GRID), "each seed's end (%)"], out)


def draw(path: Path) -> Path:
    """Each seed's curve (thin), the mean over the seeds on the grid (bold) and its lowest-highest band."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.0), dpi=100, layout="constrained")
    ax = fig.subplots()
    for (side, label), color in zip(SIDES, ("tab:blue", "tab:orange")):
        for s in seeds(side):
            pts = curve(side, s)
            ax.plot([t for t, _ in pts], [a for _, a in pts], "o-", color=color, alpha=0.35, linewidth=1.0,
                    markersize=3)
        b = {m: v for m, v in band(side).items() if v}
        xs = list(b)
        ax.fill_between(xs, [min(b[m]) for m in xs], [max(b[m]) for m in xs], color=color, alpha=0.15)
        ax.plot(xs, [statistics.mean(b[m]) for m in xs], color=color, linewidth=2.2,
                label=f"{label}: mean of seeds {', '.join(map(str, seeds(side)))} (band: lowest-highest)")
    ax.set_title("SmolLM2-135M arithmetic, one core each for the same hour: held-out accuracy", fontsize=11)
    ax.set_xlabel("training minutes (evaluations off the clock)")
    ax.set_ylabel("held-out accuracy (greedy, 200 problems)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(path)
    return path


BLOCKS = {"real_model.md": {"real-race-band": race_band}}

if __name__ == "__main__":
    print(draw(Path(__file__).resolve().parents[1] / "docs" / "arith_race_seeds.png"))
