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
        manifest.json          size and sha256 of every file above; written last
    latest                     name of the newest complete checkpoint; rewritten last

A checkpoint is written into `.tmp-checkpoint-<step>/`, fsynced, then renamed: a kill at any moment
leaves the previous checkpoints whole. Resume takes the newest checkpoint whose manifest matches
its files; a truncated or altered one is moved aside to `checkpoint-<step>.corrupt` with a warning
and the one before it is used.

Cutting metrics.jsonl and eval.jsonl back to the resumed step lives in `grpokit.train.resume_logs`.

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

from grpokit.train.resume_logs import METRICS_FILE, _cut_logs
from grpokit.train.run_dir import OutputDirError, list_checkpoints

log = logging.getLogger("grpokit")

MANIFEST = "manifest.json"
STATE_FILE = "trainer_state.pt"
PAUSE_ENV = "GRPOKIT_TEST_PAUSE_IN_SAVE"

# Config keys that may change between a checkpoint and its resume: they change what is logged,
# saved or evaluated, where things run, or how a batch is split in memory, not which samples are
# drawn or how the policy is updated. Every other key must match the checkpoint's config.
HARMLESS_KEYS = frozenset({
    "run.max_steps", "run.logging_steps", "run.eval_steps", "run.eval_limit", "run.save_steps",
    "run.save_total_limit", "run.resume", "run.overwrite", "run.report_to", "run.log_completions_steps",
    "run.track_prompts", "run.max_bad_steps", "run.progress", "run.output_dir", "task.eval_split",
    "model.device", "model.gradient_checkpointing", "optim.micro_batch_size", "rollout.generation_batch_size",
    "rollout.reuse_activations",
})


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    """fsync a file, or a folder's entry table (so a rename inside it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
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


def _write_files(state, tmp: Path, out: Path, metrics_row: dict[str, Any] | None) -> None:
    """Every file of the checkpoint, then the manifest of their sizes and sha256 (last)."""
    from safetensors.torch import save_model

    save_model(state.model, str(tmp / "model.safetensors"))
    if state.ref_model is not None:
        save_model(state.ref_model, str(tmp / "ref_model.safetensors"))
    metrics = out / METRICS_FILE
    size = metrics.stat().st_size if metrics.exists() else 0
    rows = metrics.read_bytes().count(b"\n") if size else 0
    torch.save({"optimizer": state.optimizer.state_dict(), "scheduler": state.scheduler.state_dict(),
                # rank_rng: every rank's, when distributed
                "rng": rng_state(), "rank_rng": getattr(state, "rank_rng", None),
                "step": state.step, "cursor": state.stream.cursor,
                "bad_steps": state.bad_steps, "skipped_updates": getattr(state, "skipped_updates", 0),
                "metrics_offset": {"bytes": size, "rows": rows},
                "metrics_row": None if metrics_row is None else json.dumps(metrics_row, default=float),
                # environments' random states (rollout.environment; grpokit.agents.environments)
                "env_rng": state.agent.rng_state() if getattr(state, "agent", None) is not None else None},
               tmp / STATE_FILE)
    (tmp / "config.json").write_text(json.dumps(state.cfg.to_dict(), indent=2))
    if getattr(state, "reward_loop", None) is not None:  # Algorithm 1: the RM, its optimizer, the replay pool
        state.reward_loop.save(tmp)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir())}
    (tmp / MANIFEST).write_text(json.dumps({"format": 1, "step": state.step, "files": files}, indent=2))
    for p in tmp.iterdir():
        _fsync(p)
    _fsync(tmp)


def point_latest(out: Path, name: str) -> None:
    """Atomically rewrite `latest` to name (write aside, fsync, rename, fsync the folder)."""
    pointer = out / "latest.tmp"
    pointer.write_text(name)
    _fsync(pointer)
    os.replace(pointer, out / "latest")
    _fsync(out)


def swap_in(tmp: Path, final: Path) -> None:
    """Put the finished folder tmp at final: an existing final is renamed aside first, then deleted.

    Each step is a rename, so a kill at any moment leaves either the old or the new folder under
    final's name (or none, never a half-written or half-deleted one); the hidden leftovers
    (`.old-<name>`, `.tmp-<name>`) are removed at the next start (`prepare_output_dir`).
    """
    parent = final.parent
    if final.exists():
        old = parent / f".old-{final.name}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, final)
    _fsync(parent)


@contextlib.contextmanager
def written_aside(final: Path) -> Iterator[Path]:
    """A fresh hidden folder `.tmp-<name>` beside final to write into; once the block ends it replaces
    final (`swap_in`). An error removes it; a kill leaves it for the next start to remove."""
    tmp = final.parent / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except Exception:
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
    checkpoints complete.

    Raises:
        CheckpointError: not enough disk space, no write permission, or any other write failure
            (one line; the partial folder is removed and the previous checkpoint is intact).
    """
    out = Path(out_dir)
    final, tmp = out / f"checkpoint-{state.step}", out / f".tmp-checkpoint-{state.step}"
    previous = list_checkpoints(out)
    keep_note = (f"the previous checkpoint {previous[-1]} is intact" if previous
                 else "no checkpoint was written")
    need, free = _needed_bytes(state), shutil.disk_usage(out).free
    if free < need:
        raise CheckpointError(f"cannot save {final.name}: it needs about {need / 2**20:.1f} MiB but only "
                              f"{free / 2**20:.1f} MiB is free on '{out}': free disk space; {keep_note}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _write_files(state, tmp, out, metrics_row)
        _test_pause(state.step)
        swap_in(tmp, final)  # the same step saved again after a fallback replaces the old folder
        point_latest(out, final.name)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        cause = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        raise CheckpointError(f"cannot save {final.name} in '{out}' ({cause}): free disk space or fix "
                              f"write permission; {keep_note}") from None
    limit = state.cfg.run.save_total_limit
    if limit:
        for old_ckpt in [p for p in list_checkpoints(out) if p != final][:-limit + 1 or None]:
            retire(old_ckpt)  # never a half-deleted checkpoint-<step> that a resume would have to skip
    return final


def verify_checkpoint(folder: Path) -> str | None:
    """None when every file matches the manifest, else what is wrong (one phrase)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return "no manifest.json"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return "manifest.json is unreadable"
    for name in ("model.safetensors", STATE_FILE, "config.json"):
        if name not in files:
            return f"the manifest lists no {name}"
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['bytes']} (truncated?)"
        if _sha256(path) != want["sha256"]:
            return f"{name} does not match its sha256 in the manifest (altered?)"
    return None


def newest_complete_checkpoint(out_dir: str | Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that verifies, and a note per newer one that did not.

    Each failed checkpoint is renamed to checkpoint-<step>.corrupt (kept for inspection, never
    resumed from or pruned) and a warning is logged.
    """
    problems = []
    for folder in reversed(list_checkpoints(out_dir)):
        problem = verify_checkpoint(folder)
        if problem is None:
            return folder, problems
        problems.append(f"{folder.name}: {problem}")
        aside = folder.with_name(folder.name + ".corrupt")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(folder, aside)
        log.warning("checkpoint %s is damaged (%s): moved it to %s and falling back to the one before it",
                    folder, problem, aside.name)
    return None, problems


def _flat(tree: dict[str, Any]) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, sec in tree.items() if isinstance(sec, dict) for k, v in sec.items()}


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(differences that matter, harmless differences) as 'key old -> new' strings.

    Keys present in only one of the two configs (added or removed by a grpokit upgrade) are not
    compared; `preset` is not compared either, since the keys it sets are.
    """
    old, new = _flat(saved), _flat(current)
    matter, harmless = [], []
    for key in sorted(old.keys() & new.keys()):
        if old[key] != new[key]:
            (harmless if key in HARMLESS_KEYS else matter).append(f"{key} {old[key]!r} -> {new[key]!r}")
    return matter, harmless


def load_checkpoint(state, folder: Path) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler, RNG, step, data cursor and bad_steps from `folder`.

    Returns:
        The trainer-state record (with "metrics_offset").
    """
    from safetensors.torch import load_model

    load_model(state.model, str(folder / "model.safetensors"))
    if state.ref_model is not None:
        if not (folder / "ref_model.safetensors").exists():
            raise CheckpointError(f"{folder} has no ref_model.safetensors but loss.beta > 0: "
                                  "resume with the checkpoint's loss.beta")
        load_model(state.ref_model, str(folder / "ref_model.safetensors"))
    blob = torch.load(folder / STATE_FILE, weights_only=True, map_location="cpu")
    state.optimizer.load_state_dict(blob["optimizer"])
    state.scheduler.load_state_dict(blob["scheduler"])
    state.step, state.stream.cursor, state.bad_steps = blob["step"], blob["cursor"], blob["bad_steps"]
    state.skipped_updates = blob.get("skipped_updates", 0)
    ranks, dist = blob.get("rank_rng") or [], getattr(state, "dist", None)  # distributed: each rank its own
    set_rng_state(ranks[dist.rank] if dist is not None and len(ranks) == dist.world_size > 1 else blob["rng"])
    if getattr(state, "reward_loop", None) is not None:
        state.reward_loop.load(folder)
    if getattr(state, "agent", None) is not None:
        state.agent.set_rng_state(blob.get("env_rng"))
    return blob


