"""`grpokit eval [config.yaml] [key=value ...] [--model PATH] [--limit N] [--samples n --k 1,4]`.

    grpokit eval                                   # the shipped demo checkpoint on 500 held-out problems
    grpokit eval --model runs/demo/final --limit 100 --samples 8 --k 1,4,8
    grpokit eval configs/smollm2_arith_cpu.yaml --limit 50 --out report.json

The metrics are `grpokit.train.evaluate.evaluate`'s, the same function the training loop calls.
"""

from __future__ import annotations

import argparse
import json
import sys

from grpokit.agents.agent import agent_from_config
from grpokit.config.run_config import train_config
from grpokit.config.schema import GRPOConfig
from grpokit.errors import check_out_file, write_text_aside
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.tasks import load_examples
from grpokit.train.evaluate import evaluate
from grpokit.train.preflight import check_environment

TRUNCATE_KEYS = ("rollout.truncate_prompt", "truncate_prompt")  # set explicitly: no --allow-truncation needed

def eval_config(path: str | None, overrides: list[str]) -> GRPOConfig:
    """The run config to evaluate with: a YAML file, or the demo's embedded config, plus overrides."""
    return train_config(path, overrides, resume=False, overwrite=False)


def main(argv: list[str]) -> int:
    """`grpokit eval [config.yaml] [key=value ...] [--model PATH] [--limit N] [--samples n --k 1,4]`."""
    p = argparse.ArgumentParser(prog="grpokit eval",
                                description="Evaluate a model on the task's held-out split.")
    p.add_argument("items", nargs="*",
                   help="an optional YAML config, then key=value overrides (default: the demo)")
    p.add_argument("--model", help="model folder or alias (default: the config's model.name_or_path)")
    p.add_argument("--split", help="split to evaluate (default: task.eval_split)")
    p.add_argument("--limit", type=int, default=None,
                   help="first N problems (default: run.eval_limit, else all)")
    p.add_argument("--samples", type=int, default=0,
                   help="n sampled completions per problem for pass@k (0: greedy only)")
    p.add_argument("--k", default="1", help="comma-separated k values for pass@k, each <= --samples")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", default="eval_report.json", help="where the JSON report goes")
    p.add_argument("--allow-truncation", action="store_true",
                   help="cut prompts longer than rollout.max_prompt_length (default: refuse, naming the "
                   "longest)")
    args = p.parse_intermixed_args(argv)  # key=value items may come before, between or after the options
    if args.samples < 0:
        p.error(f"--samples must be >= 0 (0: greedy only), got {args.samples}")
    out = check_out_file(args.out, "--out")  # before any work: a report that cannot be written is no report
    path = args.items[0] if args.items and "=" not in args.items[0] else None
    overrides = (args.items[1:] if path else args.items) + ([f"model.name_or_path={args.model}"]
                                                             if args.model else [])
    if not args.allow_truncation and not any(o.split("=")[0].strip() in TRUNCATE_KEYS for o in overrides):
        overrides.append("rollout.truncate_prompt=error")  # cut questions would make another benchmark
    cfg = eval_config(path, overrides)
    check_environment(cfg)
    try:
        ks = [int(k) for k in args.k.split(",") if k]
    except ValueError:
        print(f"error: --k must be comma-separated integers, got {args.k!r}", file=sys.stderr)
        return 2
    if args.samples and any(not 1 <= k <= args.samples for k in ks):
        print(f"error: every --k must be between 1 and --samples ({args.samples}), got {args.k}",
              file=sys.stderr)
        return 2
    split = args.split or cfg.task.eval_split
    limit = args.limit if args.limit is not None else (cfg.run.eval_limit or -1)
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    examples = load_examples(cfg.task, split)
    result = evaluate(model, tokenizer, examples, cfg, limit=limit, num_samples=args.samples,
                      ks=ks if args.samples else (), seed=args.seed, progress=True,
                      agent=agent_from_config(cfg))   # rollout.tools / environment: multi-turn episodes
    report = {"model": cfg.model.name_or_path, "task": cfg.task.name, "split": split, **result}
    write_text_aside(out, json.dumps(report, indent=2) + "\n")
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value:.4f}" if not key.startswith("num_")
              else f"{key:<{width}}  {int(value)}")
    print(f"report: {args.out}")
    return 0
