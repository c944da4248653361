"""Checkpoints: atomic save, resume, and the output-directory guard.

A checkpoint is written into a temporary folder, fsynced, then renamed to checkpoint-<step>; the
`latest` pointer is rewritten last, so a kill at any moment leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("grpokit")


class OutputDirError(ValueError):
    """The output directory cannot be used as asked: the message says what to change."""


def _checkpoints(out_dir: Path) -> list[Path]:
    found = [p for p in out_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def prepare_output_dir(cfg) -> None:
    """Refuse an output_dir holding another run unless run.resume or run.overwrite is set."""
    out = Path(cfg.run.output_dir)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"run.output_dir '{out}' is a file: give a folder path")
    busy = out.is_dir() and (_checkpoints(out) or (out / "metrics.jsonl").exists())
    if busy and not (cfg.run.resume or cfg.run.overwrite):
        raise OutputDirError(f"run.output_dir '{out}' already holds a run: pass --resume to continue it, "
                             "--overwrite to replace it, or choose another run.output_dir")
    if busy and cfg.run.overwrite and not cfg.run.resume:
        for item in out.iterdir():
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    out.mkdir(parents=True, exist_ok=True)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def save_checkpoint(state, out_dir: str | Path) -> Path:
    """Write checkpoint-<step> atomically; keep the newest run.save_total_limit of them."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    final = out / f"checkpoint-{state.step}"
    tmp = out / f".tmp-checkpoint-{state.step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {k: v.detach().contiguous().cpu() for k, v in state.model.state_dict().items()}
    save_file(weights, tmp / "model.safetensors")
    torch.save({"optimizer": state.optimizer.state_dict(), "scheduler": state.scheduler.state_dict(),
                "rng": rng_state(), "step": state.step, "cursor": state.stream.cursor,
                "bad_steps": state.bad_steps}, tmp / "trainer_state.pt")
    if state.ref_model is not None:
        save_file({k: v.detach().contiguous().cpu() for k, v in state.ref_model.state_dict().items()},
                  tmp / "ref_model.safetensors")
    (tmp / "config.json").write_text(json.dumps(state.cfg.to_dict(), indent=2))
    _fsync_tree(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = out / "latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, out / "latest")
    limit = state.cfg.run.save_total_limit
    if limit:
        for old in _checkpoints(out)[:-limit]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(state, folder: Path) -> None:
    from safetensors.torch import load_file

    state.model.load_state_dict(load_file(folder / "model.safetensors"))
    if state.ref_model is not None and (folder / "ref_model.safetensors").exists():
        state.ref_model.load_state_dict(load_file(folder / "ref_model.safetensors"))
    blob = torch.load(folder / "trainer_state.pt", weights_only=False)
    state.optimizer.load_state_dict(blob["optimizer"])
    state.scheduler.load_state_dict(blob["scheduler"])
    state.step, state.stream.cursor, state.bad_steps = blob["step"], blob["cursor"], blob["bad_steps"]
    set_rng_state(blob["rng"])


def resume_if_requested(state, out_dir: Path) -> bool:
    """Load the newest checkpoint when run.resume is set; False when there is none (fresh start)."""
    if not state.cfg.run.resume:
        return False
    found = _checkpoints(Path(out_dir))
    if not found:
        log.warning("run.resume is set but %s has no checkpoint: starting from step 0", out_dir)
        return False
    load_checkpoint(state, found[-1])
    log.info("resumed from %s (step %d)", found[-1], state.step)
    return True
