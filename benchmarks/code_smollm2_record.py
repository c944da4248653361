"""Keep the SmolLM2 code hour and its HumanEval evaluations as raw rows (docs/code.md's code-smollm2 block).

    OMP_NUM_THREADS=1 grpokit train configs/smollm2_code_cpu.yaml run.output_dir=runs/smollm2_code_hour \
        run.progress=false --overwrite
    OMP_NUM_THREADS=1 grpokit eval configs/smollm2_code_cpu.yaml task.name=humaneval task.train_split=test \
        task.eval_split=test rollout.max_completion_length=384 rollout.max_prompt_length=768 --limit 164 \
        --samples 8 --k 1,8 [--model runs/smollm2_code_hour/final] --out he_{before,after}.json
    python benchmarks/code_smollm2_record.py --run runs/smollm2_code_hour --before he_before.json \
        --after he_after.json --threads 1 --note "..."

Writes benchmarks/results/code_smollm2_hour_{eval,metrics,run}.jsonl (the run's own eval.jsonl and
metrics.jsonl, and how it was made) and code_smollm2_humaneval.jsonl (one row per side), replacing them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_record import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TRAIN = ("OMP_NUM_THREADS={threads} grpokit train configs/smollm2_code_cpu.yaml run.output_dir={run} "
         "run.progress=false --overwrite")
EVAL = ("OMP_NUM_THREADS={threads} grpokit eval configs/smollm2_code_cpu.yaml{model} task.name=humaneval "
        "task.train_split=test task.eval_split=test rollout.max_completion_length=384 "
        "rollout.max_prompt_length=768 --limit 164 --samples 8 --k 1,8")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="the GRPO hour's output_dir")
    p.add_argument("--before", required=True, help="grpokit eval's JSON report of the base model")
    p.add_argument("--after", required=True, help="grpokit eval's JSON report of RUN/final")
    p.add_argument("--threads", default="1")
    p.add_argument("--note", default="")
    args = p.parse_args()
    run = Path(args.run)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    how = {"commit": commit, "machine": machine(), "threads": args.threads,
           "date": datetime.date.today().isoformat()}
    for name in ("eval", "metrics"):
        (RESULTS / f"code_smollm2_hour_{name}.jsonl").write_text((run / f"{name}.jsonl").read_text())
    row = {"bench": "code_smollm2_hour", "command": TRAIN.format(threads=args.threads, run=run), **how,
           "seed": json.loads((run / "config.json").read_text())["run"]["seed"], "note": args.note}
    (RESULTS / "code_smollm2_hour_run.jsonl").write_text(json.dumps(row) + "\n")
    rows = []
    for side, report, model in (("before", args.before, ""), ("after", args.after, f" --model {run}/final")):
        got = json.loads(Path(report).read_text())
        rows.append({"bench": "code_humaneval", "side": side, **got, **how,
                     "command": EVAL.format(threads=args.threads, model=model),
                     "note": "greedy (accuracy) and 8 samples at temperature 1.0 (pass@1, pass@8); the "
                             "program from the completion's fenced block or the prompt continued"})
    (RESULTS / "code_smollm2_humaneval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote code_smollm2_hour_*.jsonl and code_smollm2_humaneval.jsonl (commit {commit})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
