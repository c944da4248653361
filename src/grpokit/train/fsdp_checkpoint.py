"""FSDP sharded checkpoints: the single-process checkpoint with the weights and the optimizer as shards.

    checkpoint-<step>/
        sharded/               model, reference, optimizer: torch.distributed.checkpoint, every rank its
                               own files (.metadata + __<rank>_0.distcp)
        trainer_state.pt, config.json, reward_model.safetensors, reward_loop.pt, manifest.json
                               as in one process (`grpokit.train.checkpoint`), written by rank 0

The same guarantees as one process, by the same code: `checkpoint.start_save` (free space, the hidden
folder), the shards, then `checkpoint.finish_save` on rank 0 (every other file, the manifest with the
size and sha256 of every file, shards included, the rename, `latest`, pruning); resume verifies the
manifest and falls back from a damaged newest checkpoint (`grpokit.train.resume`), loads the shards on
every rank and the trainer state with `weights_only=True`. `consolidate_checkpoint` turns a sharded
checkpoint into a plain save_pretrained folder.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

import torch

from grpokit.config.schema import build_config
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.train import checkpoint, resume

log = logging.getLogger("grpokit")

T = TypeVar("T")


class Ranks(Protocol):
    """What the sharded save and load take of the distributed state (`grpokit.train.distributed.Distributed`
    has it, and calls this module: it is named by its shape, so nothing here imports it back)."""

    rank: int
    world_size: int

    def on_main(self, fn: Callable[[], T]) -> T:
        """fn() on rank 0 alone, its result (or its exception) given to every rank."""
        ...


def _shards(state: Any) -> dict[str, Any]:
    """The sharded state dicts: the policy with its optimizer, and a reference that holds weights (a LoRA
    reference is a view of the policy: nothing of its own)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    shards = {"model": model_sd, "optim": optim_sd}
    if state.ref_model is not None and any(True for _ in state.ref_model.parameters()):
        shards["ref"] = get_model_state_dict(state.ref_model)
    return shards


def save_sharded(dist: Ranks, state: Any, out_dir: Path, metrics_row: dict | None = None) -> Path:
    """checkpoint-<step> under FSDP; every rank calls it. An error on rank 0 is raised on every rank."""
    import torch.distributed.checkpoint as dcp

    tmp = dist.on_main(lambda: checkpoint.start_save(state, out_dir))
    dcp.save(_shards(state), checkpoint_id=str(tmp / "sharded"))
    return dist.on_main(lambda: checkpoint.finish_save(state, out_dir, tmp, metrics_row, sharded=True))


def load_sharded(dist: Ranks, state: Any, folder: Path) -> dict[str, Any]:
    """Every rank: the shards of `folder` into the FSDP model, reference and optimizer, then the trainer
    state (this rank's RNG); the trainer-state record."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if not (folder / "sharded").is_dir():
        raise checkpoint.CheckpointError(f"{folder} holds no sharded/ folder but run.fsdp is on: resume "
                                         "with the checkpoint's run.fsdp")
    shards = _shards(state)
    dcp.load(shards, checkpoint_id=str(folder / "sharded"))
    set_state_dict(state.model, state.optimizer, model_state_dict=shards["model"],
                   optim_state_dict=shards["optim"])
    if "ref" in shards:
        set_model_state_dict(state.ref_model, shards["ref"])
    blob = resume.load_trainer_state(state, folder, optimizer=False)
    log.info("loaded the shards of %s on rank %d of %d", folder.name, dist.rank, dist.world_size)
    return blob


def consolidate_checkpoint(folder: str | Path, out_dir: str | Path) -> Path:
    """A save_pretrained folder (model + tokenizer) from a sharded FSDP checkpoint, in one CPU process.

    The shards are merged with torch.distributed.checkpoint's `dcp_to_torch_save` (no process group),
    loaded into the model named by the checkpoint's config, and saved with save_pretrained.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder, out = Path(folder), Path(out_dir)
    problem = resume.verify_checkpoint(folder)
    if problem is not None:
        raise checkpoint.CheckpointError(f"{folder} is damaged ({problem}): consolidate another checkpoint")
    if not (folder / "sharded").is_dir():
        raise FileNotFoundError(f"{folder} holds no sharded/ folder: give a checkpoint-<step> of an FSDP run")
    cfg = build_config(json.loads((folder / "config.json").read_text()))
    with tempfile.TemporaryDirectory() as td:
        dcp_to_torch_save(str(folder / "sharded"), str(Path(td) / "full.pt"))
        weights = torch.load(Path(td) / "full.pt", weights_only=True)["model"]
    model, tokenizer = load_model_and_tokenizer(dataclasses.replace(cfg.model, device="cpu"),
                                                seed=cfg.run.seed)
    model.load_state_dict(weights)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "grpokit_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    return out
