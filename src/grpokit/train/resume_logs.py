"""Resume: bring run.output_dir's logs back to the step of the checkpoint being resumed.

metrics.jsonl is cut back to its length when the checkpoint was written (keeping, or restoring from
the checkpoint's copy, the row of the checkpoint's own step); eval.jsonl loses its rows after that
step (iterations.jsonl too). Each step thus stays logged exactly once however a run was killed. Called by
`grpokit.train.resume.resume_if_requested`; see docs/reliability.md.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("grpokit")

METRICS_FILE = "metrics.jsonl"


def cut_logs(out_dir: Path, step: int, offset: int, pending_row: str | None) -> None:
    """metrics.jsonl back to its state at checkpoint `step`; eval.jsonl rows after `step` dropped.

    metrics.jsonl is cut at `offset` (its length when the checkpoint was written); when the loop
    writes the step's row after the save, that row is kept if it reached the file, else the
    checkpoint's copy (`pending_row`) is appended: every step stays logged exactly once.
    """
    metrics = out_dir / METRICS_FILE
    data = metrics.read_bytes() if metrics.exists() else b""
    if len(data) < offset:
        log.warning("%s is shorter than when checkpoint-%d was saved: earlier rows are missing", metrics,
                    step)
        offset = len(data)
    keep, tail = data[:offset], b""
    if pending_row is not None:
        line, newline, _ = data[offset:].partition(b"\n")
        tail = line + newline if newline and _row_step(line.decode("utf-8", "replace")) == step \
            else pending_row.encode("utf-8") + b"\n"
    if keep + tail != data:
        tmp = metrics.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(keep + tail)
            os.fsync(f.fileno())
        os.replace(tmp, metrics)
    for name in ("eval.jsonl", "iterations.jsonl"):  # per-evaluation and per-iteration rows, tagged by step
        rows = out_dir / name
        if not rows.exists():
            continue
        lines = rows.read_text(encoding="utf-8").splitlines()
        kept = [ln for ln in lines if _row_step(ln) <= step]
        if len(kept) != len(lines):
            tmp = rows.with_suffix(".tmp")
            tmp.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
            os.replace(tmp, rows)


def _row_step(line: str) -> float:
    try:
        return float(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return float("inf")  # a line cut by a kill: drop it
