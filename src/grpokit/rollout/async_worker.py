"""The rollout worker of asynchronous GRPO: a process of its own that samples groups with the weights
it was sent, while the trainer updates (the schedule and the trainer's side: grpokit.train.async_rollouts).
With rollout.backend=vllm in server mode the worker is a thread of the trainer that drives the server
(`grpokit vllm-serve`, on this machine or another): weights pushed over HTTP, the server samples.

Protocol, in order on one command queue (so a batch is always sampled with the weights sent before it):

    ("weights", version, state_dict)    load these weights (CPU tensors in shared memory)
    ("sample", batch, version, prompts) sample G completions per prompt, with the weights of `version`
    ("stop",)                           end the process

and on the result queue, one message per batch, in order:

    ("ready",)                                                 started (sent once)
    ("rollout", batch, version, payload, rng_after, seconds)   payload: `rollout_payload` bytes,
                                                               rng_after: the RNG state's bytes
Results are plain bytes, never tensors: a tensor crosses processes as a shared-memory handle that the
receiver opens through the sender, which fails if the worker died in between.
    ("error", batch, message)                                  a sampling error (the run stops on it)

The worker draws from its own torch RNG, seeded with the state the trainer hands over at start (a fresh
run: the trainer's own, so a worker that samples every batch on-policy gives the synchronous run's
draws), and returns its RNG state after every batch: the trainer keeps it for checkpoints and restarts.
"""

from __future__ import annotations

import dataclasses
import io
import multiprocessing
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit import switch
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.precision import autocast_for
from grpokit.rollout.contract import from_plain, plain_fields
from grpokit.rollout.groups import Rollout, sample_groups
from grpokit.rollout.vllm_backend import SamplingSpec, ServerEngine, engine_rollout


@dataclass
class WorkerSpec:
    """What a worker starts with: the policy (a CPU copy) or a vLLM server, the tokenizer, the options."""

    model: torch.nn.Module | None    # the worker process's own copy (None: a server samples)
    tokenizer: Any
    sample_kwargs: dict[str, Any]    # sample_groups' keywords (group_size, max_new_tokens, temperature, ...)
    rng_state: torch.Tensor | None   # the torch RNG state to start drawing from (a process worker)
    version: int                     # the policy version the worker holds at start (-1: none yet)
    threads: int = 1                 # torch threads in the worker process
    cpus: list[int] = field(default_factory=list)   # cores to pin the worker process to ([]: not pinned)
    delay_s: float = 0.0             # tests only: sleep before each batch (a slow worker)
    server_url: str | None = None    # rollout.backend=vllm server: the `grpokit vllm-serve` to drive
    cfg: Any = None                  # server: the run's config (prompt rendering, sampling, seed)
    eos_ids: list[int] = field(default_factory=list)   # server: the tokens that end a completion


class _ModelSampler:
    """A worker process: its own copy of the policy, grpokit's sampler, its own RNG."""

    def __init__(self, spec: WorkerSpec) -> None:
        torch.set_num_threads(max(1, spec.threads))
        if spec.cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, spec.cpus)
        torch.set_rng_state(spec.rng_state)
        self.model, self.spec = spec.model, spec

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights)

    def sample(self, batch: int, prompts: list) -> tuple[Rollout, bytes | None]:
        rollout = sample_batch(self.model, self.spec.tokenizer, prompts, self.spec.sample_kwargs)
        return rollout, torch.get_rng_state().numpy().tobytes()


