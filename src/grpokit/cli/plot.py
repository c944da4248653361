"""`grpokit plot RUN_DIR [RUN_DIR ...] [--out DIR] [--smooth W]`: the figures of `grpokit.observe.plots`."""

from __future__ import annotations

import argparse
import sys

from grpokit.observe.plots import DEFAULT_SMOOTH, plot_run


def main(argv: list[str]) -> int:
    """`grpokit plot RUN_DIR [RUN_DIR ...] [--out DIR] [--smooth W]`."""
    p = argparse.ArgumentParser(prog="grpokit plot",
                                description="PNG figures from one or more runs' metrics.jsonl.")
    p.add_argument("runs", nargs="+", help="run folders (run.output_dir); several are overlaid")
    p.add_argument("--out", default=None,
                   help="output folder (default: RUN/plots, or ./plots-compare for several)")
    p.add_argument("--smooth", type=float, default=DEFAULT_SMOOTH, help="EMA weight in [0, 1); 0 = raw")
    args = p.parse_args(argv)
    try:
        paths = plot_run(args.runs, args.out, args.smooth)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths)} figures to {paths[0].parent}: {', '.join(x.name for x in paths)}")
    return 0
