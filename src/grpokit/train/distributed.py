"""A thin layer over torch.distributed: data parallel (DDP) or sharded (FSDP2) training.

    torchrun --nproc_per_node N -m grpokit train cfg.yaml      # or: accelerate launch -m grpokit train ...

Both launchers set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `Distributed.from_env`
reads them and opens the process group (NCCL when the ranks compute on GPUs, gloo on CPU). Without them
(world size W = 1) every method returns its input and no collective runs: the one-process path as is.

How one step of B prompts x G completions is split over W ranks:

    data     every rank walks the same seeded prompt order; of each draw of B prompts, rank r keeps
             prompts [r*B/W, (r+1)*B/W). Groups are therefore whole on one rank, so a group's mean and
             std are local and exact (docs/scaling.md). Only scale_rewards=batch needs a batch statistic:
             the rewards are all-gathered, advantages computed on the whole batch, each keeps its rows.
    loss     the normalizers are global: N_seq = sum_r N_r, N_tok = sum_r N_tok,r (dapo), and the
             micro-batch count (bnpo). Rank r's loss L_r = sum_{rows of r} (...) / N_global, so
             sum_r L_r is the one-process loss. DDP (and FSDP) average gradients, (1/W) sum_r grad L'_r,
             so each rank back-propagates L'_r = W * L_r: the average is the global-batch gradient.
    metrics  sums are all-reduced before they are divided; batch statistics (reward mean/std, lengths,
             advantages) are computed on all-gathered per-completion values. Every logged figure is
             the global one.
    I/O      only rank 0 writes metrics, evaluates and saves; checkpoints carry every rank's RNG state.

FSDP (run.fsdp=true) shards parameters, gradients and optimizer state with PyTorch FSDP2
`fully_shard` (one unit per decoder layer plus the root). Generation and evaluation run with the
parameters gathered (`unsharded`), and checkpoints are sharded (torch.distributed.checkpoint, one file
set per rank), made one save_pretrained folder by `grpokit.train.fsdp_checkpoint.consolidate_checkpoint`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as tdist

from grpokit.errors import ConfigError
from grpokit.model.devices import backend_for, launcher_ranks, resolve_device
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.reference import sync_reference
from grpokit.train import checkpoint, resume
from grpokit.train.data import ShardedStream
from grpokit.train.fsdp_checkpoint import load_sharded, save_sharded

log = logging.getLogger("grpokit")

# how long the other ranks wait for rank 0's `on_main(..., patient=True)` (an evaluation): not the process
# group's 30 minutes, which a long evaluation on NCCL outlasts; an exception on rank 0 still ends it at once
PATIENT_TIMEOUT = datetime.timedelta(hours=24)


class LogprobsForward(torch.nn.Module):
    """The policy's per-token log-probs as one `forward`, so DDP / FSDP hooks see the whole computation
    (`per_token_logprobs` calls the decoder and the lm-head weight directly: the chunked head)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int,
                temperature: float = 1.0, **kw: Any):
        return per_token_logprobs(self.model, input_ids, attention_mask, completion_length,
                                  temperature=temperature, **kw)


