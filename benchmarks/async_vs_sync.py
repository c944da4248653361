"""Asynchronous against synchronous GRPO on this machine: s/step, phase times, held-out accuracy per step and
per training second, and the bound overlap can reach when the worker and the trainer share the cores.

    python benchmarks/async_vs_sync.py --seeds 0 1 2 --modes sync sync1 k1 --steps 120 --eval-steps 20 \
        --out benchmarks/results/async_demo.jsonl                              # the built-in demo
    python benchmarks/async_vs_sync.py --config configs/smollm2_arith_cpu.yaml --seeds 0 \
        --modes sync k1 --steps 12 --eval-steps 0 rollout.max_completion_length=128 \
        --out benchmarks/results/async_smollm2.jsonl
    taskset -c 1 python benchmarks/async_vs_sync.py --config configs/smollm2_arith_cpu.yaml --threads 1 \
        --seeds 0 --modes sync k1 --steps 12 --eval-steps 0 rollout.backend=vllm rollout.vllm_mode=server \
        rollout.vllm_server_base_url=http://127.0.0.1:8011 --out benchmarks/results/async_vllm_server.jsonl
        # with `taskset -c 0 grpokit vllm-serve --model FOLDER --port 8011 --threads 1` running (its venv)

Each run is a `grpokit train` process (torch's default threads: both cores for the synchronous run; with
rollout.async the worker takes one core and the trainer the other, rollout.async.worker_threads=1). The
sides alternate per seed (this machine drifts). Per run: the mean s/step over steps that do not follow an
evaluation or start the run (after an evaluation the worker has had the evaluation's time to sample
ahead), the generation time (sync: time/generate; async: the worker's async/worker_generate_s), the rest
of the step (sync: the step minus generation; async: the step minus the wait for the batch), and the
accuracy curve on a grid of every --eval-steps steps, its time axis the steps times the run's s/step.

The bound: with both sharing 2 cores, an async step takes at least max(G1, R1), the worker's generation
on its core and the trainer's rest on the other, so the speed-up is at most (G2 + R2) / max(G1, R1)
against a synchronous step of G2 + R2 on both cores. With a worker on hardware of its own (a vLLM server
on another GPU or machine) as fast as the trainer's, the model is (G2 + R2) / max(G2, R2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_record import append_rows, run_meta  # noqa: E402  (scripts/bench_record.py)

# mode -> overrides; sync1 is the synchronous run on one thread (OMP_NUM_THREADS=1), sync on torch's default
MODES = {"sync": [], "sync1": [], "k1": ["rollout.async.max_staleness=1"],
         "k2": ["rollout.async.max_staleness=2"], "k4": ["rollout.async.max_staleness=4"]}
SYNC = ("sync", "sync1")


def run_one(config: str | None, mode: str, seed: int, steps: int, eval_steps: int, eval_limit: int,
            extra: list[str], out: Path, threads: int = 0) -> dict:
    """One `grpokit train` run; its figures."""
    argv = [sys.executable, "-m", "grpokit", "train", *([config] if config else []), f"run.seed={seed}",
            f"run.max_steps={steps}", f"run.eval_steps={eval_steps}", f"run.eval_limit={eval_limit}",
            "run.save_steps=0", "run.max_minutes=0", "run.progress=false", f"run.output_dir={out}",
            "rollout.async.worker_threads=1", *MODES[mode], *extra, "--overwrite"]
    start = time.time()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if mode == "sync1" or threads:
        env["OMP_NUM_THREADS"] = str(threads or 1)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.time() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines() if line.strip()] \
        if (out / "eval.jsonl").exists() else []
    after_eval = {e["step"] + 1 for e in evals}
    steady = [r for r in rows if r["step"] > 1 and r["step"] not in after_eval] or rows
    step_s = statistics.mean(r["time/step"] for r in steady)
    if mode in SYNC:
        gen = statistics.mean(r["time/generate"] for r in steady)
        rest, wait = step_s - gen, 0.0
    else:
        gen = statistics.mean(r["async/worker_generate_s"] for r in steady)
        wait = statistics.mean(r["async/wait_s"] for r in steady)
        rest = step_s - wait
    curve = [[e["step"], round(e["step"] * step_s, 2), e["accuracy"]] for e in evals if "accuracy" in e]
    return {"mode": mode, "seed": seed, "steps": steps, "s_per_step": step_s, "generate_s": gen,
            "rest_s": rest, "wait_s": wait, "curve": curve,
            "completion_len": statistics.mean(r.get("completion_length_mean", 0.0) for r in steady),
            "lag_mean": statistics.mean(r.get("async/policy_lag", 0.0) for r in rows),
            "tis_mean_weight": statistics.mean([r["tis/mean_weight"] for r in rows if "tis/mean_weight" in r]
                                               or [1.0]),
            "wall_s": wall, "run_command": " ".join(argv[2:])}


def time_to(curve: list[list[float]], target: float) -> float | None:
    """Seconds to `target` accuracy, linear between the grid's two evaluations around the crossing."""
    prev = None
    for _, sec, acc in curve:
        if acc >= target:
            if prev is None or prev[1] >= target:
                return sec
            (s0, a0), (s1, a1) = prev, (sec, acc)
            return s0 + (target - a0) * (s1 - s0) / (a1 - a0)
        prev = (sec, acc)
    return None


