"""Asynchronous GRPO (rollout.async.*): a worker process samples the next batches while the trainer updates.

Versions: version v is the policy after v optimizer steps (`state.step`); step b trains on batch b. With
max_staleness K and weight_sync_steps N (1 <= N <= K + 1), batch b is always sampled with the weights of

    w(b) = N * ceil(max(0, b - K) / N)         so its lag b - w(b) is at most K (min(b, K) early on)

The worker is a process with its own copy of the policy (grpokit's sampler, its share of the cores:
rollout.async.worker_threads), or, with rollout.backend=vllm in server mode, a thread that drives the
vLLM server. The trainer pushes version v to the worker when v is a multiple of N, then sends it every
batch b with w(b) <= v; it waits for batch b before step b. So the worker samples batch b + K while
step b updates; a slow worker blocks the trainer (it never trains on a batch more than K versions old:
nothing is dropped, `async/dropped_groups` stays 0); and the schedule does not depend on timing, so an
async run is reproducible, resumes exactly and survives a worker restart with the same numbers (a
server: as far as the engine is, one seed per batch). K = 0 samples every batch with the current weights
(w(b) = b): no overlap, the synchronous run's draws (the worker starts from the trainer's RNG state),
on the trainer's thread count unless worker_threads is set (`core_share`), so the synchronous run's
numbers at any thread count.
N <= K overlaps every step; N = K + 1 makes every N-th batch wait for the newest weights.
rollout.async.max_staleness=none (the default) runs no worker at all.

The gap between the sampling weights and the trainer's is corrected in the update with the sampling
log-probs (`Rollout.sampling_logprobs`, `policy_lag` > 0): truncated or masked importance sampling,
loss.tis_level / tis_mode / tis_cap / tis_min, formulas in grpokit.core.loss.

A checkpoint holds the batches sampled but not yet trained on (async_rollouts.pt: their tensors, versions
and prompt-stream cursors) and the worker's RNG state after the last of them; before writing it the
trainer waits for every batch already sent, since those need weights older than the checkpoint's.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import queue
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.multiprocessing as tmp

from grpokit.rollout.async_worker import ThreadWorker, WorkerSpec, rollout_fields, rollout_from, worker_main
from grpokit.rollout.groups import Rollout, eos_token_ids
from grpokit.rollout.vllm_engine import policy_weights
from grpokit.train.data import PromptStream

log = logging.getLogger("grpokit")

STATE_FILE = "async_rollouts.pt"
DELAY_ENV = "GRPOKIT_TEST_ASYNC_WORKER_DELAY"   # tests only: seconds the worker sleeps before each batch


class AsyncWorkerError(Exception):
    """The rollout worker failed or died too often: one line saying what happened and how to go on (not
    a RuntimeError: a checkpoint save that finds the worker dead must not report it as a write failure)."""


@dataclass
class Pending:
    """A batch sent to the worker and not yet trained on."""

    batch: int
    version: int               # the policy version that samples it
    cursor: int                # the prompt stream's cursor before its prompts
    examples: list
    rollout: Rollout | None = None
    seconds: float = 0.0       # the worker's sampling time


class AsyncRollouts:
    """The trainer's side of the worker: what to send when, waiting, restarts, checkpoint state."""

    def __init__(self, cfg) -> None:
        r = cfg.rollout
        self.cfg, self.K, self.N = cfg, r.async_max_staleness, r.async_weight_sync_steps
        self.B = r.prompts_per_step
        self.server = r.backend == "vllm"   # vllm_mode=server (validated): the worker drives the server
        self.eos_ids: list[int] = []
        self.pending: dict[int, Pending] = {}
        self.next_batch = 0          # the next batch to send
        self.rng: torch.Tensor | None = None   # the worker's RNG after the last batch it delivered
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}   # pushed weights still needed
        self.proc = self.commands = self.results = None
        self.model = self.tokenizer = None
        self.held = -1               # the version the worker holds (as sent; -1: none yet)
        self.restarts = 0
        self.last_heard = 0.0
        self.started = False         # the current worker process said "ready"
        self._cores: contextlib.ExitStack | None = None
        self.worker_cpus: list[int] = []
        self.worker_threads = 1

    def version_for(self, batch: int) -> int:
        """w(b): the policy version that samples batch b (module docstring)."""
        return self.N * math.ceil(max(0, batch - self.K) / self.N)

    # ---- the step's side --------------------------------------------------------------------------
    def next(self, state) -> tuple[Rollout, list, dict[str, float]]:
        """Batch `state.step`, sampled by the worker: (rollout, its examples, async/* metrics)."""
        v = state.step
        if self.proc is None:
            self._start(state)
        elif v % self.N == 0 and v > max(self.snapshots, default=-1):
            self.snapshots[v] = self._snapshot(state.model)
        self._send_due(state, v)
        start = time.perf_counter()
        item = self._wait_for(v)
        waited = time.perf_counter() - start
        lag = v - item.version
        if not 0 <= lag <= self.K:   # the schedule makes this impossible; never train on it silently
            raise AsyncWorkerError(f"batch {v} was sampled by policy version {item.version}, {lag} versions "
                                   f"from the trainer's (rollout.async.max_staleness={self.K})")
        del self.pending[v]
        self._forget_old_weights()
        ready = sum(p.rollout is not None for p in self.pending.values())
        return dataclasses.replace(item.rollout, policy_lag=lag), item.examples, {
            "async/policy_lag": float(lag), "async/wait_s": waited, "async/worker_generate_s": item.seconds,
            "async/queued_batches": float(ready), "async/dropped_groups": 0.0,
            "async/worker_restarts": float(self.restarts)}

    def _send_due(self, state, v: int) -> None:
        """Take the prompts of every batch version v may sample, and send them (pushing weights first)."""
        while self.version_for(self.next_batch) <= v:   # up to K past the last step: a longer resume is exact
            b, cursor = self.next_batch, state.stream.cursor
            self.pending[b] = Pending(b, self.version_for(b), cursor, state.stream.take(self.B))
            self.next_batch += 1
            self._send(b)

    def _send(self, b: int) -> None:
        item = self.pending[b]
        if not any(p.rollout is None for k, p in self.pending.items() if k < b):
            self.last_heard = time.monotonic()   # an idle worker gets work: its clock starts now
        if item.version != self.held:
            self.commands.put(("weights", item.version, self.snapshots[item.version]))
            self.held = item.version
        self.commands.put(("sample", b, item.version, [ex.prompt for ex in item.examples]))

    def _wait_for(self, b: int) -> Pending:
        item, stale_after = self.pending[b], self.cfg.rollout.async_heartbeat_stale_after_s
        while item.rollout is None:
            try:
                msg = self.results.get(timeout=0.5)
            except (ConnectionError, EOFError, OSError):   # a worker that died while sending
                self.proc.join(timeout=5)
                if self.proc.is_alive():
                    raise
                self._restart(f"exited with code {self.proc.exitcode} while sending")
                continue
            except queue.Empty:
                if not self.proc.is_alive() and not self.started:
                    raise AsyncWorkerError(
                        f"the rollout worker process could not start (exit code {self.proc.exitcode}; its "
                        "error is printed above): a script that trains with rollout.async must guard its "
                        "entry point with `if __name__ == \"__main__\":` (the worker is started with "
                        "Python's spawn method, which imports the script again)")
                if not self.proc.is_alive():
                    self._restart(f"exited with code {self.proc.exitcode}")
                elif time.monotonic() - self.last_heard > stale_after:
                    self._restart(f"sent nothing for {stale_after:g} s "
                                  "(rollout.async.heartbeat_stale_after_s)")
                continue
            self._receive(msg)
        return item

    def _receive(self, msg: tuple) -> None:
        if msg[0] == "ready":
            self.started = True
            return
        if msg[0] == "error":
            raise AsyncWorkerError(f"the rollout worker failed on batch {msg[1]}: {msg[2]}: fix the cause, "
                                   "then resume from the last checkpoint (--resume)")
        _, b, version, payload, rng_after, seconds = msg
        item = self.pending[b]
        item.rollout, item.seconds = rollout_from(payload), seconds
        if rng_after is not None:   # batches come in order; a server has no RNG here
            self.rng = torch.frombuffer(bytearray(rng_after), dtype=torch.uint8)
        self.last_heard = time.monotonic()

    def _forget_old_weights(self) -> None:
        """Keep the weights a batch not yet delivered needs, and the newest (later batches take it)."""
        keep = {p.version for p in self.pending.values() if p.rollout is None}
        keep.add(max(self.snapshots, default=-1))
        self.snapshots = {v: s for v, s in self.snapshots.items() if v in keep}

    # ---- the worker process -----------------------------------------------------------------------
    def _snapshot(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The weights a worker loads: the state dict as CPU tensors in shared memory (a process), or the
        policy's Hugging Face weights, LoRA merged (a vLLM server)."""
        if self.server:
            return {k: t.detach().to("cpu", copy=True) for k, t in policy_weights(model)}
        return {k: torch.empty_like(t, device="cpu").share_memory_().copy_(t.detach())
                for k, t in model.state_dict().items()}

    def _start(self, state) -> None:
        if state.dist.world_size > 1:
            raise AsyncWorkerError("rollout.async.max_staleness runs one trainer process in this version: "
                                   "launch without torchrun, or set rollout.async.max_staleness=none")
        if not self.server and next(state.model.parameters()).device.type != "cpu":
            raise AsyncWorkerError("rollout.async.max_staleness runs its worker on the CPU in this version: "
                                   "set model.device=cpu, or rollout.async.max_staleness=none")
        self.model, self.tokenizer = state.model, state.tokenizer
        if self.rng is None:   # a fresh run: the worker continues the trainer's own sampling stream
            self.rng = torch.get_rng_state()
        self.snapshots[state.step] = self._snapshot(state.model)
        self._cores = contextlib.ExitStack()
        if not self.server:   # a server has its own cores (or machine)
            self.worker_cpus, self.worker_threads = self._cores.enter_context(core_share(self.cfg))
        self.eos_ids = eos_token_ids(state.model, state.tokenizer)
        self._spawn()

    def _spawn(self) -> None:
        """A new worker drawing from `self.rng`. It holds no version yet: the first batch sent pushes the
        weights it needs (kept in `snapshots` while a batch not delivered needs them), whatever the
        trainer's weights are now (a restart inside a checkpoint save runs after the step's update)."""
        r, task = self.cfg.rollout, self.cfg.task
        kw = dict(group_size=r.num_generations, max_new_tokens=r.max_completion_length,
                  temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                  max_prompt_length=r.max_prompt_length, truncate_prompt=r.truncate_prompt, backend=r.backend,
                  generation_batch_size=r.generation_batch_size,
                  chat_template_kwargs=task.chat_template_kwargs)
        delay = float(os.environ.get(DELAY_ENV) or 0)
        if self.server:   # a thread drives the vLLM server
            spec = WorkerSpec(None, self.tokenizer, kw, None, -1, delay_s=delay, cfg=self.cfg,
                              server_url=r.vllm_server_base_url, eos_ids=self.eos_ids)
            self.commands, self.results = queue.Queue(), queue.Queue()
            self.proc = ThreadWorker(spec, self.commands, self.results)
        else:
            spec = WorkerSpec(copy.deepcopy(self.model), self.tokenizer, kw, self.rng.clone(), -1,
                              threads=self.worker_threads, cpus=self.worker_cpus, delay_s=delay)
            ctx = tmp.get_context("spawn")
            self.commands, self.results = ctx.Queue(), ctx.Queue()
            self.proc = ctx.Process(target=worker_main, args=(spec, self.commands, self.results),
                                    daemon=True, name="grpokit-rollout-worker")
        try:
            self.proc.start()
        except (TypeError, AttributeError, RuntimeError) as e:   # pickling the model or tokenizer
            raise AsyncWorkerError(f"rollout.async: the policy cannot be sent to the worker process "
                                   f"({str(e).splitlines()[0]}): use a picklable model, or set "
                                   "rollout.async.max_staleness=none") from None
        self.held = -1   # a server too may hold any weights (its start folder, an earlier run)
        self.last_heard, self.started = time.monotonic(), False

    def _restart(self, why: str) -> None:
        """A dead or hung worker: a new one re-samples what was not delivered, with the same weights and
        RNG (the same numbers), or, past rollout.async.max_restarts, the run stops with one line."""
        self._stop_process()
        self.restarts += 1
        limit = self.cfg.rollout.async_max_restarts
        if self.restarts > limit:
            raise AsyncWorkerError(f"the rollout worker {why} after {limit} restarts "
                                   f"(rollout.async.max_restarts={limit}): the run stopped; resume from the "
                                   "last checkpoint (--resume)")
        log.warning("the rollout worker %s: restarting it (%d of %d); the batches it had not delivered are "
                    "sampled again with the same weights and RNG", why, self.restarts, limit)
        self._spawn()
        for b in sorted(k for k, p in self.pending.items() if p.rollout is None):
            self._send(b)

    def _stop_process(self) -> None:
        if self.proc is None:
            return
        if self.proc.is_alive():
            with contextlib.suppress(Exception):
                self.commands.put(("stop",))
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)
        for q in (self.commands, self.results):
            if hasattr(q, "cancel_join_thread"):   # a process's queues (a thread's need nothing)
                q.cancel_join_thread()
                q.close()
        self.proc = None

    def close(self) -> None:
        """Stop the worker and give the trainer its cores back (the run's end, or an error)."""
        self._stop_process()
        self.snapshots.clear()
        if self._cores is not None:
            self._cores.close()
            self._cores = None

    # ---- checkpoints --------------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """async_rollouts.pt: every batch sent but not trained on (waited for) and the worker's RNG."""
        for b in sorted(self.pending):
            self._wait_for(b)
        queued = [{"batch": p.batch, "version": p.version, "cursor": p.cursor, "seconds": p.seconds,
                   "rollout": rollout_fields(p.rollout)} for _, p in sorted(self.pending.items())]
        torch.save({"next_batch": self.next_batch, "rng": self.rng, "queued": queued}, folder / STATE_FILE)

    def load(self, folder: Path, stream: PromptStream) -> None:
        """Restore what `save` wrote; each batch's examples come back from its prompt-stream cursor."""
        blob = torch.load(folder / STATE_FILE, weights_only=True)
        self.next_batch, self.rng, self.pending = blob["next_batch"], blob["rng"], {}
        for q in blob["queued"]:
            examples = PromptStream(stream.examples, stream.seed, cursor=q["cursor"],
                                    shuffle=stream.shuffle).take(self.B)
            self.pending[q["batch"]] = Pending(q["batch"], q["version"], q["cursor"], examples,
                                               rollout_from(q["rollout"]), q["seconds"])




@contextlib.contextmanager
def core_share(cfg):
    """(the worker's cores, its threads): rollout.async.worker_threads cores (0: half) for the worker,
    the rest for the trainer, whose torch threads and core affinity are restored on exit.

    K = 0 with worker_threads=0: the trainer and the worker take turns (each batch waits for the newest
    weights), so nothing is split: the worker samples on the trainer's thread count, on every core, and
    its reductions are those of the synchronous run (the same numbers, bit for bit, at any thread count).
    """
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cfg.rollout.async_max_staleness == 0 and not cfg.rollout.async_worker_threads:
        yield [], torch.get_num_threads()
        return
    n = cfg.rollout.async_worker_threads or max(1, len(cores) // 2)
    if len(cores) <= n:   # one core, or the worker asked for all: both share them, nothing pinned
        yield [], n
        return
    threads = torch.get_num_threads()
    os.sched_setaffinity(0, cores[:-n])
    torch.set_num_threads(len(cores) - n)
    try:
        yield cores[-n:], n
    finally:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads)
