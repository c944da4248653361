"""Keep what `grpokit bench` printed as raw rows under benchmarks/results/, with how it was measured.

    grpokit bench ... --compare-trl > out.jsonl
    python scripts/bench_record.py out.jsonl benchmarks/results/NAME.jsonl --command "grpokit bench ..." \
        [--commit HASH] [--append]

Each printed row becomes one row with `command`, `commit`, `machine` (CPU model and cores), `date`;
the comparison line is kept under the key `compare`, with the micro-batch size of the grpokit side, so
scripts/update_readme.py can find it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
from pathlib import Path


def machine() -> str:
    cpu = "unknown CPU"
    info = Path("/proc/cpuinfo")
    if info.is_file():
        cpu = next((line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                    if line.startswith("model name")), cpu)
    return f"{cpu}, {os.cpu_count()} cores"


def run_meta(bench: str, script: str, config: str | None, overrides: list[str], argv: list[str]) -> dict:
    """What every row of a benchmark run records: the bench, config, overrides, commit, machine, date and
    the command as typed."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    return {"bench": bench, "config": config or "built-in demo", "overrides": overrides,
            "commit": commit.strip(), "machine": machine(), "date": datetime.date.today().isoformat(),
            "command": f"python {script} " + " ".join(argv)}


def append_rows(out: str | Path, rows: list[dict]) -> None:
    """Print the last row (the summary) and append every row to the JSONL file `out`."""
    print(json.dumps(rows[-1], indent=1))
    with open(out, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def records(lines: list[str], meta: dict) -> list[dict]:
    rows = [json.loads(line) for line in lines if line.strip().startswith("{")]
    out = []
    for row in rows:
        if "ratio_trl_over_grpokit_s_per_step" in row:
            out.append({**meta, "compare": row, "micro_batch_size": row.get("micro_batch_grpokit")})
        else:
            out.append({**meta, **row})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source")
    p.add_argument("target")
    p.add_argument("--command", required=True, help="the command that printed the rows")
    p.add_argument("--commit", help="the code's commit (default: HEAD)")
    p.add_argument("--append", action="store_true")
    args = p.parse_args()
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True, check=True).stdout.strip()
    meta = {"command": args.command, "commit": commit, "machine": machine(),
            "date": datetime.date.today().isoformat()}
    rows = records(Path(args.source).read_text().splitlines(), meta)
    with open(args.target, "a" if args.append else "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{len(rows)} rows -> {args.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
