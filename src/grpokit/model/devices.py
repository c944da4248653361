"""Where every model runs: one resolver for the policy, its reference, reward models and the ranks.

The rules, decided here and nowhere else:

    1. `model.device` names a kind (auto, cpu, cuda, mps, xpu) or one device (cuda:1). auto: CUDA when a
       CUDA device is visible, else the CPU.
    2. Under a launcher (torchrun, accelerate: WORLD_SIZE > 1) each rank takes its own GPU: cuda and auto
       mean cuda:LOCAL_RANK, decided from the launcher's environment before anything is loaded (so it does
       not depend on who called `torch.cuda.set_device` first). An explicit index with several ranks would
       put them all on one GPU: refused, as is a host with fewer GPUs than ranks.
    3. The process-group backend follows the device the ranks compute on: NCCL for CUDA, gloo for the
       CPU, whatever else is visible (`model.device=cpu` on a GPU host is a gloo run).
    4. Every model ends on the rank's device however it arrives: loaded by grpokit, passed to
       `train_grpo` / `build_state` / `grpokit.trl.GRPOTrainer`, or a reward model with rm.device=auto
       (`place_model`). A model whose weights were never loaded (the meta device) is refused.

`cuda_count` and `env` are arguments so that each rule is testable on a machine without a GPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch

from grpokit.errors import ConfigError

log = logging.getLogger("grpokit")


def launcher_ranks(env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, local rank, world size) from a launcher's environment; (0, 0, 1) without one."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 0, 1
    rank = int(env.get("RANK", "0"))
    return rank, int(env.get("LOCAL_RANK", str(rank))), world


def _cuda_count(cuda_count: int | None) -> int:
    if cuda_count is not None:
        return cuda_count
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(name: str, *, env: Mapping[str, str] | None = None, cuda_count: int | None = None,
                   where: str = "model.device", per_rank: bool = True) -> torch.device:
    """The device this process computes on for the setting `name` (rules 1 and 2 above).

    Args:
        name: auto | cpu | cuda | cuda:N | mps | xpu.
        env: the launcher's variables (default: this process's environment).
        cuda_count: visible CUDA devices (default: asked of torch).
        where: the config key named in errors.
        per_rank: an explicit cuda:N is refused with several ranks (the policy); False for a device the
            ranks may share on purpose (a reward model on a GPU of its own).

    Raises:
        ConfigError: a CUDA setting without a CUDA device, an index out of range, an explicit index with
            several ranks, or more ranks on this host than GPUs.
    """
    _, local, world = launcher_ranks(env)
    count = _cuda_count(cuda_count)
    kind, _, index = name.partition(":")
    if kind == "auto":
        kind = "cuda" if count else "cpu"
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{where}=mps but the MPS backend is not available here: use {where}=auto")
    if kind == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise ConfigError(f"{where}={name} but no XPU device is visible: use {where}=auto")
    if kind != "cuda":
        return torch.device(name if index else kind)
    if not count:
        raise ConfigError(f"{where}={name} but no CUDA device is visible: use {where}=cpu (or auto)")
    if index:
        if world > 1 and per_rank:
            raise ConfigError(f"{where}={name} with {world} ranks would put every rank on one GPU: use "
                              f"{where}=cuda (or auto), and each rank takes cuda:LOCAL_RANK")
        if int(index) >= count:
            raise ConfigError(f"{where}={name} but this machine has {count} CUDA device(s), cuda:0 to "
                              f"cuda:{count - 1}: pick one of them")
        return torch.device("cuda", int(index))
    if world > 1:
        if local >= count:
            raise ConfigError(f"rank with LOCAL_RANK={local} but this host has {count} CUDA device(s): "
                              f"start at most {count} ranks per host (--nproc_per_node), or use {where}=cpu")
        return torch.device("cuda", local)
    return torch.device("cuda", torch.cuda.current_device() if cuda_count is None else 0)


def backend_for(device: torch.device) -> str:
    """The torch.distributed backend for ranks computing on `device` (rule 3)."""
    return "nccl" if device.type == "cuda" else "gloo"


def model_device(model: torch.nn.Module) -> torch.device | None:
    """The device of the model's first parameter or buffer (None for a module that holds neither)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return None


def place_model(model: torch.nn.Module, device: torch.device, *, what: str = "the model") -> torch.nn.Module:
    """Move `model` to `device` when it is elsewhere (rule 4); the same object back.

    Raises:
        ConfigError: the model's weights are on the meta device (built without loading any weights).
    """
    current = model_device(model)
    if current is None or current == device:
        return model
    if current.type == "meta":
        raise ConfigError(f"{what} has weights on the meta device (never loaded): load it with real "
                          "weights (from_pretrained, or from_config outside `init_empty_weights`)")
    log.info("%s moved from %s to %s", what, current, device)
    return model.to(device)


def empty_cache(device: torch.device) -> bool:
    """Give the accelerator's cached, unused memory back to the driver (torch.cuda / torch.xpu /
    torch.mps empty_cache); the CPU keeps no such cache. True when a cache was emptied."""
    backend = getattr(torch, device.type, None) if device.type in ("cuda", "xpu", "mps") else None
    if backend is None or not hasattr(backend, "empty_cache"):
        return False
    backend.empty_cache()
    return True
