"""Run the built-in demo with several seeds and print the before/after table of docs/demo.md.

    python scripts/demo_seeds.py                    # runs seeds 0 1 2 one after another (~3.5 min each, idle)
    python scripts/demo_seeds.py --no-run           # only summarize runs/demo_seed{0,1,2}
    python scripts/demo_seeds.py --config configs/code_demo.yaml   # the code demo: runs/code_demo_seed{0,1,2}

Each run is `grpokit train [CONFIG] run.seed=S run.output_dir=runs/NAME_seedS` (the config otherwise
unchanged; NAME is demo, or the config file's stem); the table is read back from each run's eval.jsonl,
the plot of the first seed is copied to docs/NAME_plot.png, and one row per seed (before, after, wall
time, command, commit, machine, date) is written to benchmarks/results/NAME_seeds.jsonl, which the
README's headline table and the pages' blocks are computed from.
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
        code = "rewards/code_tests"
        tests = f" (tests passed {100 * b[code]:.1f}% -> {100 * a[code]:.1f}%)" if code in a else ""
        lines.append(f"| {d.name.rsplit('seed', 1)[-1]} | {int(b['num_problems'])} | "
                     f"{100 * b['accuracy']:.1f}% | {100 * a['accuracy']:.1f}%{tests} | "
                     f"{100 * (a['accuracy'] - b['accuracy']):+.1f} pt | {a['step']} | {wall} s |")
    return "\n".join(lines)


def _train_seconds(run: Path) -> float:
    """The steps' own seconds (metrics.jsonl's time/step): the run without its evaluations and start."""
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return sum(r.get("time/step", 0.0) for r in steps)


def result_row(seed: str, run: Path, config: str | None = None) -> dict:
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
            "wall_s": float(wall.read_text()) if wall.is_file() else None, "train_s": _train_seconds(run),
            "command": " ".join(["grpokit train", *([config] if config else []), f"run.seed={seed}",
                                 f"run.output_dir={run} --overwrite"]), "commit": commit,
            "machine": f"{cpu}, {os.cpu_count()} cores",
            "threads": os.environ.get("OMP_NUM_THREADS", "default"),
            "date": datetime.date.today().isoformat()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--no-run", action="store_true", help="only summarize existing runs")
    p.add_argument("--config", help="a config file (default: the built-in demo)")
    args = p.parse_args()
    name = Path(args.config).stem if args.config else "demo"
    dirs = [Path(f"runs/{name}_seed{s}") for s in args.seeds.split(",")]
    if not args.no_run:
        for s, d in zip(args.seeds.split(","), dirs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "grpokit", "train", *([args.config] if args.config else []),
                            f"run.seed={s}", f"run.output_dir={d}", "--overwrite"], check=True)
            (d / "wall_seconds.txt").write_text(f"{time.perf_counter() - start:.0f}\n")
    print(summarize(dirs))
    rows = [result_row(s, d, args.config) for s, d in zip(args.seeds.split(","), dirs)]
    out = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / f"{name}_seeds.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if (dirs[0] / "demo_plot.png").is_file():
        Path("docs").mkdir(exist_ok=True)
        shutil.copy(dirs[0] / "demo_plot.png", f"docs/{name}_plot.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
