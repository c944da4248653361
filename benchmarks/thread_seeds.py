"""The shipped arithmetic recipe at 1 and 2 threads, several seeds: does the thread count move learning?

    python benchmarks/thread_seeds.py                       # seeds 0 1 2 at 2 threads then 1, alternating
    python benchmarks/thread_seeds.py --seeds 0 --threads 2,1 --steps 60
    python benchmarks/thread_seeds.py --no-run             # only re-read runs/thread_seeds/

Each run is `OMP_NUM_THREADS=T grpokit train configs/smollm2_arith_cpu.yaml run.seed=S
run.max_steps=STEPS run.max_minutes=0 run.eval_steps=0 run.save_steps=0` (the config otherwise
unchanged), in its own process, the thread counts alternated inside each seed. One row per run goes to
benchmarks/results/arith_thread_seeds.jsonl: greedy held-out accuracy before / after, the first
steps' loss, reward and gradient norm (where the two thread counts part), and how the run was made.
Learning outcomes do not depend on load (a fixed thread count partitions every reduction the same way),
so the runs may share the machine; their seconds are then not clean, and each row records the load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "arith_thread_seeds.jsonl"
CONFIG = "configs/smollm2_arith_cpu.yaml"


def _machine() -> str:
    info = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines()
             if ln.startswith("model name")] if info.is_file() else []
    return f"{names[0] if names else platform.processor()}, {os.cpu_count()} cores"


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT, check=False).stdout.strip()
    # what the run executes (its own rows, written between runs, do not make the tree dirty)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "src", "configs",
                            "benchmarks/thread_seeds.py"], capture_output=True, text=True, cwd=ROOT,
                           check=False).stdout.strip()
    return head + ("+dirty" if dirty else "")


def _overrides(seed: int, steps: int, run: Path) -> list[str]:
    return [f"run.seed={seed}", f"run.max_steps={steps}", "run.max_minutes=0", "run.eval_steps=0",
            "run.save_steps=0", f"run.output_dir={run}"]


def run_one(*, seed: int, threads: int, steps: int, run: Path) -> dict:
    """Train one run in its own process at `threads` threads; return its raw row."""
    cmd = [sys.executable, "-m", "grpokit", "train", CONFIG, *_overrides(seed, steps, run), "--overwrite"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    return read_row(seed=seed, threads=threads, run=run, wall=wall, load=load, steps=steps)


def read_row(*, seed: int, threads: int, run: Path, wall: float | None, load: float | None,
             steps: int) -> dict:
    """One run's row from its eval.jsonl and metrics.jsonl."""
    evals = {r["tag"]: r for r in map(json.loads, (run / "eval.jsonl").read_text().splitlines())}
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    first = [m for m in metrics if "loss" in m][:5]
    return {"seed": seed, "threads": threads, "before": evals["before"]["accuracy"],
            "after": evals["after"]["accuracy"], "steps": evals["after"]["step"],
            "problems": int(evals["after"]["num_problems"]),
            "first_losses": [m["loss"] for m in first],
            "first_rewards": [m.get("reward_mean") for m in first],
            "first_grad_norms": [m.get("grad_norm") for m in first],
            "train_s": sum(m.get("time/step", 0.0) for m in metrics), "wall_s": wall,
            "load_at_start": load,
            "command": f"OMP_NUM_THREADS={threads} grpokit train {CONFIG} "
                       + " ".join(_overrides(seed, steps, run)),
            "commit": _commit(), "machine": _machine(), "date": datetime.date.today().isoformat()}


def table(rows: list[dict]) -> str:
    """Held-out accuracy after the run, one line per seed, one column per thread count."""
    counts = sorted({r["threads"] for r in rows})
    lines = ["| seed | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in counts) + " |",
             "|---" * (len(counts) + 1) + "|"]
    for seed in sorted({r["seed"] for r in rows}):
        by = {r["threads"]: r for r in rows if r["seed"] == seed}
        cells = [f"{100 * by[t]['before']:.1f}% -> {100 * by[t]['after']:.1f}%" if t in by else "n/a"
                 for t in counts]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--threads", default="2,1", help="thread counts, alternated seed by seed")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--no-run", action="store_true", help="only re-read existing runs")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    counts = [int(t) for t in args.threads.split(",")]
    rows = [json.loads(ln) for ln in OUT.read_text().splitlines()] if OUT.is_file() else []
    for i, seed in enumerate(seeds):
        order = counts if i % 2 == 0 else counts[::-1]
        for threads in order:
            run = ROOT / "runs" / "thread_seeds" / f"t{threads}_seed{seed}"
            if args.no_run:
                continue
            row = run_one(seed=seed, threads=threads, steps=args.steps, run=run)
            rows = [r for r in rows if (r["seed"], r["threads"]) != (seed, threads)] + [row]
            OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))
            print(json.dumps({k: row[k] for k in ("seed", "threads", "before", "after", "wall_s")}),
                  flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
