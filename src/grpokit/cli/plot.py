"""`grpokit plot RUN_DIR [RUN_DIR ...] [--out DIR] [--smooth W] [--target A]`: the figures of
`grpokit.observe.plots`; with --target, one line per run: the training seconds to that held-out accuracy."""

from __future__ import annotations

import argparse
import sys

from grpokit.observe.accuracy_time import summary_lines
from grpokit.observe.plots import DEFAULT_SMOOTH, load_runs, plot_run


def main(argv: list[str]) -> int:
    """`grpokit plot RUN_DIR [RUN_DIR ...] [--out DIR] [--smooth W]`."""
    p = argparse.ArgumentParser(prog="grpokit plot",
                                description="PNG figures from one or more runs' metrics.jsonl.")
    p.add_argument("runs", nargs="+", help="run folders (run.output_dir); several are overlaid")
    p.add_argument("--out", default=None,
                   help="output folder (default: RUN/plots, or ./plots-compare for several)")
    p.add_argument("--smooth", type=float, default=DEFAULT_SMOOTH, help="EMA weight in [0, 1); 0 = raw")
    p.add_argument("--target", type=float, default=None,
                   help="held-out accuracy in (0, 1]: time_to_accuracy.png draws it and each run's "
                   "seconds to reach it are printed (e.g. 0.95)")
    args = p.parse_args(argv)
    if args.target is not None and not 0 < args.target <= 1:
        p.error(f"--target must be an accuracy in (0, 1], e.g. 0.95, got {args.target}")
    try:
        paths = plot_run(args.runs, args.out, args.smooth, args.target)
        lines = summary_lines(load_runs(args.runs), args.target) if args.target is not None else []
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths)} figures to {paths[0].parent}: {', '.join(x.name for x in paths)}")
    for line in lines:
        print(line)
    return 0
