"""The output-directory guard: refuse an unusable run.output_dir without touching it, prepare it later.

`check_output_dir` runs before anything is loaded and changes nothing; `prepare_output_dir`, the one
destructive step of a start (`--overwrite` empties the folder), runs only once the model, tokenizer,
data and reward functions have loaded, so a run that fails on bad input leaves the previous run
byte-identical (tests/test_user_errors.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from grpokit.train.resume_logs import METRICS_FILE


class OutputDirError(ValueError):
    """The output directory cannot be used as asked: the message says what to change."""


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """The checkpoint-<step> folders in out_dir, oldest first (unverified)."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    found = [p for p in out.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def _holds_run(out: Path) -> bool:
    return out.is_dir() and bool(list_checkpoints(out) or (out / METRICS_FILE).exists())


def check_output_dir(cfg) -> None:
    """Refuse a run.output_dir that cannot be used as asked, touching nothing (the trainer calls this
    before loading anything, and `prepare_output_dir` only once the model, data and rewards loaded).

    Raises:
        OutputDirError: a file, a folder holding another run without run.resume / run.overwrite, or a
            path that cannot be created or written.
    """
    out = Path(cfg.run.output_dir)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"run.output_dir '{out}' is a file: give a folder path")
    if _holds_run(out) and not (cfg.run.resume or cfg.run.overwrite):
        raise OutputDirError(f"run.output_dir '{out}' already holds a run: pass --resume to continue it, "
                             "--overwrite to replace it, or choose another run.output_dir")
    parent = out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    problem = (f"'{parent}' is a file" if not parent.is_dir() else
               None if os.access(parent, os.W_OK | os.X_OK) else "permission denied")
    if problem:
        raise OutputDirError(f"cannot write to run.output_dir '{out}' ({problem}): "
                             "fix its permissions or choose another run.output_dir")


def prepare_output_dir(cfg) -> None:
    """Create run.output_dir after `check_output_dir`; with run.overwrite (and no run.resume), empty it.

    The only destructive step of a start: the trainer calls it after the model, tokenizer, data and
    reward functions have loaded, so a run that fails on bad input leaves the previous run as it was.
    Leftovers of a save or delete that was killed (`.tmp-checkpoint-*`, `.old-checkpoint-*`,
    `.tmp-final`, `.old-final`) are removed.
    """
    check_output_dir(cfg)
    out = Path(cfg.run.output_dir)
    busy = _holds_run(out)
    try:
        if busy and cfg.run.overwrite and not cfg.run.resume:
            for item in out.iterdir():
                shutil.rmtree(item) if item.is_dir() else item.unlink()
        out.mkdir(parents=True, exist_ok=True)
        for stale in [p for pattern in (".tmp-checkpoint-*", ".old-checkpoint-*", ".tmp-final", ".old-final")
                      for p in out.glob(pattern)]:
            shutil.rmtree(stale, ignore_errors=True)
        probe = out / ".grpokit-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise OutputDirError(f"cannot write to run.output_dir '{out}' ({e.strerror or e}): "
                             "fix its permissions or choose another run.output_dir") from None
