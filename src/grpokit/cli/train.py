"""`grpokit train [config.yaml] [key=value ...]`: resolve the config, print it, run GRPO, then the demo's
before/after table and plot."""

from __future__ import annotations

import argparse
import logging

from grpokit.config.run_config import describe, train_config
from grpokit.config.validation import objective_warnings
from grpokit.observe.demo import before_after_table, demo_plot
from grpokit.train.loop import train_grpo


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grpokit train", description="Run GRPO (no config: the built-in demo).")
    p.add_argument("items", nargs="*", help="an optional YAML config, then key=value overrides")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    p.add_argument("--overwrite", action="store_true", help="replace a previous run in output_dir")
    args = p.parse_intermixed_args(argv)
    path = args.items[0] if args.items and "=" not in args.items[0] else None
    overrides = args.items[1:] if path else args.items
    cfg = train_config(path, overrides, resume=args.resume, overwrite=args.overwrite)
    print(describe(cfg), flush=True)
    for warning in objective_warnings(cfg):   # valid, but probably not what was meant
        logging.getLogger("grpokit").warning(warning)
    state = train_grpo(cfg)
    if not state.dist.is_main:   # under torchrun rank 0 alone reports and draws the plot
        return 0
    print(f"done: {state.step} steps; metrics in {cfg.run.output_dir}/metrics.jsonl, "
          f"model in {cfg.run.output_dir}/final", flush=True)
    try:  # a resumed run may lack the 'before' evaluation: then there is no table to print
        print(before_after_table(cfg.run.output_dir), flush=True)
    except FileNotFoundError:
        pass
    print(f"plot: {demo_plot(cfg.run.output_dir)}", flush=True)
    return 0
