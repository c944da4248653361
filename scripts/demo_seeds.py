"""Run the built-in demo with several seeds and print the before/after table of docs/demo.md.

    python scripts/demo_seeds.py                    # runs seeds 0 1 2 one after another (~3.5 min each, idle)
    python scripts/demo_seeds.py --no-run           # only summarize runs/demo_seed{0,1,2}

Each run is `grpokit train run.seed=S run.output_dir=runs/demo_seedS` (the demo config otherwise
unchanged); the table is read back from each run's eval.jsonl, the plot of the first seed is copied
to docs/demo_plot.png.
"""

from __future__ import annotations

import argparse
import json
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
    if (dirs[0] / "demo_plot.png").is_file():
        Path("docs").mkdir(exist_ok=True)
        shutil.copy(dirs[0] / "demo_plot.png", "docs/demo_plot.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
