"""fp32 against bf16 matmul rates of this CPU at the shapes `model.precision=auto` is decided on.

    OMP_NUM_THREADS=1 python benchmarks/matmul_rates.py --out benchmarks/results/matmul_rates.jsonl

`torch.nn.functional.linear(x [M, K], w [N, K])`, the best of `--rounds` timings after one warm-up (the
machine's noise is one-sided), at two shapes: 32 x 576 x 1536 (a SmolLM2 decode step's projection for
32 completions) and 2048 x 576 x 49152 (its lm-head over a batch), plus the 1024^3 square the benches
quote as the machine's peak. One JSON row per shape and dtype, with the command, commit, CPU model,
threads and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from search_demo import commit, cpu_model  # noqa: E402

SHAPES = {"decode projection": (32, 576, 1536), "lm head": (2048, 576, 49152), "square": (1024, 1024, 1024)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def best_seconds(m: int, k: int, n: int, dtype: torch.dtype, rounds: int) -> float:
    """The fastest of `rounds` F.linear calls at [m, k] x [n, k]^T (one untimed call first)."""
    torch.manual_seed(0)
    x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
    torch.nn.functional.linear(x, w)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", help="append the rows to this JSONL file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    meta = {
        "command": "python benchmarks/matmul_rates.py " + shlex.join(sys.argv[1:]),
        "commit": commit(),
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }
    rows = []
    for name, (m, k, n) in SHAPES.items():
        for label, dtype in DTYPES.items():
            s = best_seconds(m, k, n, dtype, args.rounds)
            rows.append(
                {
                    "shape": name,
                    "m": m,
                    "k": k,
                    "n": n,
                    "dtype": label,
                    "rounds": args.rounds,
                    "best_s": s,
                    "gflops": 2 * m * k * n / s / 1e9,
                    **meta,
                }
            )
            print(json.dumps(rows[-1]))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
