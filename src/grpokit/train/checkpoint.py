"""Checkpoints: atomic save and verified resume (the output-directory guard is `grpokit.train.run_dir`).

Layout of run.output_dir (see docs/reliability.md):

    checkpoint-<step>/
        model.safetensors      policy weights (tied weights stored once)
        ref_model.safetensors  frozen reference pi_ref (only when loss.beta > 0)
        trainer_state.pt       optimizer, LR scheduler, RNG states (python, numpy, torch CPU, CUDA),
                               step, data cursor, bad_steps, metrics.jsonl offset (bytes, rows)
        config.json            the resolved config that produced it
        reward_model.safetensors, reward_loop.pt
                               run.iterations > 0 only: the learned RM, its optimizer, generator,
                               iteration counter, replay pool (grpokit.train.iterative)
        async_rollouts.pt      rollout.async only: the batches sampled ahead, the worker's RNG
                               (grpokit.train.async_rollouts)
        generation.pt          rollout.steps_per_generation > 1, saved between two slices only: the
                               generation batch the next steps train on (grpokit.train.generations)
        manifest.json          size and sha256 of every file above; written last
    latest                     name of the newest complete checkpoint; rewritten last

A checkpoint is written into `.tmp-checkpoint-<step>/`, fsynced, then renamed: a kill at any moment
leaves the previous checkpoints whole. Resume takes the newest checkpoint whose manifest matches
its files; a truncated or altered one is moved aside to `checkpoint-<step>.corrupt` with a warning
and the one before it is used.

Verifying and resuming live in `grpokit.train.resume`; cutting metrics.jsonl and eval.jsonl back to the
resumed step in `grpokit.train.resume_logs`.

Test-only hook: GRPOKIT_TEST_PAUSE_IN_SAVE=SECONDS[@STEP] sleeps inside save_checkpoint (after the
files are written, before the rename), so a test can kill the process in the middle of a save.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpokit.train.generations import save_generation
from grpokit.train.resume_logs import METRICS_FILE
from grpokit.train.run_dir import OutputDirError, fsync_path, list_checkpoints

log = logging.getLogger("grpokit")

MANIFEST = "manifest.json"
STATE_FILE = "trainer_state.pt"
PAUSE_ENV = "GRPOKIT_TEST_PAUSE_IN_SAVE"

class CheckpointError(OutputDirError):
    """A checkpoint cannot be written or resumed from: the message says what to change."""


def rng_state() -> dict[str, Any]:
    """Every RNG the loop draws from, as plain lists and tensors (loadable with weights_only=True)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {"python": [version, list(internal), gauss],
                             "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states from `rng_state` (CUDA only when a device is present)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _tensor_bytes(tensors) -> int:
    """Bytes of distinct tensors (tied weights once); a sharded DTensor counts its whole size."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        key = id(t) if hasattr(t, "to_local") else t.data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def _needed_bytes(state) -> int:
    """About what one checkpoint takes on disk: policy, reference and optimizer tensors."""
    opt = [v for s in state.optimizer.state.values() for v in s.values()]
    ref = list(state.ref_model.state_dict().values()) if state.ref_model is not None else []
    return _tensor_bytes(state.model.state_dict().values()) + _tensor_bytes(ref) + _tensor_bytes(opt)


def _test_pause(step: int) -> None:
    """Test-only: sleep inside the save when GRPOKIT_TEST_PAUSE_IN_SAVE=SECONDS[@STEP] says so."""
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    seconds, _, at = spec.partition("@")
    if not at or int(at) == step:
        time.sleep(float(seconds))


def _write_files(state, tmp: Path, out: Path, metrics_row: dict[str, Any] | None, *,
                 sharded: bool = False) -> None:
    """Every file of the checkpoint, then the manifest of their sizes and sha256 (last).

    sharded (FSDP): the weights and the optimizer are already in tmp/sharded (each rank wrote its own
    shards, `grpokit.train.fsdp_checkpoint`); the rest is written here, by rank 0, the same way."""
    from safetensors.torch import save_model

    if not sharded:
        save_model(state.model, str(tmp / "model.safetensors"))
        if state.ref_model is not None:
            save_model(state.ref_model, str(tmp / "ref_model.safetensors"))
    metrics = out / METRICS_FILE
    size = metrics.stat().st_size if metrics.exists() else 0
    rows = metrics.read_bytes().count(b"\n") if size else 0
    torch.save({"optimizer": None if sharded else state.optimizer.state_dict(),
                "scheduler": state.scheduler.state_dict(),
                # rank_rng: every rank's (its environments' too), when distributed
                "rng": rng_state(), "rank_rng": getattr(state, "rank_rng", None),
                "world_size": state.dist.world_size if getattr(state, "dist", None) is not None else 1,
                "step": state.step, "cursor": state.stream.cursor,
                "bad_steps": state.bad_steps, "skipped_updates": getattr(state, "skipped_updates", 0),
                "input_tokens_seen": getattr(state, "input_tokens_seen", 0),
                "entropy_control": [getattr(state, "entropy_coef", None),
                                    getattr(state, "last_entropy", None)],
                "metrics_offset": {"bytes": size, "rows": rows},
                "metrics_row": None if metrics_row is None else json.dumps(metrics_row, default=float),
                # environments' random states (rollout.environment; grpokit.agents.environments)
                "env_rng": state.agent.rng_state() if getattr(state, "agent", None) is not None else None},
               tmp / STATE_FILE)
    (tmp / "config.json").write_text(json.dumps(state.cfg.to_dict(), indent=2))
    if getattr(state, "reward_loop", None) is not None:  # Algorithm 1: the RM, its optimizer, the replay pool
        state.reward_loop.save(tmp)
    if getattr(state, "async_rollouts", None) is not None:  # rollout.async: the batches sampled ahead
        state.async_rollouts.save(tmp)
    if getattr(state, "generation", None) is not None:  # rollout.steps_per_generation: its slices left
        save_generation(state.generation, tmp)
    paths = sorted(p for p in tmp.rglob("*") if p.is_file())
    files = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in paths}
    (tmp / MANIFEST).write_text(json.dumps({"format": 1, "step": state.step, "files": files}, indent=2))
    for p in [*paths, tmp / MANIFEST, *sorted(p for p in tmp.rglob("*") if p.is_dir()), tmp]:
        fsync_path(p)


def point_latest(out: Path, name: str) -> None:
    """Atomically rewrite `latest` to name (write aside, fsync, rename, fsync the folder)."""
    pointer = out / "latest.tmp"
    pointer.write_text(name)
    fsync_path(pointer)
    os.replace(pointer, out / "latest")
    fsync_path(out)


def swap_in(tmp: Path, final: Path) -> None:
    """Put the finished folder tmp at final: an existing final is renamed aside first, then deleted.

    Two renames, then the delete: a kill at any moment leaves the old or the new folder whole under
    final's name (none only between the two renames), never a half-written or half-deleted one; the
    hidden leftovers (`.old-<name>`, `.tmp-<name>`) are removed at the next start (`prepare_output_dir`).
    """
    parent, old = final.parent, final.parent / f".old-{final.name}"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_path(parent)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def written_aside(final: Path) -> Iterator[Path]:
    """A fresh hidden folder `.tmp-<name>` beside final to write into; once the block ends it replaces
    final (`swap_in`). An error or an interrupt removes it; a kill leaves it for the next start to remove."""
    tmp = final.parent / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except (Exception, KeyboardInterrupt):   # an error, or SIGINT / SIGTERM (grpokit.train.interrupt)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, final)


def retire(folder: Path) -> None:
    """Delete folder by renaming it to `.old-<name>` first (a kill mid-delete leaves no half folder)."""
    aside = folder.parent / f".old-{folder.name}"
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)


def save_checkpoint(state, out_dir: str | Path, metrics_row: dict[str, Any] | None = None) -> Path:
    """Write checkpoint-<step> atomically, point `latest` at it, keep the newest run.save_total_limit.

    metrics_row: this step's metrics.jsonl row when the loop writes it after the save; the checkpoint
    keeps a copy, so a kill between the save and the write still leaves the step logged once.

    Order: files into .tmp-checkpoint-<step>/ (manifest last) -> fsync -> rename -> fsync the folder
    -> rewrite `latest` -> delete the oldest. A kill or an error at any point leaves the previous
    checkpoints complete. FSDP runs take the same steps (`grpokit.train.fsdp_checkpoint.save_sharded`):
    `start_save`, each rank's shards, then `finish_save` on rank 0.

    Raises:
        CheckpointError: not enough disk space, no write permission, or any other write failure
            (one line; the partial folder is removed and the previous checkpoint is intact).
    """
    tmp = start_save(state, out_dir)
    return finish_save(state, out_dir, tmp, metrics_row)


def _paths(state, out_dir: str | Path) -> tuple[Path, Path, Path, str]:
    """(output folder, checkpoint-<step>, its .tmp- folder, what is left intact when a save fails)."""
    out = Path(out_dir)
    previous = list_checkpoints(out)
    keep_note = (f"the previous checkpoint {previous[-1]} is intact" if previous
                 else "no checkpoint was written")
    return out, out / f"checkpoint-{state.step}", out / f".tmp-checkpoint-{state.step}", keep_note


def start_save(state, out_dir: str | Path) -> Path:
    """Check the free space and make the empty .tmp-checkpoint-<step> folder; its path.

    Raises:
        CheckpointError: not enough disk space for one more checkpoint, or the folder cannot be made.
    """
    out, final, tmp, keep_note = _paths(state, out_dir)
    need, free = _needed_bytes(state), shutil.disk_usage(out).free
    if free < need:
        raise CheckpointError(f"cannot save {final.name}: it needs about {need / 2**20:.1f} MiB but only "
                              f"{free / 2**20:.1f} MiB is free on '{out}': free disk space; {keep_note}")
    with _one_line_errors(final, out, tmp, keep_note):
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    return tmp


def finish_save(state, out_dir: str | Path, tmp: Path, metrics_row: dict[str, Any] | None = None, *,
                sharded: bool = False) -> Path:
    """The rest of the files, the manifest, the rename to checkpoint-<step>, `latest`, the pruning."""
    out, final, _, keep_note = _paths(state, out_dir)
    with _one_line_errors(final, out, tmp, keep_note):
        _write_files(state, tmp, out, metrics_row, sharded=sharded)
        _test_pause(state.step)
        swap_in(tmp, final)  # the same step saved again after a fallback replaces the old folder
        point_latest(out, final.name)
    limit = state.cfg.run.save_total_limit
    if limit:
        for old_ckpt in [p for p in list_checkpoints(out) if p != final][:-limit + 1 or None]:
            retire(old_ckpt)  # never a half-deleted checkpoint-<step> that a resume would have to skip
    return final


@contextlib.contextmanager
def _one_line_errors(final: Path, out: Path, tmp: Path, keep_note: str) -> Iterator[None]:
    try:
        yield
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        cause = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        raise CheckpointError(f"cannot save {final.name} in '{out}' ({cause}): free disk space or fix "
                              f"write permission; {keep_note}") from None