@dataclass
class Distributed:
    """Rank, world size and the collectives the trainer needs; a no-op for one process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    fsdp: bool = False
    owns_group: bool = False           # from_env opened the process group (close() ends it)
    ddp_options: dict[str, Any] = field(default_factory=dict)   # DistributedDataParallel keywords: run.ddp_*
    _wrappers: dict[int, torch.nn.Module] = field(default_factory=dict, repr=False)
    _patient: Any = field(default=None, repr=False)   # gloo group for `on_main(patient=True)`, made once

    @classmethod
    def for_run(cls, run: Any, device: str = "auto") -> "Distributed":
        """`from_env` with run.fsdp, run.ddp_timeout_s, run.ddp_backend and the run.ddp_* keywords."""
        keys = ("find_unused_parameters", "bucket_cap_mb", "broadcast_buffers", "static_graph")
        return cls.from_env(run.fsdp, device=device, timeout_s=run.ddp_timeout_s, backend=run.ddp_backend,
                            ddp_options={k: getattr(run, f"ddp_{k}") for k in keys})

    @classmethod
    def from_env(cls, fsdp: bool = False, env: dict[str, str] | None = None, device: str = "auto",
                 timeout_s: float = 1800, backend: str = "auto",
                 ddp_options: dict[str, Any] | None = None) -> "Distributed":
        """The ranks torchrun / accelerate launched (one process: a no-op). device: model.device, whose kind
        picks an auto backend (NCCL for CUDA, else gloo); on CUDA each rank computes on cuda:LOCAL_RANK."""
        env = dict(os.environ if env is None else env)
        rank, local, world = launcher_ranks(env)
        if world <= 1:
            return cls(fsdp=False)
        where = resolve_device(device, env=env)
        backend = backend_for(where) if backend == "auto" else backend
        if where.type == "cuda":
            torch.cuda.set_device(where)
        opened = not tdist.is_initialized()
        if opened:
            tdist.init_process_group(backend, rank=rank, world_size=world,
                                     timeout=datetime.timedelta(seconds=timeout_s))
        log.info("distributed: rank %d of %d computes on %s, backend %s", rank, world, where, backend)
        return cls(rank=tdist.get_rank(), world_size=tdist.get_world_size(), local_rank=local,
                   backend=backend, fsdp=fsdp, owns_group=opened, ddp_options=dict(ddp_options or {}))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs, evaluates and saves."""
        return self.rank == 0

    @property
    def grad_scale(self) -> float:
        """Factor on each rank's loss so that the averaged gradient is the global-batch one (W)."""
        return float(self.world_size)

    def check(self, prompts_per_step: int, algorithm: str = "grpo") -> None:
        """A one-line error when the B prompts do not split evenly over the ranks, or for PPO on several."""
        if prompts_per_step % self.world_size:
            raise ConfigError(f"rollout.prompts_per_step ({prompts_per_step}) must be divisible by the "
                              f"number of ranks ({self.world_size}): each rank takes whole groups")
        if algorithm == "ppo" and self.enabled:
            raise ConfigError(f"loss.algorithm=ppo runs in one process, not {self.world_size} ranks (its "
                              "critic is not synchronised): launch it without torchrun or use grpo")

    def seed(self, seed: int) -> None:
        """Give rank r > 0 its own sampling stream (rank 0 keeps the one-process stream)."""
        if self.rank > 0:
            torch.manual_seed(seed + 1_000_003 * self.rank)

    def seed_environments(self, agent: Any, seed: int) -> None:
        """Rank r > 0's training environments on their own random streams, as `seed` does for sampling."""
        if self.rank > 0 and agent is not None and agent.pool is not None:
            agent.pool.seed = seed + 1_000_003 * self.rank
            agent.pool.reseed()

    # ---- collectives (identity for one process) --------------------------------------------------
    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def _device(self) -> torch.device:
        return (torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl"
                else torch.device("cpu"))

    def sum(self, value: float) -> float:
        """The sum of a number over ranks."""
        if not self.enabled:
            return float(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=self._device())
        tdist.all_reduce(t)
        return float(t)

    def all_true(self, flag: bool) -> bool:
        """True on every rank when flag is true on every rank (keeps loops in lock-step)."""
        return self.sum(0.0 if flag else 1.0) == 0.0 if self.enabled else bool(flag)

    def reduce_sums(self, sums: dict[str, Any]) -> dict[str, float]:
        """{name: per-rank sum} -> {name: global sum}, in one all-reduce."""
        keys = sorted(sums)
        if not keys:
            return {}
        vals = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64, device=self._device())
        if self.enabled:
            tdist.all_reduce(vals)
        return dict(zip(keys, vals.tolist()))

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate x over ranks along dim 0; sizes may differ, other dims are zero-padded to the max."""
        if not self.enabled:
            return x
        dev = self._device()
        shape = torch.tensor(list(x.shape), dtype=torch.long, device=dev)
        shapes = [torch.zeros_like(shape) for _ in range(self.world_size)]
        tdist.all_gather(shapes, shape)
        big = torch.stack(shapes).max(0).values.tolist()
        pad = []
        for d in reversed(range(1, x.dim())):
            pad += [0, big[d] - x.shape[d]]
        src = x.to(torch.uint8) if x.dtype == torch.bool else x           # gloo has no bool all-gather
        src = torch.nn.functional.pad(src, pad) if pad else src
        src = torch.nn.functional.pad(src, [0, 0] * (x.dim() - 1)
                                      + [0, big[0] - x.shape[0]]).to(dev).contiguous()
        parts = [torch.empty_like(src) for _ in range(self.world_size)]
        tdist.all_gather(parts, src)
        out = torch.cat([p[:int(s[0])] for p, s in zip(parts, shapes)]).to(x.device)
        return out.bool() if x.dtype == torch.bool else out

    def gather_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, slice]:
        """(x of all ranks concatenated along dim 0, the rows of this rank in it)."""
        if not self.enabled:
            return x, slice(0, x.shape[0])
        sizes = self.gather_object(int(x.shape[0]))
        start = sum(sizes[:self.rank])
        return self.gather(x), slice(start, start + int(x.shape[0]))

    def gather_object(self, obj: Any) -> list:
        """[obj of rank 0, ..., obj of rank W-1] on every rank (pickled; for small things)."""
        if not self.enabled:
            return [obj]
        out: list = [None] * self.world_size
        tdist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        """End the group `from_env` opened, every rank at once: a barrier, then destroy. Left to interpreter
        exit, or destroyed by a rank while a peer still used it, gloo can abort that peer (SIGABRT)."""
        if not self.owns_group:
            return
        if tdist.is_initialized():          # a colocated vLLM engine's shutdown may have ended it already
            tdist.barrier()
            tdist.destroy_process_group()
        self.owns_group = False
        log.info("distributed: process group closed")

    # ---- data and models ------------------------------------------------------------------------
    def shard_stream(self, stream: Any) -> Any:
        """The stream this rank takes its prompts from (the stream itself for one process)."""
        return ShardedStream(stream, self.rank, self.world_size) if self.enabled else stream

    def prepare(self, model: torch.nn.Module, trainable: bool = True) -> torch.nn.Module:
        """Wrap the model for data-parallel (DDP) or sharded (FSDP2) training; returns the same object.

        The model itself is kept (save_pretrained, generation and the config stay reachable); the
        wrapper, kept here, is what `logprobs_fn` calls. DDP broadcasts rank 0's weights at wrap time.
        """
        if not self.enabled:
            return model
        if not any(True for _ in model.parameters()):
            return model   # a LoRA reference: a view of the policy's modules, wrapped with the policy
        wrapper = LogprobsForward(model)
        if self.fsdp:
            from torch.distributed.fsdp import fully_shard

            decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
            for layer in getattr(decoder, "layers", []):
                fully_shard(layer)
            fully_shard(wrapper)
            with torch.no_grad():  # one root forward: FSDP initializes the root before any layer runs alone
                ids = torch.zeros(1, 2, dtype=torch.long, device=next(model.parameters()).device)
                wrapper(ids, torch.ones_like(ids), 1)
            # the root keeps its weights gathered after forward: shard them before the optimizer
            wrapper.reshard()
        elif trainable:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.local_rank] if self.backend == "nccl" else None
            wrapper = DistributedDataParallel(wrapper, device_ids=ids, **self.ddp_options)
        else:
            return model                 # a frozen replica needs no wrapper under DDP
        self._wrappers[id(model)] = wrapper
        return model

    def logprobs_fn(self, model: torch.nn.Module) -> Callable[..., Any]:
        """A `per_token_logprobs`-compatible function that runs `model` through its DDP/FSDP wrapper."""
        wrapper = self._wrappers.get(id(model))
        owner = getattr(model, "weights_owner", None)         # a LoRA reference: the policy, adapters off
        if wrapper is None and self.fsdp and owner is not None and id(owner) in self._wrappers:
            return self._reference_view_fn(model, self._wrappers[id(owner)])
        if wrapper is None:
            return per_token_logprobs

        def fn(m, input_ids, attention_mask, completion_length, temperature=1.0, **kw):
            if not (self.fsdp or torch.is_grad_enabled()):   # DDP: no-grad passes need no hooks
                return per_token_logprobs(m, input_ids, attention_mask, completion_length,
                                          temperature=temperature, **kw)
            return wrapper(input_ids, attention_mask, completion_length, temperature, **kw)

        return fn

    @staticmethod
    def _reference_view_fn(view: torch.nn.Module, wrapper: torch.nn.Module) -> Callable[..., Any]:
        """The LoRA reference under FSDP: the policy's sharded wrapper run with the adapters disabled
        (the base weights are the reference's; nothing is sharded twice)."""

        def fn(m, input_ids, attention_mask, completion_length, temperature=1.0, **kw):
            with torch.no_grad(), view.base_model_mode():
                return wrapper(input_ids, attention_mask, completion_length, temperature, **kw)

        return fn

    def sync_grads(self, model: torch.nn.Module, sync: bool) -> None:
        """Set before a micro-batch's forward: its backward reduces gradients over ranks only when `sync`
        (the last micro-batch); earlier ones accumulate locally (what DDP's no_sync() sets)."""
        wrapper = self._wrappers.get(id(model))
        if wrapper is not None and not self.fsdp:   # FSDP reduce-scatters every micro-batch (sums add up)
            wrapper.require_backward_grad_sync = sync

    @contextlib.contextmanager
    def unsharded(self, model: torch.nn.Module) -> Iterator[None]:
        """FSDP: gather the full parameters for generation / evaluation (every rank enters together);
        inside, each rank may run any number of forwards. A no-op without FSDP. Memory: inside, every rank
        holds the whole model (P parameters, in the dtype they are stored in) beside its 1/W shard of the
        parameters, gradients and optimizer state: FSDP saves memory in the update, not while sampling."""
        wrapper = self._wrappers.get(id(model)) if self.fsdp else None
        if wrapper is None:
            yield
            return
        from torch.distributed.fsdp import FSDPModule

        layers = [m for m in wrapper.modules() if isinstance(m, FSDPModule) and m is not wrapper]
        for m in [wrapper, *layers]:
            m.unshard()
        for m in layers:  # the root never reshards after forward; its setting must stay untouched
            m.set_reshard_after_forward(False, recurse=False)
        try:
            yield
        finally:
            for m in layers:
                m.set_reshard_after_forward(True, recurse=False)
            for m in [wrapper, *layers]:
                m.reshard()   # parameters are the sharded DTensors again (those the optimizer holds)

    def sync_reference(self, ref: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
        """ref <- alpha * policy + (1 - alpha) * ref (`grpokit.model.reference.sync_reference`); under FSDP
        on each rank's own shards, both roots resharded first: a root keeps its weights gathered after a
        forward, as plain tensors that cannot be mixed with the other model's shards."""
        for model in (ref, policy):
            if self.fsdp and id(model) in self._wrappers:
                self._wrappers[id(model)].reshard()
        sync_reference(ref, policy, alpha)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights on rank 0 ({} on other ranks under FSDP); a collective under FSDP."""
        if not (self.fsdp and id(model) in self._wrappers):
            return model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def on_main(self, fn: Callable[[], Any], *, patient: bool = False) -> Any:
        """fn() on rank 0 alone, its result given to every rank; an exception it raises is raised on every
        rank (no rank is left waiting in a collective). One process: fn().

        patient: fn may outlast the process group's timeout (an evaluation): the other ranks wait on a
        gloo group of their own whose timeout is PATIENT_TIMEOUT (made the first time, every rank at once)."""
        if not self.enabled:
            return fn()
        if patient and self._patient is None:
            self._patient = tdist.new_group(backend="gloo", timeout=PATIENT_TIMEOUT)
        result: Any = None
        error: BaseException | None = None
        if self.is_main:
            try:
                result = fn()
            except Exception as e:      # raised below on every rank, rank 0 included
                error = e
        box = [(result, error)]
        tdist.broadcast_object_list(box, src=0, group=self._patient if patient else None)
        result, error = box[0]
        if error is not None:
            raise error
        return result

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers into the same module on every rank (in place)."""
        if not self.enabled:
            return
        with torch.no_grad():
            for tensor in module.state_dict().values():
                tdist.broadcast(tensor, src=0)

    # ---- checkpoints (grpokit.train.checkpoint, resume; fsdp_checkpoint for the shards) ----------
    def save_checkpoint(self, state: Any, out_dir: str | Path, metrics_row: dict | None = None) -> None:
        """checkpoint-<step> with every rank's RNG states (state.rank_rng, environments' too): rank 0 writes
        it, DDP replicas being equal; under FSDP each rank writes its shards, rank 0 the rest."""
        if self.enabled:
            env = state.agent.rng_state() if getattr(state, "agent", None) is not None else None
            state.rank_rng = self.gather_object({**checkpoint.rng_state(), "env": env})
            if getattr(state, "reward_loop", None) is not None:   # Algorithm 1: each rank's samples so far
                state.reward_loop.share_for_checkpoint(self)
        if self.fsdp and self.enabled:
            save_sharded(self, state, Path(out_dir), metrics_row)
        else:
            self.on_main(lambda: checkpoint.save_checkpoint(state, out_dir, metrics_row=metrics_row))

    def resume(self, state: Any, out_dir: str | Path) -> bool:
        """Load the newest complete checkpoint on every rank when run.resume is set: rank 0 chooses it
        (damaged ones moved aside, the config compared), every rank loads it, rank 0 repairs the logs."""
        if not state.cfg.run.resume:
            return False
        folder = self.on_main(lambda: resume.choose_checkpoint(state, out_dir))
        if folder is None:
            return False
        sharded = self.fsdp and self.enabled
        blob = load_sharded(self, state, folder) if sharded else resume.load_checkpoint(state, folder)
        self.on_main(lambda: resume.finish_resume(state, out_dir, folder, blob))
        return True
