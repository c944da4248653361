"""`grpokit train [config.yaml] [key=value ...]`: resolve the config, print it, run GRPO, then the demo's
before/after table and plot."""

from __future__ import annotations

import argparse
import logging
import os
import shlex

from grpokit.config.run_config import describe, train_config
from grpokit.config.validation import objective_warnings
from grpokit.observe.demo import before_after_table, demo_plot
from grpokit.train.interrupt import RunInterrupted
from grpokit.train.loop import end_ranks, train_grpo


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
    try:
        state = train_grpo(cfg)
    except RunInterrupted as e:   # its one line ends with the command that resumes (or starts over)
        if e.restart_flag[0]:
            e.restart = f"{e.verb} with: {restart_command(argv, e.restart_flag[0])}"
        if e.ranks_agree:          # under torchrun every rank stopped after the same step
            end_ranks(e.state)
        raise
    end_ranks(state)   # torchrun: the ranks end together, before rank 0's report (which may fail alone)
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


def restart_command(argv: list[str], flag: str) -> str:
    """This command with its --resume / --overwrite / run.resume / run.overwrite replaced by `flag`; under
    torchrun with its launcher in front (one node: the same --nproc_per_node)."""
    keys = ("run.resume=", "resume=", "run.overwrite=", "overwrite=")
    args = [a for a in argv if a not in ("--resume", "--overwrite") and not a.startswith(keys)]
    world, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    launcher = (["torchrun", f"--nproc_per_node={world}", "-m", "grpokit"] if world > 1 and local == world
                else ["torchrun", "<your launcher options>", "-m", "grpokit"] if world > 1 else ["grpokit"])
    return shlex.join([*launcher, "train", *args, flag])
