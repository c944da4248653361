"""The output-directory guard: refuse an unusable run.output_dir without touching it, prepare it later.

`check_output_dir` runs before anything is loaded and changes nothing; `prepare_output_dir`, the one
destructive step of a start, runs only once the model, tokenizer, data and reward functions have loaded,
so a run that fails on bad input leaves the previous run byte-identical (tests/test_user_errors.py).

`--overwrite` is a transaction (docs/reliability.md, "Replacing a run"): `prepare_output_dir` moves the
previous run into `<output_dir>/.previous-run/` (renames only; the free space for the new run's first save
is checked first), `commit_replacement` deletes it once the new run has a complete checkpoint (or its
final model, when it saves no checkpoint), and `roll_back_replacement` puts it back when the new run
fails before that. Each phase is a sequence of renames whose half-done states `finish_replacement`
completes at the next start, so a kill at any moment loses neither run's files:

    .replacing/   the old run being moved aside (killed mid-move): moved back
    .previous-run/  the old run, the new one not yet committed: deleted when the new run has `latest` or
                  `final/`, else put back
    .restoring/   the old run being put back (killed mid-restore): moved back
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from grpokit.train.resume_logs import METRICS_FILE

LOCK_FILE = ".grpokit.lock"   # grpokit.train.run_lock: never moved, never deleted by the transaction
PREVIOUS, REPLACING, RESTORING = ".previous-run", ".replacing", ".restoring"
STALE = (".tmp-checkpoint-*", ".old-checkpoint-*", ".tmp-final", ".old-final", ".old-previous-run")


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
    check_output_path(out)
    if _holds_run(out) and not (cfg.run.resume or cfg.run.overwrite):
        raise OutputDirError(f"run.output_dir '{out}' already holds a run: pass --resume to continue it, "
                             "--overwrite to replace it, or choose another run.output_dir")


def check_output_path(out: Path) -> None:
    """The part of `check_output_dir` that reads nothing inside the folder: not a file, writable."""
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"run.output_dir '{out}' is a file: give a folder path")
    parent = out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    problem = (f"'{parent}' is a file" if not parent.is_dir() else
               None if os.access(parent, os.W_OK | os.X_OK) else "permission denied")
    if problem:
        raise OutputDirError(f"cannot write to run.output_dir '{out}' ({problem}): "
                             "fix its permissions or choose another run.output_dir")


def prepare_output_dir(cfg, need_bytes: int = 0) -> bool:
    """Create run.output_dir after `check_output_dir`; with run.overwrite (and no run.resume), move the
    previous run aside (`.previous-run/`, pending until `commit_replacement` or `roll_back_replacement`).

    The only destructive step of a start: the trainer calls it after the model, tokenizer, data and
    reward functions have loaded, under the folder's lock (a replacement left half done by a killed run
    was completed when the lock was taken: `finish_replacement`). Leftovers of a save or delete that was
    killed (`STALE`) are removed.

    Args:
        need_bytes: what the new run writes before the old one may go (its first checkpoint, or its
            final model): an --overwrite is refused unless that much space is free.

    Returns:
        True when a previous run was moved aside.
    """
    out = Path(cfg.run.output_dir)
    try:
        check_output_dir(cfg)
        replacing = _holds_run(out) and cfg.run.overwrite and not cfg.run.resume
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".grpokit-write-test"
        probe.write_text("ok")
        probe.unlink()
        if replacing:
            _check_room(out, need_bytes)
            try:
                _move_items(out, out / REPLACING, keep={LOCK_FILE, REPLACING})
            except OSError:
                _move_items(out / REPLACING, out, keep=set())
                raise
            os.replace(out / REPLACING, out / PREVIOUS)
            fsync_path(out)
        for stale in [p for pattern in STALE for p in out.glob(pattern)]:
            shutil.rmtree(stale, ignore_errors=True)
    except OSError as e:
        raise OutputDirError(f"cannot write to run.output_dir '{out}' ({e.strerror or e}): "
                             "fix its permissions or choose another run.output_dir") from None
    return replacing


def _check_room(out: Path, need_bytes: int) -> None:
    free = shutil.disk_usage(out).free
    if free < need_bytes:
        raise OutputDirError(f"--overwrite keeps the previous run in '{out}' until the new run has its first "
                             f"checkpoint, which needs about {need_bytes / 2**20:.1f} MiB, but only "
                             f"{free / 2**20:.1f} MiB is free: free disk space, or delete the previous run "
                             "yourself")


def replacement_done(out: Path) -> bool:
    """The new run reached the point where the previous one may go: a complete checkpoint (`latest` is
    written last) or the final model."""
    return (out / "latest").is_file() or (out / "final").is_dir()


def commit_replacement(out: Path) -> None:
    """Delete the previous run kept by `prepare_output_dir` (renamed to a leftover name first, so a kill
    mid-delete leaves nothing that looks like a pending replacement)."""
    if (out / PREVIOUS).exists():
        os.replace(out / PREVIOUS, out / ".old-previous-run")
        fsync_path(out)
        shutil.rmtree(out / ".old-previous-run", ignore_errors=True)


def roll_back_replacement(out: Path) -> bool:
    """Put the previous run back: the new run's files are deleted, then the old ones renamed back.

    Returns:
        True when a previous run was restored.
    """
    if (out / PREVIOUS).exists():
        for item in out.iterdir():
            if item.name not in (LOCK_FILE, PREVIOUS):
                shutil.rmtree(item) if item.is_dir() and not item.is_symlink() else item.unlink()
        os.replace(out / PREVIOUS, out / RESTORING)   # from here on, every item in `out` is the old run's
    restored = (out / RESTORING).exists()
    _move_items(out / RESTORING, out, keep=set())
    return restored


def finish_replacement(out: Path) -> None:
    """Complete a replacement that a killed run left half done (see the module docstring)."""
    if (out / REPLACING).exists():
        _move_items(out / REPLACING, out, keep=set())
    if (out / PREVIOUS).exists() and replacement_done(out):
        commit_replacement(out)
    roll_back_replacement(out)


def _move_items(src: Path, dst: Path, keep: set[str]) -> None:
    """Rename every item of src (except `keep`) into dst; a hidden src inside dst is removed once empty."""
    if not src.is_dir():
        return
    dst.mkdir(exist_ok=True)
    for item in list(src.iterdir()):
        if item.name not in keep:
            os.replace(item, dst / item.name)
    if src.parent == dst:
        src.rmdir()
    fsync_path(dst)


def fsync_path(path: Path) -> None:
    """fsync a file, or a folder's entry table (so a rename inside it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
