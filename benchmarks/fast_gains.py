"""What each of grpokit's CPU speed-ups (grpokit.fast) buys: s/step with it off, against all on.

    python benchmarks/fast_gains.py                       # the demo, bench tiny and small (fp32), 3 rounds
    python benchmarks/fast_gains.py --configs demo --rounds 5

Each (config, variant) runs in a fresh interpreter: `all` (everything on, the default), `plain`
(`fast.accelerated` replaced by `fast.plain()`: the readable path only), or one speed-up switched off
while the others stay on. The variants run in a rotated order each round (this machine drifts); the
table holds the median s/step over rounds and its ratio to `all`: a ratio of 1.20 means the step is
20% slower without that speed-up, i.e. it pays 1.20x. `fused_compile` runs fused_ops' two ops (SiLU x up,
RMSNorm) through `torch.compile` instead of the C kernels: the alternative the kernels must beat; its
first-step extra seconds are the compile warm-up. Configs:

    demo        `grpokit train`'s built-in demo (0.8M-parameter char model, B=16 x G=8, fp32)
    tiny/small  `grpokit bench --size S --completion-length 64 --fixed-length --precision fp32`
                (small's default precision, auto, is bf16 on this CPU, where no C kernel applies)

Results: benchmarks/results/fast_gains.json and the table on stdout (docs/performance.md quotes it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("all", "plain", "attention", "fused_ops", "fused_compile", "gqa", "decode_kernels", "whole_step",
            "keep_memory", "reuse")
BENCH = {"tiny": ["--size", "tiny"], "small": ["--size", "small"]}
BENCH_COMMON = ["--completion-length", "64", "--fixed-length", "--precision", "fp32", "--steps", "6",
                "--warmup", "1"]
OUT = Path(__file__).resolve().parent / "results" / "fast_gains.json"


def switch_off(variant: str) -> None:
    """Turn one speed-up off in this process (before any step runs)."""
    from grpokit import fast

    def off(*args, **kwargs):                     # a context manager that does nothing
        return contextlib.nullcontext()

    if variant == "plain":
        fast.accelerated = lambda *a, **k: fast.plain()
    elif variant == "attention":
        fast.attention.kernel_attention = off
    elif variant == "fused_ops":
        fast.fused_ops.fused_ops = off
    elif variant == "gqa":
        fast._grouped_kv_with_masks = off
    elif variant == "decode_kernels":
        fast.kernels_for = lambda model: None
    elif variant == "whole_step":
        fast.whole_step_for = lambda decoder, rows: None
    elif variant == "fused_compile":              # the same two ops through torch.compile instead of C
        compile_fused_ops(fast.fused_ops)


def compile_fused_ops(module) -> None:
    """Route fused_ops' SiLU x up and RMSNorm through torch.compile'd PyTorch (dynamic shapes)."""
    import types

    import torch
    import torch.nn.functional as F

    silu_mul = torch.compile(lambda g, u: F.silu(g) * u, dynamic=True)
    rms = torch.compile(lambda x, w, eps: w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)),
                        dynamic=True)
    module.SiluMul = types.SimpleNamespace(apply=lambda g, u, lib: silu_mul(g, u))
    module.RMSNormFn = types.SimpleNamespace(apply=lambda x, w, eps, lib: rms(x, w, eps))


def demo_seconds(variant: str, steps: int = 8, warmup: int = 2) -> tuple[float, float]:
    """(median s/step, first step's s) of the built-in demo's train_step under `variant`."""
    from grpokit.config.run_config import demo_config
    from grpokit.train.loop import build_state
    from grpokit.train.step import train_step

    with tempfile.TemporaryDirectory() as out:
        over = {"run.output_dir": out, "run.progress": False, "run.eval_limit": 0}
        if variant == "reuse":
            over["rollout.reuse_activations"] = False
        state = build_state(demo_config(over))
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            train_step(state)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:]), times[0]


def bench_seconds(size: str, variant: str) -> tuple[float, float]:
    """(median s/step, first step's s) of `grpokit bench`'s grpokit side under `variant`."""
    from grpokit.cli.bench import parse_args, run_grpokit

    argv = BENCH[size] + BENCH_COMMON + (["--reuse", "false"] if variant == "reuse" else [])
    result = run_grpokit(parse_args(argv))
    return result["s_per_step"], result["all_steps_s"][0]


def child(config: str, variant: str) -> None:
    switch_off(variant)
    sec, first = demo_seconds(variant) if config == "demo" else bench_seconds(config, variant)
    print(json.dumps({"s_per_step": sec, "first_step_s": first}))


def run_one(config: str, variant: str) -> dict:
    env = {**os.environ, **({"GRPOKIT_KEEP_MEMORY": "0"} if variant == "keep_memory" else {})}
    proc = subprocess.run([sys.executable, __file__, "--child", config, variant], capture_output=True,
                          text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{config}/{variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(runs: list[dict], all_on: list[dict]) -> dict:
    """Median s/step, its ratio to all-on (the gain), and the first step's extra seconds (warm-up)."""
    med = statistics.median(r["s_per_step"] for r in runs)
    first = statistics.median(r["first_step_s"] - r["s_per_step"] for r in runs)
    return {"s_per_step": med, "gain": med / statistics.median(r["s_per_step"] for r in all_on),
            "first_step_extra_s": first, "runs": [round(r["s_per_step"], 4) for r in runs]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="demo,tiny,small", help="comma-separated: demo, tiny, small")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    results: dict[str, dict[str, list[dict]]] = {}
    for config in args.configs.split(","):
        results[config] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            for variant in order if r % 2 == 0 else order[::-1]:
                results[config][variant].append(run_one(config, variant))
                row = results[config][variant][-1]
                print(f"{config} round {r + 1} {variant}: {row['s_per_step']:.3f} s/step (first step "
                      f"{row['first_step_s']:.2f} s)", file=sys.stderr, flush=True)
    table = {c: {v: summary(x, res["all"]) for v, x in res.items()} for c, res in results.items()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"rounds": args.rounds, "threads": os.environ.get("OMP_NUM_THREADS", "default"),
                               "results": table}, indent=2) + "\n")
    print("| speed-up off | " + " | ".join(f"{c}: s/step (x of all on), first-step extra s"
                                         for c in table) + " |")
    print("|---|" + "---|" * len(table))
    for v in VARIANTS:
        print(f"| {v} | " + " | ".join(f"{table[c][v]['s_per_step']:.3f} ({table[c][v]['gain']:.2f}x), "
                                       f"{table[c][v]['first_step_extra_s']:+.1f}" for c in table) + " |")


if __name__ == "__main__":
    main()
