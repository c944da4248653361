"""Run the built-in demo with several seeds and print the before/after table of docs/demo.md.

    python scripts/demo_seeds.py                    # runs seeds 0 1 2 one after another (~3.5 min each, idle)
    python scripts/demo_seeds.py --no-run           # only summarize runs/demo_seed{0,1,2}

Each run is `grpokit train run.seed=S run.output_dir=runs/demo_seedS` (the demo config otherwise
unchanged); the table is read back from each run's eval.jsonl, the plot of the first seed is copied
to docs/demo_plot.png, and one row per seed (before, after, wall time, command, commit, machine, date)
is written to benchmarks/results/demo_seeds.jsonl, which the README's headline table is computed from.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path


def summarize(run_dirs: list[Path]) -> str:
    """A markdown table: one row per run, greedy held-out accuracy before / after, and the wall time."""
    lines = ["| seed | held-out problems | accuracy before | accuracy after | change | steps | wall time |",
             "|---|---|---|---|---|---|---|"]
    for d in run_dirs:
        rows = {}
        for line in (d / "eval.jsonl").read_text().splitlines():
            r = json.loads(line)
            rows[r["tag"]] = r
        b, a = rows["before"], rows["after"]
        wall = (d / "wall_seconds.txt").read_text().strip() if (d / "wall_seconds.txt").is_file() else "n/a"
        lines.append(f"| {d.name.rsplit('seed', 1)[-1]} | {int(b['num_problems'])} | "
                     f"{100 * b['accuracy']:.1f}% | {100 * a['accuracy']:.1f}% | "
                     f"{100 * (a['accuracy'] - b['accuracy']):+.1f} pt | {a['step']} | {wall} s |")
    return "\n".join(lines)


def result_row(seed: str, run: Path) -> dict:
    """One seed's raw row: the before / after evaluations and how the run was made."""
    evals = {r["tag"]: r for r in map(json.loads, (run / "eval.jsonl").read_text().splitlines())}
    wall = run / "wall_seconds.txt"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() \
        else platform.processor()
    return {"seed": int(seed), "before": evals["before"]["accuracy"], "after": evals["after"]["accuracy"],
            "eval_before": evals["before"], "eval_after": evals["after"],
            "steps": evals["after"]["step"], "problems": int(evals["after"]["num_problems"]),
            "wall_s": float(wall.read_text()) if wall.is_file() else None,
            "command": f"grpokit train run.seed={seed} run.output_dir={run} --overwrite", "commit": commit,
            "machine": f"{cpu}, {os.cpu_count()} cores",
            "threads": os.environ.get("OMP_NUM_THREADS", "default"),
            "date": datetime.date.today().isoformat()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--no-run", action="store_true", help="only summarize existing runs")
    args = p.parse_args()
    dirs = [Path(f"runs/demo_seed{s}") for s in args.seeds.split(",")]
    if not args.no_run:
        for s, d in zip(args.seeds.split(","), dirs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "grpokit", "train", f"run.seed={s}", f"run.output_dir={d}",
                            "--overwrite"], check=True)
            (d / "wall_seconds.txt").write_text(f"{time.perf_counter() - start:.0f}\n")
    print(summarize(dirs))
    rows = [result_row(s, d) for s, d in zip(args.seeds.split(","), dirs)]
    out = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "demo_seeds.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if (dirs[0] / "demo_plot.png").is_file():
        Path("docs").mkdir(exist_ok=True)
        shutil.copy(dirs[0] / "demo_plot.png", "docs/demo_plot.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
