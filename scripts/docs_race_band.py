"""The arithmetic race's seeds: SmolLM2-135M-Instruct, configs/smollm2_arith_cpu.yaml, grpokit and TRL 1.16
each on one core for the same 60 training minutes (docs/real_model.md).

Seeds 0 and 1 ran on 2026-12-03 and seed 2 on 2026-12-05, on machines of one kind whose speed differed
(grpokit's median step 14.5 s then, 5.8 s on seed 2's day), so minutes are compared only within a
seed (both sides ran at once) and the band across seeds is drawn over GRPO steps: at each step of
STEP_GRID, the mean of the seeds evaluated at exactly that step, with the lowest and highest (no
interpolation). Within a seed whose two sides were both evaluated densely (seed 2: TRL every 10 steps,
~6 minutes of its training; grpokit every 50, ~5 minutes), the training minutes to each 5-point mark
both sides reach are read off the curves, linear between evaluations at most MAX_GAP minutes apart.

    python scripts/docs_race_band.py      # draws docs/arith_race_seeds.png from the raw rows
(scripts/update_readme.py writes the tables, tests/cli/test_readme.py checks them.)
"""

from __future__ import annotations

import statistics
from pathlib import Path

from docs_measured import RESULTS, rows, table

from grpokit.observe.accuracy_time import eval_seconds

RACE = "arith_{side}_race_1thread_60min_seed{seed}"
SIDES = (("smollm2", "grpokit"), ("trl", "TRL 1.16"))
STEP_GRID = (0, 50, 100, 150, 200)  # every grpokit seed was evaluated at these steps
MAX_GAP = 15.0  # minutes: a longer gap between two evaluations is not interpolated


def seeds(side: str) -> list[int]:
    """The seeds with raw rows for this side, in order."""
    found = sorted(RESULTS.glob(RACE.format(side=side, seed="*") + "_eval.jsonl"))
    return sorted(int(p.name.split("seed")[1].split("_")[0]) for p in found)


def curve(side: str, seed: int) -> list[tuple[float, float]]:
    """(training minutes, held-out accuracy) of each evaluation of one seed."""
    name = RACE.format(side=side, seed=seed)
    return [(t / 60, a) for t, a in eval_seconds(rows(f"{name}_metrics.jsonl"), rows(f"{name}_eval.jsonl"))]


def by_step(side: str, seed: int) -> dict[int, float]:
    """Step -> held-out accuracy of each evaluation of one seed (the end's step: its last logged step)."""
    return {int(e["step"]): e["accuracy"] for e in rows(f"{RACE.format(side=side, seed=seed)}_eval.jsonl")}


def band(side: str) -> dict[int, list[float]]:
    """Grid step -> the accuracies of the seeds evaluated at that step."""
    evals = [by_step(side, s) for s in seeds(side)]
    return {step: [e[step] for e in evals if step in e] for step in STEP_GRID}


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    mean = f"{100 * statistics.mean(values):.1f}"
    if len(values) == 1:
        return f"{mean} (1 seed)"
    return f"{mean} ({100 * min(values):.1f}-{100 * max(values):.1f}, {len(values)} seeds)"


def race_band() -> str:
    """One row per side: mean (lowest-highest, seeds) at each grid step; each seed's end and its step."""
    out = []
    for side, label in SIDES:
        evals = [by_step(side, s) for s in seeds(side)]
        ends = " / ".join(f"{100 * e[max(e)]:.1f} ({max(e)})" for e in evals)
        b = band(side)
        out.append([label, ", ".join(map(str, seeds(side))), *(_cell(b[m]) for m in STEP_GRID), ends])
    return table(["side", "seeds", *(f"step {m}" for m in STEP_GRID), "each seed's end: % (step)"], out)


def crossing(points: list[tuple[float, float]], target: float) -> float | None:
    """The first minute the curve reaches `target`, linear between bracketing evaluations at most MAX_GAP
    apart; None when it never does or only across a longer gap."""
    target -= 1e-6  # accuracies are float32 counts of 200: 0.35 is stored as 0.3499999940...
    if points and points[0][1] >= target:
        return points[0][0]
    for (t0, a0), (t1, a1) in zip(points, points[1:]):
        if a1 >= target:
            return t0 + (target - a0) * (t1 - t0) / (a1 - a0) if t1 - t0 <= MAX_GAP else None
    return None


def _minute(m: float | None) -> str:
    return "-" if m is None else f"{m:.1f}"


def race_marks() -> str:
    """Time to each 5-point mark, for the seeds whose two sides were both evaluated densely."""
    out = []
    for seed in seeds("trl"):
        g, t = curve("smollm2", seed), curve("trl", seed)
        if max(b[0] - a[0] for a, b in zip(t, t[1:])) > MAX_GAP:
            continue
        top = min(max(a for _, a in g), max(a for _, a in t))
        for mark in [m / 100 for m in range(25, int(100 * top) + 1, 5)]:
            mg, mt = crossing(g, mark), crossing(t, mark)
            ratio = f"{mt / mg:.1f}x" if mg and mt else "-"
            out.append([seed, f"{100 * mark:.0f}%", _minute(mg), _minute(mt), ratio])
    return table(["seed", "mark", "grpokit, training minutes", "TRL 1.16, training minutes",
                  "TRL / grpokit"], out)


def draw(path: Path) -> Path:
    """Held-out accuracy against the GRPO step: each seed (thin), grpokit's mean and band over STEP_GRID."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.0), dpi=100, layout="constrained")
    ax = fig.subplots()
    for (side, label), color in zip(SIDES, ("tab:blue", "tab:orange")):
        for s, marker in zip(seeds(side), "os^v"):
            e = by_step(side, s)
            ax.plot(list(e), list(e.values()), f"{marker}-", color=color, alpha=0.55, linewidth=1.0,
                    markersize=4, label=f"{label}, seed {s}")
        b = {m: v for m, v in band(side).items() if len(v) > 1}
        if side == "smollm2":
            xs = list(b)
            ax.fill_between(xs, [min(b[m]) for m in xs], [max(b[m]) for m in xs], color=color, alpha=0.2)
            ax.plot(xs, [statistics.mean(b[m]) for m in xs], color=color, linewidth=2.4,
                    label=f"{label}: mean of seeds {', '.join(map(str, seeds(side)))}, band lowest-highest")
    ax.set_title("SmolLM2-135M arithmetic, each side on one core for 60 training minutes", fontsize=11)
    ax.set_xlabel("GRPO step (the hour's end: 240-617 steps for grpokit, 47-92 for TRL)")
    ax.set_ylabel("held-out accuracy (greedy, 200 problems)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", ncol=2)
    fig.savefig(path)
    return path


BLOCKS = {"real_model.md": {"real-race-band": race_band, "real-race-marks": race_marks}}

if __name__ == "__main__":
    print(draw(Path(__file__).resolve().parents[1] / "docs" / "arith_race_seeds.png"))
