"""The learned-reward-model experiments of docs/reward_models.md, one command from a fresh clone.

    python scripts/rm_experiments.py                 # every stage, in order; finished stages are skipped
    python scripts/rm_experiments.py --only summary  # only print the tables of what has run

Stages (each a plain grpokit command, printed before it runs):
    collect      the demo policy's own completions: 8 per training problem, labeled by the answer checker,
                 steps by the arithmetic verifier                         -> runs/rm/demo_samples.jsonl
    pairwise     stage 1, from the demo checkpoint: Bradley-Terry within each problem -> runs/rm/demo-pairwise
    outcome      stage 2, a fresh pointwise head on that backbone: the outcome RM    -> runs/rm/demo-outcome
    process      stage 2, a fresh token head on the same backbone, step labels       -> runs/rm/demo-process
    supervision  GRPO against each learned RM, the rule step verifier and the answer checker, 3 seeds
                 (configs/sweeps/rm_supervision.yaml)
    iterative    Algorithm 1, continual RM training with 10% replay vs a frozen RM, 2 seeds
                 (configs/sweeps/rm_iterative.yaml)
    summary      markdown tables of the held-out figures, the RMs' AUC and the per-iteration rows
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("runs/rm")
SAMPLES = OUT / "demo_samples.jsonl"
SEP = ". "  # the demo's completions: '37+58=95. \\boxed{95}' -> two steps
GRPOKIT = [sys.executable, "-m", "grpokit"]
TRAIN_RM = ["rm", "train", "--data", str(SAMPLES), "--step-separator", SEP, "--learning-rate", "3e-4"]
PAIRWISE = OUT / "demo-pairwise"  # stage 1: Bradley-Terry within each problem's group learns to check a sum

STAGES: dict[str, tuple[Path, list[str]]] = {
    "collect": (SAMPLES, ["rm", "collect", "configs/demo.yaml", "--out", str(SAMPLES), "--num-prompts",
                          "7600", "--num-generations", "8", "--step-labels", "verifier",
                          f"rm.step_separator={SEP}"]),
    "pairwise": (PAIRWISE / "grpokit_rm.json",
                 TRAIN_RM + ["--init", "builtin:arith-demo", "--kind", "outcome", "--objective", "pairwise",
                             "--epochs", "2", "--batch-size", "32", "--out", str(PAIRWISE)]),
    # stage 2: a fresh head on that backbone, pointwise: the outcome RM (calibrated) and the process RM
    "outcome": (OUT / "demo-outcome" / "grpokit_rm.json",
                TRAIN_RM + ["--init", str(PAIRWISE), "--kind", "outcome", "--objective", "pointwise",
                            "--epochs", "1", "--batch-size", "64", "--out", str(OUT / "demo-outcome")]),
    "process": (OUT / "demo-process" / "grpokit_rm.json",
                TRAIN_RM + ["--init", str(PAIRWISE), "--kind", "process", "--objective", "pointwise",
                            "--epochs", "1", "--batch-size", "32", "--out", str(OUT / "demo-process")]),
    "supervision": (Path("runs/sweeps/rm_supervision/results.json"),
                    ["sweep", "configs/sweeps/rm_supervision.yaml"]),
    "iterative": (Path("runs/sweeps/rm_iterative/results.json"),
                  ["sweep", "configs/sweeps/rm_iterative.yaml"]),
}


def run_stage(name: str) -> None:
    done, args = STAGES[name]
    if done.exists():
        print(f"[{name}] done already ({done})", flush=True)
        return
    print(f"[{name}] grpokit {' '.join(args)}", flush=True)
    start = time.perf_counter()
    subprocess.run(GRPOKIT + args, check=True)
    print(f"[{name}] {time.perf_counter() - start:.0f} s", flush=True)


def _evals(folder: Path) -> dict[str, dict]:
    path = folder / "eval.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {r["tag"]: r for r in rows}


def _pct(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    spread = f" ± {100 * statistics.stdev(values):.1f}" if len(values) > 1 else ""
    return f"{mean:.1f}%{spread}"


def _cells(sweep: str) -> list[dict]:
    path = Path(f"runs/sweeps/{sweep}/results.json")
    return json.loads(path.read_text()) if path.exists() else []


def supervision_table() -> str:
    lines = [("| reward during GRPO | seeds | held-out accuracy before | after (per seed) | change (mean) | "
              "wall time per run |"), "|---|---|---|---|---|---|"]
    by: dict[str, list[dict]] = {}
    for row in _cells("rm_supervision"):
        by.setdefault(row["variant"], []).append(row)
    for variant, rows in by.items():
        ev = [_evals(Path("runs/sweeps/rm_supervision") / r["folder"]) for r in rows]
        before = [e["before"]["accuracy"] for e in ev if "before" in e]
        after = [e["after"]["accuracy"] for e in ev if "after" in e]
        gain = [a - b for a, b in zip(after, before)]
        lines.append(f"| {variant} | {len(rows)} | {_pct(before)} | "
                     f"{' / '.join(f'{100 * a:.1f}' for a in after)} | "
                     f"{100 * statistics.fmean(gain):+.1f} pt | "
                     f"{statistics.fmean(r['wall_s'] for r in rows):.0f} s |")
    return "\n".join(lines)


def iterative_table() -> str:
    lines = [("| RM | seed | iteration | step | RM AUC on the policy's samples | within-group AUC | "
              "verified accuracy (sampled) | held-out greedy accuracy |"),
             "|---|---|---|---|---|---|---|---|"]
    for row in _cells("rm_iterative"):
        folder = Path("runs/sweeps/rm_iterative") / row["folder"]
        evals = {int(r["step"]): r for r in _evals(folder).values()}
        for line in (folder / "iterations.jsonl").read_text().splitlines():
            it = json.loads(line)
            acc = evals.get(int(it["step"]), {}).get("accuracy", float("nan"))
            lines.append(f"| {row['variant']} | {row['seed']} | {int(it['iteration'])} | {int(it['step'])} | "
                         f"{it['rm_auc']:.3f} | {it.get('rm_group_auc', float('nan')):.3f} | "
                         f"{100 * it['verified_accuracy']:.1f}% | {100 * acc:.1f}% |")
    return "\n".join(lines)


def rm_table() -> str:
    lines = ["| RM | held-out AUC | within-group AUC | accuracy | held-out samples |",
             "|---|---|---|---|---|"]
    for name in ("demo-pairwise", "demo-outcome", "demo-process"):
        path = OUT / name / "grpokit_rm.json"
        if path.exists():
            rep = json.loads(path.read_text()).get("report", {}).get("held_out", {})
            lines.append(f"| {name} | {rep.get('auc', float('nan')):.4f} | "
                         f"{rep.get('group_auc', float('nan')):.4f} | "
                         f"{rep.get('accuracy', float('nan')):.4f} | {int(rep.get('num_samples', 0))} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=[*STAGES, "summary"], action="append", help="run only these stages")
    args = p.parse_args()
    for name in args.only or [*STAGES, "summary"]:
        if name != "summary":
            run_stage(name)
    print("\n## Reward models\n" + rm_table())
    print("\n## Supervision\n" + supervision_table())
    print("\n## Iterative\n" + iterative_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
