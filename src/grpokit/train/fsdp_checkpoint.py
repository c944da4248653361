"""FSDP sharded checkpoints: every rank writes its shards, resume reads them back, and
`consolidate_checkpoint` turns a sharded checkpoint into a plain save_pretrained folder.

Used by `grpokit.train.distributed.Distributed.save_checkpoint` / `.resume` when run.fsdp is on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpokit.config.schema import build_config
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.train.checkpoint import point_latest, retire, rng_state, set_rng_state, swap_in

if TYPE_CHECKING:  # grpokit.train.distributed calls this module: a type here only
    from grpokit.train.distributed import Distributed

log = logging.getLogger("grpokit")


def _checkpoint_dirs(out_dir: Path) -> list[Path]:
    found = [p for p in out_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def save_sharded(dist: Distributed, state: Any, out_dir: Path) -> Path:
    """checkpoint-<step> under FSDP: model, reference and optimizer as shards (torch.distributed.checkpoint,
    each rank writes its own), trainer_state.pt and config.json from rank 0, published by one rename."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    final, tmp = out_dir / f"checkpoint-{state.step}", out_dir / f".tmp-checkpoint-{state.step}"
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    shards = {"model": model_sd, "optim": optim_sd}
    if state.ref_model is not None:
        shards["ref"] = get_model_state_dict(state.ref_model)
    dcp.save(shards, checkpoint_id=str(tmp / "sharded"))
    if dist.is_main:
        torch.save({"scheduler": state.scheduler.state_dict(), "rng": rng_state(), "rank_rng": state.rank_rng,
                    "step": state.step, "cursor": state.stream.cursor, "bad_steps": state.bad_steps,
                    "entropy_control": [state.entropy_coef, state.last_entropy],
                    "world_size": dist.world_size}, tmp / "trainer_state.pt")
        (tmp / "config.json").write_text(json.dumps(state.cfg.to_dict(), indent=2))
        swap_in(tmp, final)
        point_latest(out_dir, final.name)
        limit = state.cfg.run.save_total_limit
        for old in (_checkpoint_dirs(out_dir)[:-limit] if limit else []):
            retire(old)
    dist.barrier()
    return final


def resume_sharded(dist: Distributed, state: Any, out_dir: Path) -> bool:
    """Load the newest sharded checkpoint into the FSDP model and optimizer; every rank its own RNG."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    found = _checkpoint_dirs(out_dir) if state.cfg.run.resume else []
    if not found:
        if state.cfg.run.resume:
            log.warning("run.resume is set but %s has no checkpoint: starting from step 0", out_dir)
        return False
    folder = found[-1]
    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    shards = {"model": model_sd, "optim": optim_sd}
    if state.ref_model is not None:
        shards["ref"] = get_model_state_dict(state.ref_model)
    dcp.load(shards, checkpoint_id=str(folder / "sharded"))
    set_state_dict(state.model, state.optimizer, model_state_dict=shards["model"],
                   optim_state_dict=shards["optim"])
    if state.ref_model is not None:
        set_model_state_dict(state.ref_model, shards["ref"])
    blob = torch.load(folder / "trainer_state.pt", weights_only=False)
    state.scheduler.load_state_dict(blob["scheduler"])
    state.step, state.stream.cursor, state.bad_steps = blob["step"], blob["cursor"], blob["bad_steps"]
    if blob.get("entropy_control") is not None:
        state.entropy_coef, state.last_entropy = blob["entropy_control"]
    ranks = blob.get("rank_rng") or []
    set_rng_state(ranks[dist.rank] if len(ranks) == dist.world_size else blob["rng"])
    log.info("resumed from %s (step %d, sharded)", folder, state.step)
    return True


def consolidate_checkpoint(folder: str | Path, out_dir: str | Path) -> Path:
    """A save_pretrained folder (model + tokenizer) from a sharded FSDP checkpoint, in one CPU process.

    The shards are merged with torch.distributed.checkpoint's `dcp_to_torch_save` (no process group),
    loaded into the model named by the checkpoint's config, and saved with save_pretrained.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder, out = Path(folder), Path(out_dir)
    if not (folder / "sharded").is_dir():
        raise FileNotFoundError(f"{folder} holds no sharded/ folder: give a checkpoint-<step> of an FSDP run")
    cfg = build_config(json.loads((folder / "config.json").read_text()))
    with tempfile.TemporaryDirectory() as td:
        dcp_to_torch_save(str(folder / "sharded"), str(Path(td) / "full.pt"))
        weights = torch.load(Path(td) / "full.pt", weights_only=False)["model"]
    model, tokenizer = load_model_and_tokenizer(dataclasses.replace(cfg.model, device="cpu"),
                                                seed=cfg.run.seed)
    model.load_state_dict(weights)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "grpokit_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    return out
