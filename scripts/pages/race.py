"""The arithmetic race of docs/real_model.md and the README: SmolLM2-135M-Instruct,
configs/smollm2_arith_cpu.yaml, grpokit and TRL 1.16 each on one core for the same 60 training minutes.

Seeds 0 and 1 ran on 2026-12-03 and seed 2 on 2026-12-05, on machines of one kind whose speed differed
(grpokit's median step 14.5 s then, 5.8 s on seed 2's day), so minutes are compared only within a seed (both
sides ran at once) and the band across seeds is drawn over GRPO steps: at each step of STEP_GRID, the mean of
the seeds evaluated at exactly that step, with the lowest and highest (no interpolation). Within a seed whose
two sides were both evaluated densely (seed 2: TRL every 10 steps, ~6 minutes of its training; grpokit every
50, ~5 minutes), the training minutes to each 5-point mark both sides reach are read off the curves, linear
between evaluations at most MAX_GAP minutes apart.

    python scripts/update_readme.py --plots      # also draws docs/arith_race_seeds.png from the raw rows
"""

from __future__ import annotations

import statistics
from pathlib import Path

from grpokit.observe.accuracy_time import eval_seconds

from .raw import RESULTS, max_rss_gib, rows
from .render import Block, Column, Table, headline_row

RACE = "arith_{side}_race_1thread_60min_seed{seed}"
SIDES = (("smollm2", "grpokit"), ("trl", "TRL 1.16"))
STEP_GRID = (0, 50, 100, 150, 200)  # every grpokit seed was evaluated at these steps
MAX_GAP = 15.0  # minutes: a longer gap between two evaluations is not interpolated
ARITH = "arith_smollm2_t1_lr1e5_seed0"


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


def _band_rows() -> list[dict]:
    out = []
    for side, label in SIDES:
        evals = [by_step(side, s) for s in seeds(side)]
        b = band(side)
        out.append(
            {
                "label": label, "seeds": seeds(side), "cells": [_cell(b[m]) for m in STEP_GRID],
                "ends": [f"{100 * e[max(e)]:.1f} ({max(e)})" for e in evals],
            }
        )
    return out


BAND = Table(
    rows=_band_rows,
    columns=(
        Column("side", "{label}"), Column("seeds", "{seeds:|, }"),
        *(Column(f"step {m}", f"{{cells[{i}]}}") for i, m in enumerate(STEP_GRID)),
        Column("each seed's end: % (step)", "{ends}"),
    ),
)


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


def _mark_rows() -> list[dict]:
    out = []
    for seed in seeds("trl"):
        g, t = curve("smollm2", seed), curve("trl", seed)
        if max(b[0] - a[0] for a, b in zip(t, t[1:])) > MAX_GAP:
            continue
        top = min(max(a for _, a in g), max(a for _, a in t))
        for mark in [m / 100 for m in range(25, int(100 * top) + 1, 5)]:
            mg, mt = crossing(g, mark), crossing(t, mark)
            out.append(
                {
                    "seed": seed, "mark": 100 * mark, "g": _minute(mg), "t": _minute(mt),
                    "ratio": f"{mt / mg:.1f}x" if mg and mt else "-",
                }
            )
    return out


MARKS = Table(
    rows=_mark_rows,
    columns=(
        Column("seed", "{seed}"), Column("mark", "{mark:.0f}%"), Column("grpokit, training minutes", "{g}"),
        Column("TRL 1.16, training minutes", "{t}"), Column("TRL / grpokit", "{ratio}"),
    ),
)


def median_phases(metrics: list[dict]) -> str:
    """' (generation G, reference R, update U)': a run's median seconds per phase, where it logged them."""
    keys = (("time/generate", "generation"), ("time/ref_forward", "reference"), ("time/update", "update"))
    parts = [f"{name} {statistics.median(r[k] for r in metrics):.2f}" for k, name in keys if k in metrics[0]]
    return f" ({', '.join(parts)})" if parts and "time/ref_forward" in metrics[0] else ""


def _rss(name: str, metrics: list[dict]) -> str:
    if (RESULTS / f"{name}_time_v.txt").is_file():
        return f"{max_rss_gib(f'{name}_time_v.txt'):.1f} GiB (`/usr/bin/time -v`)"
    rss = max((r.get("peak_rss_mib", 0) for r in metrics), default=0)
    return f"{rss:.0f} MiB (the run's metrics)" if rss else "not in its metrics"


def _race_rows() -> list[dict]:
    out = []
    for seed in seeds("smollm2"):
        for side, label in (
            ("smollm2", "grpokit (bf16 mixed)"), ("trl", "TRL 1.16 GRPOTrainer (its bf16 default)"),
        ):
            name = RACE.format(side=side, seed=seed)
            m, evals = rows(f"{name}_metrics.jsonl"), rows(f"{name}_eval.jsonl")
            out.append(
                {
                    "who": f"{seed}, {label}", "steps": len(m),
                    "secs": sum(r.get("time/step", 0.0) for r in m),
                    "median": statistics.median(r["time/step"] for r in m), "phases": median_phases(m),
                    "evals": ", ".join(
                        f"{s / 60:.0f}: {100 * a:.1f}" for s, a in eval_seconds(m, evals)[:-1]
                    ),
                    "end": evals[-1]["accuracy"], "rss": _rss(name, m),
                }
            )
    return out


