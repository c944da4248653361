"""`grpokit eval [config.yaml] [key=value ...] [--model PATH] [--limit N] [--samples n --k 1,4]`.

    grpokit eval                                   # the shipped demo checkpoint on 500 held-out problems
    grpokit eval --model runs/demo/final --limit 100 --samples 8 --k 1,4,8
    grpokit eval configs/smollm2_arith_cpu.yaml --limit 50 --out report.json
    grpokit eval --limit 200 --search majority --budget 8      # search at inference (docs/search.md)
    grpokit eval --limit 200 --search beam --budget 4 --prm runs/prm

The metrics are `grpokit.train.evaluate.evaluate`'s, the same function the training loop calls; with
--search, `grpokit.search.run.search_evaluate`'s (accuracy, generated tokens per problem, wall seconds).
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
from grpokit.rewards.rm_text import separator_flag
from grpokit.search.common import SearchError
from grpokit.search.run import SearchSpec, search_evaluate
from grpokit.tasks import load_examples
from grpokit.train.evaluate import check_prompt_lengths, evaluate
from grpokit.train.preflight import check_environment

TRUNCATE_KEYS = ("rollout.truncate_prompt", "truncate_prompt")  # set explicitly: no --allow-truncation needed
SEARCH_FLAGS = ("--budget", "--rm", "--prm", "--prm-agg", "--expand", "--step-separator")

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
    _search_flags(p)
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
    if args.search is not None:
        return _run_search(args, cfg, out)
    given = [f for f in SEARCH_FLAGS if getattr(args, f.lstrip("-").replace("-", "_")) is not None]
    if given:
        raise SearchError(f"{given[0]} belongs to a search: add --search METHOD (docs/search.md)")
    try:
        ks = [int(k) for k in args.k.split(",") if k]
    except ValueError:
        print(f"error: --k must be comma-separated integers, got {args.k!r}", file=sys.stderr)
        return 2
    if args.samples and any(not 1 <= k <= args.samples for k in ks):
        print(f"error: every --k must be between 1 and --samples ({args.samples}), got {args.k}",
              file=sys.stderr)
        return 2
    model, tokenizer, examples, split, limit = _load(args, cfg)
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


def _search_flags(p: argparse.ArgumentParser) -> None:
    """--search and its budget and scorer flags (checked by grpokit.search.run.SearchSpec.check)."""
    g = p.add_argument_group("search at inference (docs/search.md)")
    g.add_argument("--search", default=None, help="greedy | majority | best-of-n | beam | mcts: one answer "
                   "per problem, with accuracy and generated tokens per problem in the report")
    g.add_argument("--budget", type=int, default=None,
                   help="samples per problem (majority, best-of-n), beam width (beam) or simulations "
                   "(mcts); greedy: none")
    g.add_argument("--rm", default=None,
                   help="best-of-n, mcts: an outcome reward-model folder (grpokit rm train)")
    g.add_argument("--prm", default=None,
                   help="best-of-n, beam, mcts: a process reward-model folder, or 'steps' (the step "
                   "verifier)")
    g.add_argument("--prm-agg", default=None, help="a process scorer's step scores -> one: min (default) "
                   "or last")
    g.add_argument("--expand", type=int, default=None, help="beam: sampled continuations per beam per "
                   "step; mcts: children per node (default 2)")
    g.add_argument("--step-separator", default=None, type=separator_flag, help="beam, mcts, --prm: the text "
                   "that ends a step, backslash escapes read ('\\n': a newline; default: the PRM folder's, "
                   "else rm.step_separator)")


def _load(args, cfg: GRPOConfig):
    """The policy, its tokenizer, the split's examples, the split's name and the problem limit."""
    split = args.split or cfg.task.eval_split
    limit = args.limit if args.limit is not None else (cfg.run.eval_limit or -1)
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    return model, tokenizer, load_examples(cfg.task, split), split, limit


def _run_search(args, cfg: GRPOConfig, out) -> int:
    """`grpokit eval --search METHOD`: checks first, then the search; prints accuracy and tokens/problem."""
    spec = SearchSpec(args.search, args.budget, args.rm, args.prm, args.prm_agg, args.expand,
                      args.step_separator).check()   # a bad flag fails before the model loads
    if args.samples:
        raise SearchError("--samples (pass@k) and --search are separate reports: drop one of them")
    if agent_from_config(cfg) is not None:
        raise SearchError("--search decodes single-turn completions: drop rollout.tools / environment")
    model, tokenizer, examples, split, limit = _load(args, cfg)
    examples = list(examples if limit <= 0 else examples[:limit])
    check_prompt_lengths(tokenizer, examples, cfg)
    result = search_evaluate(model, tokenizer, examples, cfg, spec, seed=args.seed,
                             progress=cfg.run.progress)
    report = {"model": cfg.model.name_or_path, "task": cfg.task.name, "split": split, **result}
    write_text_aside(out, json.dumps(report, indent=2) + "\n")
    print(f"search              {result['search']} (budget {result['budget']})")
    print(f"num_problems        {int(result['num_problems'])}")
    print(f"accuracy            {result['accuracy']:.4f}")
    print(f"tokens_per_problem  {result['tokens_per_problem']:.1f}")
    print(f"seconds             {result['seconds']:.1f}")
    print(f"report: {args.out}")
    return 0
