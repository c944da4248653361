"""docs/real_model.md's thread-count block: the shipped SmolLM2 arithmetic recipe for 60 steps at 1 and 2
threads, three seeds (benchmarks/thread_seeds.py; benchmarks/results/arith_thread_seeds.jsonl)."""

from __future__ import annotations

import statistics

from .raw import rows
from .render import Block, Column, Table

SEEDS = "arith_thread_seeds.jsonl"


def _rows() -> list[dict]:
    found = rows(SEEDS)
    out = []
    for seed in sorted({r["seed"] for r in found}):
        by = {r["threads"]: r for r in found if r["seed"] == seed}
        out.append({"seed": seed, "one": by[1]["after"], "two": by[2]["after"], "before": by[1]["before"],
                    "gap": by[1]["after"] - by[2]["after"],
                    "r1": by[1]["first_rewards"][0], "r2": by[2]["first_rewards"][0]})
    return out


def _figures(table: list[dict]) -> dict:
    found = rows(SEEDS)
    return {"mean_one": statistics.mean(r["one"] for r in table),
            "mean_two": statistics.mean(r["two"] for r in table),
            "min_one": min(r["one"] for r in table), "max_two": max(r["two"] for r in table),
            "commits": ", ".join(sorted({r["commit"] for r in found})), "machine": found[-1]["machine"],
            "dates": ", ".join(sorted({r["date"] for r in found}))}


TABLE = Table(
    rows=_rows,
    columns=(Column("seed", "{seed}"), Column("before", "{before:percent}"),
             Column("1 thread, step 60", "{one:percent}"), Column("2 threads, step 60", "{two:percent}"),
             Column("1 thread minus 2", "{gap:points}"),
             Column("first step's reward, 1 / 2 threads", "{r1:.3f} / {r2:.3f}")),
    note="`python benchmarks/thread_seeds.py` (each run `OMP_NUM_THREADS=T grpokit train "
         "configs/smollm2_arith_cpu.yaml run.seed=S run.max_steps=60 run.max_minutes=0 run.eval_steps=0 "
         "run.save_steps=0`, its own process), commits {commits}; seed 0 at 2 threads at 8f2aa66, the "
         "rest at 6b2eb92: the Rollout-fields change between them keeps the training math; {machine}, "
         "{dates}; greedy held-out accuracy on 200 problems. Mean at step 60: {mean_one:percent} at 1 "
         "thread, {mean_two:percent} at 2 threads; the bands do not overlap (lowest 1-thread seed "
         "{min_one:percent}, highest 2-thread seed {max_two:percent}). Raw rows: "
         "`benchmarks/results/arith_thread_seeds.jsonl`.",
    figures=_figures,
)

BLOCKS = [Block("docs/real_model.md", "thread-seeds", (TABLE,))]
