"""Resume: the newest checkpoint that verifies, its config compared, its state loaded (one process or ranks).

    choose_checkpoint   rank 0: the newest checkpoint whose manifest matches its files (a damaged newer one
                        is moved aside to checkpoint-<step>.corrupt), its config compared with the run's
    load_checkpoint     every rank: weights, optimizer, scheduler, RNG, counters, Algorithm 1's RM
                        (FSDP: the shards, `grpokit.train.fsdp_checkpoint.load_sharded`, then
                        `load_trainer_state`)
    finish_resume       rank 0: `latest` repaired, metrics.jsonl and eval.jsonl cut back to the step

`resume_if_requested` is the three in one process; `Distributed.resume` runs them over ranks. Every file is
read with `weights_only=True`: a checkpoint cannot run code.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from grpokit.model.devices import model_device
from grpokit.train.checkpoint import (
    MANIFEST,
    STATE_FILE,
    CheckpointError,
    point_latest,
    set_rng_state,
    sha256_file,
)
from grpokit.train.generations import load_generation
from grpokit.train.resume_logs import METRICS_FILE, cut_logs
from grpokit.train.run_dir import list_checkpoints

log = logging.getLogger("grpokit")

# Config keys that may change between a checkpoint and its resume: they change what is logged,
# saved or evaluated, where things run, or how a batch is split in memory, not which samples are
# drawn or how the policy is updated. Every other key must match the checkpoint's config.
HARMLESS_KEYS = frozenset({
    "run.max_steps", "run.logging_steps", "run.eval_steps", "run.eval_limit", "run.save_steps",
    "run.save_total_limit", "run.resume", "run.overwrite", "run.report_to", "run.log_completions_steps",
    "run.track_prompts", "run.max_bad_steps", "run.progress", "run.output_dir", "task.eval_split",
    "model.device", "model.gradient_checkpointing", "optim.micro_batch_size", "rollout.generation_batch_size",
    "rollout.reuse_activations", "run.save_on_interrupt", "rollout.async_worker_threads",
    "rollout.async_max_restarts", "rollout.async_heartbeat_stale_after_s",
})


def verify_checkpoint(folder: Path) -> str | None:
    """None when every file matches the manifest, else what is wrong (one phrase)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return "no manifest.json"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return "manifest.json is unreadable"
    weights = "sharded/.metadata" if "sharded/.metadata" in files else "model.safetensors"   # FSDP: shards
    for name in (weights, STATE_FILE, "config.json"):
        if name not in files:
            return f"the manifest lists no {name}"
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['bytes']} (truncated?)"
        if sha256_file(path) != want["sha256"]:
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
    return load_trainer_state(state, folder)


def load_trainer_state(state, folder: Path, *, optimizer: bool = True) -> dict[str, Any]:
    """trainer_state.pt (weights_only): optimizer (unless sharded), scheduler, this rank's RNG, counters,
    and Algorithm 1's reward model; the record."""
    blob = torch.load(folder / STATE_FILE, weights_only=True, map_location="cpu")
    if optimizer:
        state.optimizer.load_state_dict(blob["optimizer"])
    state.scheduler.load_state_dict(blob["scheduler"])
    state.step, state.stream.cursor, state.bad_steps = blob["step"], blob["cursor"], blob["bad_steps"]
    state.skipped_updates = blob.get("skipped_updates", 0)
    state.input_tokens_seen = blob.get("input_tokens_seen", 0)
    if blob.get("entropy_control") is not None:   # adaptive entropy: the coefficient and its last measurement
        state.entropy_coef, state.last_entropy = blob["entropy_control"]
    ranks, dist = blob.get("rank_rng") or [], getattr(state, "dist", None)  # distributed: each rank its own
    mine = ranks[dist.rank] if dist is not None and len(ranks) == dist.world_size > 1 else None
    set_rng_state(mine if mine is not None else blob["rng"])
    if getattr(state, "reward_loop", None) is not None:
        state.reward_loop.load(folder)
    if getattr(state, "async_rollouts", None) is not None:   # the batches the worker had sampled ahead
        state.async_rollouts.load(folder, state.stream)
    if hasattr(state, "generation"):   # rollout.steps_per_generation: the slices left of the generation
        state.generation = load_generation(folder, model_device(state.model))
    if getattr(state, "agent", None) is not None:   # the environments' random states, this rank's
        state.agent.set_rng_state(mine["env"] if mine is not None and "env" in mine else blob.get("env_rng"))
    return blob


def resume_if_requested(state, out_dir: str | Path) -> bool:
    """Continue from the newest complete checkpoint when run.resume is true or "auto" (one process).

    run.resume=true requires a checkpoint; "auto" starts fresh when there is none (clearing the
    logs of an attempt killed before its first checkpoint). The checkpoint's config must match the
    current one except for HARMLESS_KEYS. Several ranks take the same three steps, the first and last
    on rank 0 alone (`Distributed.resume`).

    Returns:
        True when a checkpoint was loaded.

    Raises:
        CheckpointError: no complete checkpoint (run.resume=true), or a config change that matters.
    """
    folder = choose_checkpoint(state, out_dir)
    if folder is None:
        return False
    finish_resume(state, out_dir, folder, load_checkpoint(state, folder))
    return True


def choose_checkpoint(state, out_dir: str | Path) -> Path | None:
    """The checkpoint to resume from (damaged newer ones moved aside), or None to start at step 0.

    Raises:
        CheckpointError: no complete checkpoint (run.resume=true), or a config change that matters.
    """
    mode, out = state.cfg.run.resume, Path(out_dir)
    if not mode:
        return None
    folder, problems = newest_complete_checkpoint(out)
    if folder is None:
        damaged = f" (damaged: {'; '.join(problems)})" if problems else ""
        if mode != "auto":
            raise CheckpointError(f"--resume: '{out}' holds no complete checkpoint{damaged}: "
                                  "set run.resume=auto to start fresh when there is none, or use --overwrite")
        log.info("run.resume=auto: no complete checkpoint in %s%s; starting from step 0", out, damaged)
        for name in (METRICS_FILE, "eval.jsonl", "iterations.jsonl"):
            (out / name).unlink(missing_ok=True)
        return None
    saved = json.loads((folder / "config.json").read_text())
    matter, harmless = config_differences(saved, state.cfg.to_dict())
    if matter:
        raise CheckpointError(f"cannot resume from {folder}: the config differs where it matters: "
                              f"{', '.join(matter)}: restore these values, or start a new run with "
                              "--overwrite or another run.output_dir")
    if harmless:
        log.info("resuming with changed settings: %s", ", ".join(harmless))
    return folder


def finish_resume(state, out_dir: str | Path, folder: Path, blob: dict[str, Any]) -> None:
    """After loading: `latest` repaired, the logs cut back to the checkpoint's step, the log line."""
    out = Path(out_dir)
    latest = out / "latest"
    if not latest.is_file() or latest.read_text() != folder.name:  # a kill between rename and pointer
        point_latest(out, folder.name)
    cut_logs(out, state.step, blob["metrics_offset"]["bytes"], blob.get("metrics_row"))
    log.info("resumed from %s (step %d)", folder, state.step)
    if state.step >= state.cfg.run.max_steps:
        log.warning("the checkpoint is at step %d and run.max_steps is %d: nothing left to train; "
                    "raise run.max_steps to continue", state.step, state.cfg.run.max_steps)
