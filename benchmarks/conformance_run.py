"""Run the TRL conformance suite (tests/trl/conformance) and keep what it gave as raw rows.

One pytest process runs every case on grpokit.trl and, with --trl, on TRL 1.16 too
(GRPOKIT_CONFORMANCE_TRL=1). From pytest's JUnit XML it counts, per implementation, the cases passed,
failed and skipped (by the suite's one skip reason each) and sums their test seconds; the process's wall
time is kept beside them. One row per implementation is appended to --record with the command, commit,
CPU model, thread count and date (and one "both" row: the cases with no implementation parameter, which
a mark skips for both); docs/coming_from_trl.md's sentence on the suite is generated from it.

    python benchmarks/conformance_run.py --trl --core 1 --record benchmarks/results/conformance_runs.jsonl
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_demo import commit, cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "trl" / "conformance"))
from conformance_helpers import SKIP  # noqa: E402

IMPLS = ("grpokit", "trl")
GROUPS = IMPLS + ("both",)  # "both": a case with no `impl` (skipped for both by a mark)


def impl_of(name: str) -> str:
    """The implementation a test case ran on, from its parameter id ('test_x[grpokit-qwen2]')."""
    params = re.findall(r"\[(.*)\]", name)
    tokens = params[0].split("-") if params else []
    return next((t for t in tokens if t in IMPLS), "both")


def reason_of(message: str) -> str:
    """The suite's skip key (SKIP's keys) whose text the skip message holds; 'other' when none."""
    return next((key for key, text in SKIP.items() if text in message), "other")


def count(junit: Path) -> dict[str, dict]:
    """Per implementation (and "both"): passed / failed / skipped, skip reasons, the sum of test seconds."""
    out = {impl: {"passed": 0, "failed": 0, "skipped": 0, "skip_reasons": Counter(), "test_seconds": 0.0}
           for impl in GROUPS}
    for case in ET.parse(junit).getroot().iter("testcase"):
        row = out[impl_of(case.get("name", ""))]
        row["test_seconds"] += float(case.get("time", 0.0))
        skipped = case.find("skipped")
        if skipped is not None:
            row["skipped"] += 1
            row["skip_reasons"][reason_of(skipped.get("message", ""))] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            row["failed"] += 1
        else:
            row["passed"] += 1
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trl", action="store_true", help="run every case on TRL 1.16 too")
    p.add_argument("--core", type=int, default=None, help="pin the run to this CPU core (taskset)")
    p.add_argument("--record", default=None, help="append one row per implementation to this JSONL file")
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "GRPOKIT_CONFORMANCE_TRL": "1" if args.trl else "0"}
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "tests/trl/conformance", "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}"]
        if args.core is not None:
            cmd = ["taskset", "-c", str(args.core)] + cmd
        start = time.time()
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        wall = round(time.time() - start, 1)
        counts = count(junit)
    shown = ("GRPOKIT_CONFORMANCE_TRL=1 " if args.trl else "") + "OMP_NUM_THREADS=1 " + " ".join(
        ["python"] + cmd[cmd.index("-m"):-1])
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    meta = {"command": shown, "wall_s": wall, "pytest_rc": rc, "commit": commit(), "cpu": cpu_model(),
            "threads": 1, "core": args.core, "date": date}
    rows = [{"impl": impl, **{k: (dict(v) if isinstance(v, Counter) else v) for k, v in c.items()},
             "test_seconds": round(c["test_seconds"], 1), **meta}
            for impl, c in counts.items() if impl != "trl" or args.trl]
    for row in rows:
        print(json.dumps(row))
    if args.record:
        with open(args.record, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
