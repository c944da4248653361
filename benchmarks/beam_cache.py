"""Beam search with the KV cache kept across rounds against the readable path (re-prefill every round).

    python benchmarks/beam_cache.py --config configs/smollm2_gsm8k_cpu.yaml --limit 4 --step-separator '\\n'
    python benchmarks/beam_cache.py                       # the demo (builtin:arith-demo), its step ". "

One process pinned to one core by the caller (`OMP_NUM_THREADS=1 taskset -c CORE`): the config's policy
and its held-out problems (the first --limit), beam search of width --budget with --expand continuations
per beam and the step verifier as scorer (no model to load besides the policy). For each problem both
paths run from the same seed, in alternating order (kept first on even problems); each appends a row to
--raw (default benchmarks/results/beam_cache.jsonl): seconds, generated and prefill tokens, rounds,
correctness, with the command, commit, CPU model and date. The draws differ between the paths (the same
distribution, sampled in another order), so each problem's seconds are read per generated token too.
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

from grpokit import switch  # noqa: E402
from grpokit.cli.eval import eval_config  # noqa: E402
from grpokit.model.loading import load_model_and_tokenizer  # noqa: E402
from grpokit.search import beam as beam_module  # noqa: E402
from grpokit.search.decode import Decoder  # noqa: E402
from grpokit.search.scorers import VerifierSteps, process_scorer  # noqa: E402
from grpokit.tasks import load_examples  # noqa: E402

RAW = ROOT / "benchmarks" / "results" / "beam_cache.jsonl"


def solve(decoder: Decoder, example, budget: int, expand: int, separator: str, keep: bool,
          seed: int) -> dict:
    """One problem by one path: its seconds, tokens, prefill tokens, rounds and correctness."""
    scorer = process_scorer(VerifierSteps(separator), "min")
    beam_module.KEEP_CACHE = keep
    torch.manual_seed(seed)
    start = time.perf_counter()
    [result] = beam_module.beam(decoder, [example], budget, scorer, separator, expand=expand)
    seconds = time.perf_counter() - start
    return {"path": "kept" if keep else "readable", "seconds": round(seconds, 3), "tokens": result.tokens,
            "prefill_tokens": result.extra["prefill_tokens"], "rounds": result.extra["rounds"],
            "correct": result.correct}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="a run config (default: the demo's embedded one)")
    p.add_argument("--limit", type=int, default=4, help="the first N held-out problems")
    p.add_argument("--budget", type=int, default=4, help="beam width")
    p.add_argument("--expand", type=int, default=2, help="continuations per beam per step")
    p.add_argument("--step-separator", default=". ", help="the text that ends a step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--raw", default=str(RAW))
    args = p.parse_args()
    separator = args.step_separator.encode().decode("unicode_escape")
    cfg = eval_config(args.config, ["run.progress=false"])
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    decoder = Decoder(model, tokenizer, cfg)
    examples = list(load_examples(cfg.task, cfg.task.eval_split))[:args.limit]
    if not beam_module.kept(decoder, examples[0].prompt):
        raise SystemExit(f"the lean decoder does not run {cfg.model.name_or_path}: nothing to compare")
    meta = {"model": cfg.model.name_or_path, "task": cfg.task.name, "budget": args.budget,
            "expand": args.expand, "step_separator": separator, "threads": torch.get_num_threads(),
            "command": "python " + shlex.join(["benchmarks/beam_cache.py", *sys.argv[1:]]),
            "commit": commit(), "cpu": cpu_model(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    totals = {"kept": [0.0, 0], "readable": [0.0, 0]}
    with switch.accelerated(model), Path(args.raw).open("a") as raw:
        for i, ex in enumerate(examples):
            for keep in ((True, False) if i % 2 == 0 else (False, True)):
                row = {"problem": i, **solve(decoder, ex, args.budget, args.expand, separator, keep,
                                             args.seed + i), **meta}
                raw.write(json.dumps(row) + "\n")
                raw.flush()
                totals[row["path"]][0] += row["seconds"]
                totals[row["path"]][1] += row["tokens"]
                print(f"problem {i} {row['path']:8s} {row['seconds']:7.1f} s  {row['tokens']:5d} tokens  "
                      f"{row['prefill_tokens']:6d} prefill  {row['rounds']} rounds  correct {row['correct']}")
    (ks, kt), (rs, rt) = totals["kept"], totals["readable"]
    print(f"kept     {ks / len(examples):.1f} s/problem, {1000 * ks / max(kt, 1):.1f} ms/generated token")
    print(f"readable {rs / len(examples):.1f} s/problem, {1000 * rs / max(rt, 1):.1f} ms/generated token")
    print(f"speed-up per generated token {(rs / max(rt, 1)) / (ks / max(kt, 1)):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
