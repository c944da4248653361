"""Reading the raw rows under benchmarks/results/: JSON lines, JSON files, benchmark runs that end in a
summary row, `grpokit bench` runs that end in a compare row, and the tables scripts/experiments.py wrote."""

from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def rows(name: str | Path) -> list[dict]:
    """The JSON lines of benchmarks/results/`name`, or of the file `name` is a Path to (blank lines left "
    "out)."""
    path = name if isinstance(name, Path) else RESULTS / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load(name: str):
    """The JSON file benchmarks/results/`name`."""
    return json.loads((RESULTS / name).read_text())


def benchmarks(name: str) -> list[tuple[list[dict], dict]]:
    """Every benchmark recorded in `name`, oldest first: (its per-run rows, its summary row)."""
    out, runs = [], []
    for r in rows(name):
        if r.get("summary"):
            out.append((runs, r))
            runs = []
        else:
            runs.append(r)
    return out


def last_benchmark(name: str) -> tuple[list[dict], dict]:
    """(the per-run rows, the summary) of the last benchmark recorded in `name`."""
    return benchmarks(name)[-1]


def bench_run(name: str, run: int = 0) -> tuple[list[dict], list[dict], dict]:
    """(grpokit's rows by round, TRL's rows by round, the compare row) of run `run` in bench file `name`:
    a bench file holds the sides' rows (alternated, one per side and round) and then the run's compare row."""
    runs, sides = [], []
    for r in rows(name):
        compare = r.get("compare", r if "ratio_trl_over_grpokit_s_per_step" in r else None)
        if compare is not None:
            runs.append(
                (
                    [s for s in sides if s["side"] == "grpokit"], [s for s in sides if s["side"] == "trl"],
                    compare,
                )
            )
            sides = []
        elif "side" in r:
            sides.append(r)
    return runs[run]


def md_tables(name: str) -> tuple[list[list[list[str]]], str]:
    """The tables of experiments/NAME.md (each a list of rows of cells, header first) and its last line."""
    text = (RESULTS / "experiments" / f"{name}.md").read_text()
    tables = []
    for chunk in text.strip().split("\n\n"):
        lines = [ln for ln in chunk.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
        if lines:
            tables.append([[c.strip() for c in ln.strip("|").split("|")] for ln in lines])
    return tables, text.strip().splitlines()[-1]


def max_rss_gib(name: str) -> float:
    """The peak RSS (GiB) `/usr/bin/time -v` wrote to benchmarks/results/NAME."""
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", (RESULTS / name).read_text()).group(1))
    return kb / 2**20


def newest_group(found: list[dict], keys: tuple[str, ...] = ("date", "commit")) -> list[dict]:
    """The rows that share the last row's `keys`: the newest set of a file that keeps older sets too."""
    last = tuple(found[-1].get(k) for k in keys)
    return [r for r in found if tuple(r.get(k) for k in keys) == last]


def interpolate(points: list[tuple[float, float]], x: float) -> float | None:
    """The curve `points` (x, y) read at `x`, linear between its points; None outside them."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None