class _ServerSampler:
    """A thread of the trainer that drives a vLLM server: weights pushed over HTTP, one seed per batch
    (from run.seed and the batch index: reproducible as far as the engine is)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.engine, self.spec = ServerEngine(spec.server_url), spec

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        self.engine.load_weights(weights.items())

    def sample(self, batch: int, prompts: list) -> tuple[Rollout, bytes | None]:
        r, seed = self.spec.cfg.rollout, (self.spec.cfg.run.seed * 1_000_003 + batch) % (2**31 - 1)
        spec = SamplingSpec(r.num_generations, r.max_completion_length, r.temperature, r.top_p, r.top_k,
                            tuple(self.spec.eos_ids), seed)
        return engine_rollout(self.engine, self.spec.tokenizer, prompts, self.spec.cfg, spec), None


class ThreadWorker:
    """rollout.backend=vllm server: the worker is a thread (the server does the sampling), with the
    process interface the trainer uses (start, is_alive, exitcode, join, kill)."""

    def __init__(self, spec: WorkerSpec, commands: queue.Queue, results: queue.Queue) -> None:
        self.exitcode: int | None = None
        self.commands = commands
        self.thread = threading.Thread(target=self._run, args=(spec, commands, results), daemon=True,
                                       name="grpokit-rollout-worker")

    def _run(self, spec, commands, results) -> None:
        worker_main(spec, commands, results)
        self.exitcode = 0

    def start(self) -> None:
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def kill(self) -> None:   # a thread cannot be killed: it ends after the request in flight
        self.commands.put(("stop",))


def rollout_payload(rollout: Rollout) -> bytes:
    """A Rollout as bytes (torch.save of its fields): small, and independent of shared-memory lifetimes."""
    buf = io.BytesIO()
    torch.save(rollout_fields(rollout), buf)
    return buf.getvalue()


def rollout_fields(rollout: Rollout) -> dict[str, Any]:
    """The Rollout's fields as plain tensors, lists and numbers (loadable with weights_only=True)."""
    if rollout.trajectories is not None:
        raise ValueError("asynchronous rollouts are single-turn: this rollout has trajectories")
    return plain_fields(rollout)


def rollout_from(payload: bytes | dict[str, Any]) -> Rollout:
    """The Rollout `rollout_payload` (bytes) or `rollout_fields` (a dict) describes."""
    fields = torch.load(io.BytesIO(payload), weights_only=True) if isinstance(payload, bytes) else payload
    return from_plain(fields)


def sample_batch(model: torch.nn.Module, tokenizer, prompts: list, kw: dict[str, Any]) -> Rollout:
    """One batch the way the synchronous step samples it (the fast sampler inside the one switch,
    grpokit.switch), with the sampling log-probs: the sampler's own, or one forward pass when the
    backend has none."""
    with switch.accelerated(model, None):
        rollout = sample_groups(model, tokenizer, prompts, **kw)
    if rollout.sampling_logprobs is None:   # backend=generate: the log-probs of the sampled tokens
        with torch.no_grad(), autocast_for(model):
            lp = per_token_logprobs(model, rollout.input_ids, rollout.attention_mask,
                                    rollout.completion_ids.shape[1], temperature=kw.get("temperature", 1.0))
        return dataclasses.replace(rollout, sampling_logprobs=lp.float() * rollout.completion_mask)
    return rollout


def worker_main(spec: WorkerSpec, commands, results) -> None:
    """The worker: follow the commands until "stop" (see the module docstring)."""
    batch = -1
    try:
        sampler = _ModelSampler(spec) if spec.server_url is None else _ServerSampler(spec)
        version = spec.version
        results.put(("ready",))
        parent = multiprocessing.parent_process() if spec.server_url is None else None
        while True:
            try:
                msg = commands.get(timeout=1.0)
            except queue.Empty:
                if parent is not None and not parent.is_alive():   # the trainer was killed: end too
                    return
                continue
            if msg[0] == "stop":
                return
            if msg[0] == "weights":
                sampler.load(msg[2])
                version = msg[1]
                continue
            _, batch, want, prompts = msg
            if want != version:
                raise RuntimeError(f"batch {batch} wants policy version {want}; the worker holds {version}")
            if spec.delay_s:
                time.sleep(spec.delay_s)
            start = time.perf_counter()
            rollout, rng_after = sampler.sample(batch, prompts)
            results.put(("rollout", batch, version, rollout_payload(rollout), rng_after,
                         time.perf_counter() - start))
    except KeyboardInterrupt:
        return
    except Exception as e:   # the trainer stops the run with this line
        where = traceback.extract_tb(e.__traceback__)[-1]
        results.put(("error", batch, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                                     f"({os.path.basename(where.filename)}:{where.lineno})"))
