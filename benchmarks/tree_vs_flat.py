"""Tree or MCTS GRPO against flat GRPO: held-out accuracy against generated tokens and training seconds.

    python benchmarks/tree_vs_flat.py --seeds 0 1 2 --arms flat tree-2x4-at6 --steps 200 --eval-steps 25 \
        --out benchmarks/results/tree_demo.jsonl                               # the built-in demo
    python benchmarks/tree_vs_flat.py --config CONFIG ... --out benchmarks/results/tree_chain.jsonl

An arm is `flat` (rollout.num_generations samples per prompt), `tree-AxBxC-atX-Y`: rollout.tree.widths
[A, B, C] and rollout.tree.branch_at [X, Y] (grpokit.rollout.tree), or `mcts[-wW][-bN][-steps]`: MCTS
rollouts (grpokit.train.mcts_rollouts) over steps ending at ". " (the demo's), progressive widening W
(default 2), a budget of N tokens per group (default none), valued by the step verifier instead of the
run's reward (`--arms flat mcts --out benchmarks/results/mcts_demo.jsonl`). Each run is one `grpokit
train` process on one thread pinned to one of --cores (one run per core at a time: with two cores two
runs go at once); the arms' order alternates per seed (the machine drifts). Per run, the curve: at each
evaluation (every --eval-steps, greedy on --eval-limit held-out problems), [step, generated tokens so
far, training seconds so far, accuracy]. Generated tokens are what the sampler decoded (tree:
`tree/decoded_tokens`, each shared prefix once; mcts: `mcts/decoded_tokens`, every expansion and
rollout; flat: `completion_tokens`); training seconds the sum of `time/step` (evaluations off the clock).

The summary, per arm against flat (means over seeds): the final accuracy, the generated tokens and
training seconds of the whole run, and flat's accuracy at the arm's tokens and at its seconds (flat's
curves interpolated linearly between evaluations: accuracy at equal tokens and at equal wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_record import append_rows, run_meta  # noqa: E402  (scripts/bench_record.py)
from pages.search import curve_at as interpolate  # noqa: E402  (scripts/pages/search.py)

ARM = re.compile(r"^tree-(\d+(?:x\d+)*)-at(\d+(?:-\d+)*)$")
MCTS_ARM = re.compile(r"^mcts(?:-w(\d+))?(?:-b(\d+))?(-steps)?$")


def arm_overrides(arm: str) -> list[str]:
    """`flat` -> []; `tree-2x4-at6` -> rollout.tree.widths=[2,4] rollout.tree.branch_at=[6]; `mcts-w3-b150`
    -> rollout.mcts.enabled=true, separator ". ", width 3, max_tokens 150."""
    if arm == "flat":
        return []
    if (mc := MCTS_ARM.match(arm)) is not None:
        width, budget, steps = mc.groups()
        return ["rollout.mcts.enabled=true", 'rollout.mcts.separator=". "',
                *([f"rollout.mcts.width={width}"] if width else []),
                *([f"rollout.mcts.max_tokens={budget}"] if budget else []),
                *(["rollout.mcts.value=steps"] if steps else [])]
    m = ARM.match(arm)
    if m is None:
        raise SystemExit(f"arm {arm!r}: use flat, tree-AxB-atX (widths A, B; branch at token X) or "
                         f"mcts[-wW][-bN][-steps]")
    widths, at = m.group(1).split("x"), m.group(2).split("-")
    return [f"rollout.tree.widths=[{','.join(widths)}]", f"rollout.tree.branch_at=[{','.join(at)}]"]


def run_one(config: str | None, arm: str, seed: int, steps: int, eval_steps: int, eval_limit: int,
            extra: list[str], out: Path, core: int) -> dict:
    """One pinned `grpokit train` run on one thread; its curve and totals."""
    argv = [sys.executable, "-m", "grpokit", "train", *([config] if config else []), f"run.seed={seed}",
            f"run.max_steps={steps}", f"run.eval_steps={eval_steps}", f"run.eval_limit={eval_limit}",
            "run.save_steps=0", "run.max_minutes=0", "run.progress=false", f"run.output_dir={out}",
            *arm_overrides(arm), *extra, "--overwrite"]
    pin = ["taskset", "-c", str(core)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.time()
    proc = subprocess.run(pin + argv, capture_output=True, text=True, env=env)
    wall = time.time() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines() if line.strip()]
    tokens, seconds, at = 0.0, 0.0, {0: (0.0, 0.0)}
    for r in rows:
        tokens += r.get("mcts/decoded_tokens", r.get("tree/decoded_tokens", r["completion_tokens"]))
        seconds += r["time/step"]
        at[r["step"]] = (tokens, seconds)
    curve = [[e["step"], *at[e["step"]], e["accuracy"]] for e in evals if "accuracy" in e]
    return {"arm": arm, "seed": seed, "steps": steps, "core": core, "curve": curve, "tokens": tokens,
            "train_s": seconds, "s_per_step": seconds / max(len(rows), 1), "final_accuracy": curve[-1][3],
            "completion_tokens": sum(r["completion_tokens"] for r in rows), "wall_s": wall,
            "run_command": " ".join(argv[2:])}


def summary(rows: list[dict]) -> dict:
    """Per arm: means over seeds; per tree arm: flat's accuracy at the tree's tokens and seconds."""
    by = {a: [r for r in rows if r["arm"] == a] for a in dict.fromkeys(r["arm"] for r in rows)}
    out: dict = {"summary": True}
    for arm, runs in by.items():
        out[arm] = {"final_accuracy": [r["final_accuracy"] for r in runs],
                    "mean_final_accuracy": statistics.mean(r["final_accuracy"] for r in runs),
                    "tokens": statistics.mean(r["tokens"] for r in runs),
                    "train_s": statistics.mean(r["train_s"] for r in runs),
                    "s_per_step": statistics.mean(r["s_per_step"] for r in runs),
                    "seeds": [r["seed"] for r in runs]}
    if "flat" not in by:
        return out
    flat = out["flat"]
    for arm in by:
        if arm == "flat":
            continue
        fig = out[arm]
        fig["tokens_vs_flat"] = fig["tokens"] / flat["tokens"]
        fig["train_s_vs_flat"] = fig["train_s"] / flat["train_s"]
        for axis, key in ((1, "tokens"), (2, "train_s")):
            accs = [interpolate(r["curve"], axis, fig[key]) for r in by["flat"]]
            fig[f"flat_accuracy_at_equal_{key}"] = (statistics.mean(accs) if all(a is not None for a in accs)
                                                    else None)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="a YAML config (default: the built-in demo)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=["flat", "tree-2x4-at6"])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-steps", type=int, default=25)
    p.add_argument("--eval-limit", type=int, default=500)
    p.add_argument("--cores", type=int, nargs="+", default=[0, 1],
                   help="the cores runs are pinned to, one run per core at a time")
    p.add_argument("--keep", help="a folder to keep each run's output in (ARM-SEED/: its final model, ...)")
    p.add_argument("--out", required=True, help="JSONL file the rows are appended to")
    p.add_argument("overrides", nargs="*", help="key=value for every run")
    args = p.parse_args()
    for arm in args.arms:
        arm_overrides(arm)                                   # a bad arm stops here, before any run
    meta = {**run_meta("tree_vs_flat", "benchmarks/tree_vs_flat.py", args.config, args.overrides,
                       sys.argv[1:]), "threads": 1, "parallel": len(args.cores)}
    # arms alternate their order per seed, so each arm's runs start on either core
    jobs = [(arm, seed) for i, seed in enumerate(args.seeds)
            for arm in (args.arms[::-1] if i % 2 else args.arms)]
    free: queue.Queue[int] = queue.Queue()
    for core in args.cores:
        free.put(core)
    with tempfile.TemporaryDirectory(prefix="grpokit-tree-bench-") as tmp, \
            ThreadPoolExecutor(len(args.cores)) as pool:
        where = Path(args.keep) if args.keep else Path(tmp)

        def go(job):
            arm, seed = job
            core = free.get()                                   # a core no other run holds
            try:
                row = {**meta, **run_one(args.config, arm, seed, args.steps, args.eval_steps,
                                         args.eval_limit, args.overrides, where / f"{arm}-{seed}", core)}
            finally:
                free.put(core)
            print(json.dumps({k: row[k] for k in ("arm", "seed", "core", "tokens", "train_s", "curve")}),
                  flush=True)
            return row
        rows = list(pool.map(go, jobs))
    append_rows(args.out, [*rows, {**meta, **summary(rows)}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
