"""`grpokit report RUN_DIR [--out FILE] [--smooth W]`: the HTML page of `grpokit.observe.report`."""

from __future__ import annotations

import argparse
import sys

from grpokit.observe.plots import DEFAULT_SMOOTH
from grpokit.observe.report import write_report


def main(argv: list[str]) -> int:
    """`grpokit report RUN_DIR [--out FILE] [--smooth W]`."""
    p = argparse.ArgumentParser(prog="grpokit report", description="A self-contained HTML report of one run.")
    p.add_argument("run", help="the run folder (run.output_dir)")
    p.add_argument("--out", default=None, help="output file (default: RUN/report.html)")
    p.add_argument("--smooth", type=float, default=DEFAULT_SMOOTH, help="EMA weight of the curves in [0, 1)")
    args = p.parse_args(argv)
    if not 0 <= args.smooth < 1:
        print(f"error: --smooth must be in [0, 1), got {args.smooth}", file=sys.stderr)
        return 2
    path = write_report(args.run, args.out, args.smooth)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB): open it in a browser (file://{path.resolve()})")
    return 0
