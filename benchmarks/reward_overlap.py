"""The step time spent waiting for rewards, with and without reward.overlap (the rewards scored on a thread
while the step's reference / pi_old passes run: grpokit.train.collect.Scoring, docs/code.md "Overlap").

    taskset -c 1 python benchmarks/reward_overlap.py --steps 12 --repeats 2 \
        --out benchmarks/results/reward_overlap.jsonl                     # configs/code_demo.yaml
    taskset -c 1 python benchmarks/reward_overlap.py --config configs/code_demo.yaml --steps 3 --repeats 1 \
        model.name_or_path=builtin:arith-demo reward.sandbox=process --out /tmp/overlap_smoke.jsonl

Each run is one `grpokit train` process on the same config, seed and steps (no evaluation, no checkpoint);
the sides alternate, off / on / off / on (--repeats pairs), so a drift of the machine falls on both. Per run,
over its steps after the first (the first loads the sandbox, compiles, warms caches): the mean step
seconds (time/step), the scoring's own seconds (time/reward: its wall time, on the thread when overlapped),
the seconds the step waited for it (time/reward_wait: without overlap all of time/reward) and the share of
the step spent waiting (reward_wait / step). The summary row: each side's means over its runs, and the
ratios on / off. The two sides train the same numbers (tests/train/test_reward_overlap.py), so the
comparison is at equal work. Key=value arguments after the options are config overrides for both sides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_record import append_rows, run_meta  # noqa: E402  (scripts/bench_record.py)

SIDES = {"off": "reward.overlap=false", "on": "reward.overlap=true"}
FIGURES = ("step_s", "reward_s", "reward_wait_s", "wait_share")


def run_one(config: str, side: str, seed: int, steps: int, extra: list[str], out: Path) -> dict:
    """One `grpokit train` run on one side; its figures."""
    argv = [sys.executable, "-m", "grpokit", "train", config, f"run.seed={seed}", f"run.max_steps={steps}",
            "run.eval_limit=0", "run.save_steps=0", "run.max_minutes=0", "run.progress=false",
            f"run.output_dir={out}", *extra, SIDES[side], "--overwrite"]
    start = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    scored = [r for r in rows if "time/reward" in r]             # generation reuse: the sampling steps only
    steady = [r for r in scored if r["step"] > 1] or scored
    step_s = statistics.mean(r["time/step"] for r in steady)
    wait_s = statistics.mean(r["time/reward_wait"] for r in steady)
    return {"side": side, "seed": seed, "steps": steps, "steps_measured": len(steady), "step_s": step_s,
            "reward_s": statistics.mean(r["time/reward"] for r in steady), "reward_wait_s": wait_s,
            "wait_share": wait_s / step_s, "ref_forward_s": statistics.mean(r.get("time/ref_forward", 0.0)
                                                                            for r in steady),
            "reward_mean": [r["reward_mean"] for r in rows], "loss": [r.get("loss") for r in rows],
            "wall_s": time.time() - start, "run_command": " ".join(argv[2:])}


def summary(runs: list[dict]) -> dict:
    """Each side's means over its runs, and on / off."""
    out: dict = {"summary": True}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        out[side] = {k: statistics.mean(r[k] for r in mine) for k in FIGURES}
    out["ratio_on_over_off"] = {k: out["on"][k] / out["off"][k] if out["off"][k] else None for k in FIGURES}
    out["same_numbers"] = len({json.dumps([r["reward_mean"], r["loss"]]) for r in runs}) == 1
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/code_demo.yaml")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=2, help="off / on pairs, alternating")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSONL file the raw rows are appended to")
    args, extra = p.parse_known_args()
    bad = [a for a in extra if "=" not in a or a.startswith("-")]
    if bad:
        p.error(f"unknown arguments {bad}: config overrides are key=value")
    meta = run_meta("reward_overlap", "benchmarks/reward_overlap.py", args.config, extra, sys.argv[1:])
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for side in SIDES:
                run = run_one(args.config, side, args.seed, args.steps, extra, Path(tmp) / f"{side}{i}")
                print(f"{side:>3} run {i}: step {run['step_s']:.3f} s, reward {run['reward_s']:.3f} s, "
                      f"waited {run['reward_wait_s']:.3f} s ({100 * run['wait_share']:.1f}% of the step)",
                      flush=True)
                runs.append({**meta, **run})
    total = summary(runs)
    for side in SIDES:
        s = total[side]
        print(f"{side:>3}: step {s['step_s']:.3f} s, reward {s['reward_s']:.3f} s, waited "
              f"{s['reward_wait_s']:.3f} s, {100 * s['wait_share']:.1f}% of the step waiting")
    ratio = total["ratio_on_over_off"]
    print(f"on / off: step x{ratio['step_s']:.3f}, waited x{ratio['reward_wait_s'] or 0:.3f}; "
          f"same numbers both sides: {total['same_numbers']}")
    append_rows(args.out, [*runs, {**meta, **total}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
