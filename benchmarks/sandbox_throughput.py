"""Programs per second through grpokit.sandbox.SandboxPool at 1, 2 and 4 workers, in each mode.

    python benchmarks/sandbox_throughput.py [--workers 1 2 4] [--modes bwrap process] [--repeats 3]
        [--record benchmarks/results/sandbox_throughput.jsonl]

The batch is fixed: 32 quick programs (a small function and three asserts on it, one program in four
failing one assert), the same every run. Each (mode, workers) is timed `repeats` times after one warm-up
batch; a row per repeat records the batch's wall time and programs per second, and whether every result
was the one expected (a pool that drops or reorders results fails the check).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from bench_record import machine  # noqa: E402

from grpokit.sandbox import SandboxPool  # noqa: E402


def batch(n: int = 32) -> tuple[list[tuple[str, list[str]]], list[tuple[str, int]]]:
    """n jobs and the (outcome, passed) each must give."""
    jobs, expected = [], []
    for i in range(n):
        wrong = i % 4 == 3
        program = f"def f(x):\n    return x * {i + 1}{' + 1' if wrong else ''}\n"
        tests = ["assert f(0) == 0", f"assert f(1) == {i + 1}", f"assert f(2) == {2 * (i + 1)}"]
        jobs.append((program, tests))
        expected.append(("failed", 0) if wrong else ("passed", 3))
    return jobs, expected


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--modes", nargs="+", default=["bwrap", "process"], choices=["bwrap", "process"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--record", default=str(HERE / "results" / "sandbox_throughput.jsonl"))
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True,
                            text=True).stdout.strip()
    info = {"bench": "sandbox_throughput", "commit": commit, "machine": machine(),
            "platform": platform.platform(), "python": platform.python_version(),
            "date": datetime.date.today().isoformat(),
            "command": "python benchmarks/sandbox_throughput.py " + " ".join(argv or sys.argv[1:])}
    jobs, expected = batch()
    rows = []
    for mode in args.modes:
        for workers in args.workers:
            with SandboxPool(workers=workers, mode=mode) as pool:
                pool.map(jobs)                                   # warm-up: the page cache, the probe
                for repeat in range(args.repeats):
                    start = time.perf_counter()
                    results = pool.map(jobs)
                    seconds = time.perf_counter() - start
                    ok = [(r.outcome, r.passed) for r in results] == expected
                    rows.append({**info, "mode": mode, "workers": workers, "repeat": repeat,
                                 "programs": len(jobs), "seconds": seconds,
                                 "programs_per_s": len(jobs) / seconds, "results_as_expected": ok,
                                 "mean_run_s": sum(r.seconds for r in results) / len(results)})
                    print(f"{mode:8s} workers={workers} repeat={repeat} {seconds:6.2f} s "
                          f"{len(jobs) / seconds:6.1f} programs/s  as expected: {ok}", flush=True)
    with open(args.record, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{len(rows)} rows -> {args.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
