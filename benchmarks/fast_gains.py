"""What each of grpokit's CPU speed-ups (grpokit.fast) buys: s/step with it off, against all on.

    python benchmarks/fast_gains.py                        # demo, tiny and small (fp32), 12 steps a variant
    python benchmarks/fast_gains.py --configs demo --steps 20

One process per config builds the training state once, then runs steps with the variants interleaved
(one step each, in a rotated order, over and over), so the machine's drift hits every variant alike.
Variants: `all` (everything on, the default), `plain` (`switch.accelerated` replaced by `switch.plain()`:
the readable path only), or one speed-up switched off while the others stay on. `keep_memory` is
process-wide, so it is measured by two more processes (GRPOKIT_KEEP_MEMORY=1 and 0, alternated).
The training passes' C attention and fused SiLU x up / RMSNorm kernels, and torch.compile of the same
two ops, were measured by this script on 2026-12-02 before their removal:
benchmarks/results/fast_gains_with_training_kernels*.json (docs/performance.md).
The table holds each variant's median s/step and its ratio to `all`: 1.20 means the step is 20% slower
without that speed-up, which pays 1.20x. Configs:

    demo        `grpokit train`'s built-in demo (0.8M-parameter char model, B=16 x G=8, fp32)
    tiny/small  `grpokit bench --size S --completion-length 64 --fixed-length --precision fp32`
                (small's default precision, auto, is bf16 on this CPU, where no C kernel applies)
    smollm2     `grpokit bench --model smollm2-135m-instruct --completion-length 64 --fixed-length
                --precision bf16 --micro-batch-size 8` (the real model, bf16 mixed precision)

Results: benchmarks/results/fast_gains.json and a markdown table on stdout (docs/performance.md).
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

VARIANTS = ("all", "plain", "gqa", "small_attention", "master_grads", "decode_kernels", "whole_step",
            "reuse")
CONFIG_NAMES = ("demo", "tiny", "small", "smollm2")
BENCH_ARGS = ["--fixed-length", "--precision", "fp32"]
OUT = Path(__file__).resolve().parent / "results" / "fast_gains.json"


def _nothing(*args, **kwargs):
    return contextlib.nullcontext()


@contextlib.contextmanager
def switched_off(variant: str, state) -> None:
    """For one step: the speed-up `variant` names off (attributes swapped, restored after)."""
    from grpokit import fast, switch

    swaps = {"plain": [(switch, "accelerated", lambda *a, **k: switch.plain())],
             "gqa": [(fast.small_attention, "_grouped_with_mask", lambda *a: False)],
             "small_attention": [(fast.small_attention, "installed", _nothing)],
             "master_grads": [(fast.master_grads, "installed", _nothing)],
             "decode_kernels": [(fast.Scope, "decode_kernels", lambda self, model: None)],
             "whole_step": [(fast.Scope, "whole_step", lambda self, decoder, rows: None)],
             "reuse": [(state.cfg.rollout, "reuse_activations", False)]}.get(variant, [])
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in swaps]
    for obj, name, value in swaps:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def _demo_runner(out_dir: str):
    from grpokit.config.run_config import demo_config
    from grpokit.train.loop import build_state
    from grpokit.train.step import train_step

    state = build_state(demo_config({"run.output_dir": out_dir, "run.progress": False, "run.eval_limit": 0}))
    return state, lambda: train_step(state)


def _bench_runner(config: str):
    """config: "tiny", "small" or "smollm2" (bf16, micro-batches of 8), optionally ":T" for T completion
    tokens (default 64)."""
    from grpokit.cli.bench import bench_state, bench_step, parse_args
    from grpokit.model.testing import bench_prompts

    size, _, tokens = config.partition(":")
    model = ["--model", "smollm2-135m-instruct", "--fixed-length", "--precision", "bf16",
             "--micro-batch-size", "8"] if size == "smollm2" else ["--size", size, *BENCH_ARGS]
    args = parse_args([*model, "--completion-length", tokens or "64"])
    state, _ = bench_state(args)
    prompts = bench_prompts(args.prompts)
    return state, lambda: bench_step(state, prompts, args)


def child(config: str, variants: list[str], steps: int) -> None:
    """Print {variant: [s per step]} with the variants interleaved step by step; first steps apart."""
    with tempfile.TemporaryDirectory() as out:
        state, step = _demo_runner(out) if config == "demo" else _bench_runner(config)
        times: dict[str, list[float]] = {v: [] for v in variants}
        first: dict[str, float] = {}
        for r in range(steps + 1):                                        # round 0: each variant's warm-up
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order if r % 2 else order[::-1]:
                with switched_off(v, state):
                    t0 = time.perf_counter()
                    step()
                    sec = time.perf_counter() - t0
                if r:
                    times[v].append(sec)
                else:
                    first[v] = sec
    print(json.dumps({"times": times, "first": first}))


def run_child(config: str, variants: list[str], steps: int, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", config, ",".join(variants), str(steps)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{config} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(config: str, variants: list[str], steps: int, keep_rounds: int) -> dict:
    """The variants interleaved in one process, then keep_memory on/off in alternated processes."""
    res = run_child(config, variants, steps)
    base = statistics.median(res["times"]["all"])
    table = {v: {"s_per_step": statistics.median(t), "gain": statistics.median(t) / base,
                 "first_step_extra_s": res["first"][v] - statistics.median(t)}
             for v, t in res["times"].items()}
    if not keep_rounds:
        return table
    keep: dict[str, list[float]] = {"1": [], "0": []}
    for r in range(keep_rounds):
        for flag in ("1", "0") if r % 2 == 0 else ("0", "1"):
            keep[flag] += run_child(config, ["all"], steps, {"GRPOKIT_KEEP_MEMORY": flag})["times"]["all"]
    on, off = statistics.median(keep["1"]), statistics.median(keep["0"])
    table["keep_memory"] = {"s_per_step": off, "gain": off / on, "first_step_extra_s": 0.0,
                            "kept_s_per_step": on}
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="demo,tiny,small",
                   help="comma-separated: demo, tiny, small, smollm2; tiny:256 = 256 completion tokens")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, `all` first")
    p.add_argument("--steps", type=int, default=12, help="timed steps per variant")
    p.add_argument("--keep-rounds", type=int, default=2, help="process pairs for keep_memory (0: none)")
    p.add_argument("--out", default=str(OUT), help="where the JSON results go")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        config, variants, steps = args.child
        child(config, variants.split(","), int(steps))
        return
    configs, variants = args.configs.split(","), args.variants.split(",")
    bad = [c for c in configs if c.partition(":")[0] not in CONFIG_NAMES
           or (c.partition(":")[2] and not c.partition(":")[2].isdigit())]
    if bad:
        p.error(f"--configs takes {', '.join(CONFIG_NAMES)} (tiny:256 for 256 tokens), got {', '.join(bad)}")
    if set(variants) - set(VARIANTS) or variants[0] != "all":
        p.error(f"--variants takes {', '.join(VARIANTS)}, with `all` first, got {args.variants}")
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    table = {}
    for config in configs:
        table[config] = measure(config, variants, args.steps, args.keep_rounds)
        print(f"{config}: " + ", ".join(f"{v} {r['gain']:.2f}x" for v, r in table[config].items()),
              file=sys.stderr, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "threads": os.environ.get("OMP_NUM_THREADS", "default"),
                               "results": table}, indent=2) + "\n")
    print("| speed-up off | " + " | ".join(f"{c}: s/step (x of all on), first-step extra s"
                                         for c in table) + " |")
    print("|---|" + "---|" * len(table))
    for v in dict.fromkeys(v for c in table for v in table[c]):
        print(f"| {v} | " + " | ".join(f"{table[c][v]['s_per_step']:.3f} ({table[c][v]['gain']:.2f}x), "
                                       f"{table[c][v]['first_step_extra_s']:+.1f}" if v in table[c] else "-"
                                       for c in table) + " |")


if __name__ == "__main__":
    main()