def summary(rows: list[dict], target: float | None) -> dict:
    """Per mode: median s/step, time to target accuracy; async modes against the faster synchronous
    mode: the speed-up and its bound; the own-hardware model from that synchronous run's phases."""
    by = {m: [r for r in rows if r["mode"] == m] for m in dict.fromkeys(r["mode"] for r in rows)}
    out: dict = {"summary": True, "target": target}
    for mode, runs in by.items():
        fig = out.setdefault(mode, {})
        fig.update(s_per_step=statistics.median(r["s_per_step"] for r in runs),
                   generate_s=statistics.median(r["generate_s"] for r in runs),
                   rest_s=statistics.median(r["rest_s"] for r in runs))
        if target is not None:
            fig["time_to_target_s"] = [time_to(r["curve"], target) for r in runs]
            fig["final_accuracy"] = [r["curve"][-1][2] if r["curve"] else None for r in runs]
    syncs = [m for m in SYNC if m in by]
    if not syncs:
        return out
    base = min(syncs, key=lambda m: out[m]["s_per_step"])
    g2, r2 = out[base]["generate_s"], out[base]["rest_s"]
    out["baseline"] = base
    out[base]["own_hardware_model_speedup"] = (g2 + r2) / max(g2, r2)
    for mode in by:
        if mode not in SYNC:
            fig = out[mode]
            fig.update(speedup=out[base]["s_per_step"] / fig["s_per_step"],
                       bound_speedup=out[base]["s_per_step"] / max(fig["generate_s"], fig["rest_s"]))
    return out


def reused(out: Path, modes: list[str]) -> list[dict]:
    """The runs of `modes` in the last benchmark recorded in `out`, as measured (their own commit and date),
    each marked with where it came from."""
    if not modes:
        return []
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    last = max(i for i, r in enumerate(rows) if r.get("summary"))
    first = max((i + 1 for i, r in enumerate(rows[:last]) if r.get("summary")), default=0)
    runs = [{**r, "reused_from": f"{out.name}, the benchmark of {r['date']} at {r['commit']}"}
            for r in rows[first:last] if r["mode"] in modes]
    if {r["mode"] for r in runs} != set(modes):
        raise SystemExit(f"--reuse {' '.join(modes)}: the last benchmark in {out} has "
                         f"{sorted({r['mode'] for r in rows[first:last]})}")
    return runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="a YAML config (default: the built-in demo)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--modes", nargs="+", default=["sync", "k1"], choices=list(MODES))
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--eval-steps", type=int, default=20)
    p.add_argument("--eval-limit", type=int, default=200)
    p.add_argument("--target", type=float, help="accuracy for time-to-accuracy (default: none)")
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for every run (0: as the mode "
                   "says); with a vLLM server the worker is the server, so the trainer's threads are these")
    p.add_argument("--out", required=True, help="JSONL file the rows are appended to")
    p.add_argument("--reuse", nargs="+", default=[], metavar="MODE",
                   help="take these modes' runs from the last benchmark recorded in --out instead of running "
                        "them again (copied as measured, marked reused_from); the summary covers both")
    p.add_argument("overrides", nargs="*", help="key=value for every run")
    args = p.parse_args()
    meta = run_meta("async_vs_sync", "benchmarks/async_vs_sync.py", args.config, args.overrides, sys.argv[1:])
    rows = reused(Path(args.out), args.reuse)
    with tempfile.TemporaryDirectory(prefix="grpokit-async-bench-") as tmp:
        for i, seed in enumerate(args.seeds):
            order = args.modes if i % 2 == 0 else list(reversed(args.modes))   # alternate sides
            for mode in order:
                if mode in args.reuse:
                    continue
                row = {**meta, **run_one(args.config, mode, seed, args.steps, args.eval_steps,
                                         args.eval_limit, args.overrides, Path(tmp) / f"{mode}-{seed}",
                                         args.threads)}
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("mode", "seed", "s_per_step", "generate_s", "rest_s",
                                                      "wait_s", "curve")}), flush=True)
    append_rows(args.out, [*rows, {**meta, **summary(rows, args.target)}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