def resume_if_requested(state, out_dir: str | Path) -> bool:
    """Continue from the newest complete checkpoint when run.resume is true or "auto".

    run.resume=true requires a checkpoint; "auto" starts fresh when there is none (clearing the
    logs of an attempt killed before its first checkpoint). The checkpoint's config must match the
    current one except for HARMLESS_KEYS.

    Returns:
        True when a checkpoint was loaded.

    Raises:
        CheckpointError: no complete checkpoint (run.resume=true), or a config change that matters.
    """
    mode, out = state.cfg.run.resume, Path(out_dir)
    if not mode:
        return False
    folder, problems = newest_complete_checkpoint(out)
    if folder is None:
        damaged = f" (damaged: {'; '.join(problems)})" if problems else ""
        if mode != "auto":
            raise CheckpointError(f"--resume: '{out}' holds no complete checkpoint{damaged}: "
                                  "set run.resume=auto to start fresh when there is none, or use --overwrite")
        log.info("run.resume=auto: no complete checkpoint in %s%s; starting from step 0", out, damaged)
        for name in (METRICS_FILE, "eval.jsonl", "iterations.jsonl"):
            (out / name).unlink(missing_ok=True)
        return False
    saved = json.loads((folder / "config.json").read_text())
    matter, harmless = config_differences(saved, state.cfg.to_dict())
    if matter:
        raise CheckpointError(f"cannot resume from {folder}: the config differs where it matters: "
                              f"{', '.join(matter)}: restore these values, or start a new run with "
                              "--overwrite or another run.output_dir")
    if harmless:
        log.info("resuming with changed settings: %s", ", ".join(harmless))
    blob = load_checkpoint(state, folder)
    latest = out / "latest"
    if not latest.is_file() or latest.read_text() != folder.name:  # a kill between rename and pointer
        point_latest(out, folder.name)
    _cut_logs(out, state.step, blob["metrics_offset"]["bytes"], blob.get("metrics_row"))
    log.info("resumed from %s (step %d)", folder, state.step)
    if state.step >= state.cfg.run.max_steps:
        log.warning("the checkpoint is at step %d and run.max_steps is %d: nothing left to train; "
                    "raise run.max_steps to continue", state.step, state.cfg.run.max_steps)
    return True