RACE_TABLE = Table(
    rows=_race_rows,
    columns=(
        Column("seed, side", "{who}"), Column("steps in 60 min", "{steps} ({secs:.0f} s)"),
        Column("median s/step", "{median:.2f}{phases}"),
        Column("held-out accuracy at each evaluation before the end (training minute: %)", "{evals}"),
        Column("end", "**{end:percent}**"), Column("peak RSS", "{rss}"),
    ),
)


def _two_thread_rows() -> list[dict]:
    sides = []
    for label, name in (
        ("grpokit", ARITH), ("TRL 1.16 GRPOTrainer (bf16 default)", "arith_trl_t1_lr1e5_seed0_50steps"),
    ):
        m, evals = rows(f"{name}_metrics.jsonl"), rows(f"{name}_eval.jsonl")
        seconds = [sum(r["time/step"] for r in m[:k]) for k in range(len(m) + 1)]
        sides.append(
            {
                "label": label, "steps": len(m), "total": seconds[-1],
                "median": statistics.median(r["time/step"] for r in m),
                "at": {e["step"]: (e["accuracy"], seconds[e["step"]]) for e in evals},
            }
        )
    budget = sides[1]["total"]
    for s in sides:
        within = [f"{100 * a:.1f}% (step {k})" for k, (a, t) in s["at"].items() if t <= budget and k]
        s |= {
            "at50": s["at"][50][0], "t50": s["at"][50][1], "within": "; ".join(within[-2:]), "budget": budget,
        }
    return sides


TWO_THREADS = Table(
    rows=_two_thread_rows,
    columns=lambda found: (
        Column("", "{label}"), Column("steps", "{steps}"), Column("training seconds", "{total:.0f}"),
        Column("s/step (median)", "{median:.2f}"),
        Column("held-out accuracy at step 50", "{at50:percent} ({t50:.0f} s)"),
        Column(f"evaluations within {found[0]['budget']:.0f} s of training (last two)", "{within}"),
    ),
)


def headline() -> list[dict]:
    def end(side: str, seed: int) -> tuple[float, float, int]:
        name = RACE.format(side=side, seed=seed)
        ev = rows(f"{name}_eval.jsonl")
        return ev[0]["accuracy"], ev[-1]["accuracy"], len(rows(f"{name}_metrics.jsonl"))

    sd = seeds("smollm2")
    g, t = [end("smollm2", s) for s in sd], [end("trl", s) for s in sd]
    per_step = [gs[2] / ts[2] for gs, ts in zip(g, t)]
    return [
        headline_row(
            "SmolLM2-135M-Instruct, arithmetic, the same hour as TRL 1.16 (one core each, seeds {seeds})",
            "grpokit {start:percent} -> {g:percent}; TRL {t:percent}; {lo:.1f}-{hi:.1f}x the steps",
            "real model", "real_model.md", "arith_*_race_1thread_60min_seed*", seeds=sd, start=g[0][0],
            g=[x[1] for x in g], t=[x[1] for x in t], lo=min(per_step), hi=max(per_step),
        )
    ]


def draw(path: Path) -> Path:
    """Held-out accuracy against the GRPO step: each seed (thin), grpokit's mean and band over STEP_GRID."""
    from matplotlib.figure import Figure  # the pages need no matplotlib; only this drawing does

    fig = Figure(figsize=(8.0, 5.0), dpi=100, layout="constrained")
    ax = fig.subplots()
    for (side, label), color in zip(SIDES, ("tab:blue", "tab:orange")):
        for s, marker in zip(seeds(side), "os^v"):
            e = by_step(side, s)
            ax.plot(
                list(e), list(e.values()), f"{marker}-", color=color, alpha=0.55, linewidth=1.0, markersize=4,
                label=f"{label}, seed {s}",
            )
        b = {m: v for m, v in band(side).items() if len(v) > 1}
        if side == "smollm2":
            xs = list(b)
            ax.fill_between(xs, [min(b[m]) for m in xs], [max(b[m]) for m in xs], color=color, alpha=0.2)
            ax.plot(
                xs, [statistics.mean(b[m]) for m in xs], color=color, linewidth=2.4,
                label=f"{label}: mean of seeds {', '.join(map(str, seeds(side)))}, band lowest-highest",
            )
    ax.set_title("SmolLM2-135M arithmetic, each side on one core for 60 training minutes", fontsize=11)
    ax.set_xlabel("GRPO step (the hour's end: 240-617 steps for grpokit, 47-92 for TRL)")
    ax.set_ylabel("held-out accuracy (greedy, 200 problems)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", ncol=2)
    fig.savefig(path)
    return path


def _block(name: str, table: Table) -> Block:
    return Block("docs/real_model.md", name, (table,))


BLOCKS = [
    _block("real-race", RACE_TABLE), _block("real-race-2threads", TWO_THREADS),
    _block("real-race-band", BAND), _block("real-race-marks", MARKS),
]
