"""The one switch for grpokit's optional CPU speed-ups: `with fast.accelerated(model, cfg):`.

Every speed-up sits beside the readable path, never inside it. Outside this context the training step
is plain PyTorch: `per_token_logprobs` as model/logprobs.py writes it, the sampler's PyTorch decoder, no
activation record. Inside it, where they apply (the C kernels: float32 on the CPU, built):

    speed-up                                  where             pays (step with it off / on)
    fused decode steps, the token draw in C   native, sampler   1.25x demo, 1.63x tiny, 1.09x small
    the whole decode step in one C call       whole_step        1.07x demo, 1.18x tiny (not used on small)
    the update reuses the sampled projections reuse             1.12x small (auto: models >= 5M, fp32)
    SiLU x up and RMSNorm in one C pass       fused_ops         0.91-1.05x in time; kept for memory: the
                                                                bench's small/256 peak 2732 vs 3517 MiB
    bf16 autocast: down(silu(g) * u) keeps    fused_ops         kept for memory, bit-identical: SmolLM2
    g and u only (`SiluMulDown`)                                bf16 peak RSS 3882 -> 3818 MiB with the
                                                                head's sliced gradient add (master_grads)
    glibc keeps freed memory                  native            1.32x tiny, 0.98x demo, 1.02x small
    grouped K/V with a mask in SDPA           small_attention   0.97-1.02x; kept for memory: no
                                                                repeat_kv copies saved for backward
    short training passes' attention as two   small_attention   1.08x SmolLM2 bf16 (7.41 vs 8.00 s a
    matmuls instead of SDPA's flash kernel                      step; its flash backward ~5x its forward)
    the embedding's and bf16 head's gradients master_grads      1.05x SmolLM2 bf16 (14.85 vs 15.66 s a
    added into the float32 .grad in place                       step, 2026-12-03); fp32 0.98x: mixed
                                                                precision and one process only

Measured by benchmarks/fast_gains.py (2026-12-02, 2 threads, fp32; demo = `grpokit train`'s built-in
demo, tiny / small = `grpokit bench --size S --completion-length 64 --fixed-length`; SmolLM2 = its
`smollm2` config: bf16, micro-batches of 8, 6 interleaved steps); the memory by
`grpokit bench --size small --completion-length 256 --fixed-length --steps 3` (auto = bf16, where the
fused RMSNorm runs on the fp32 residual stream). In bf16 the decode kernels, the whole step and reuse
do not run. The training passes' C attention (forward and backward) was removed that day: it paid
1.01-1.04x; torch.compile of the fused ops' two ops paid 0.93-1.06x with 2-5 s of warm-up and was not
adopted (docs/performance.md, "What each speed-up pays").

Each is restored on exit. One setting is process-wide and so not the library's to make: glibc keeping freed
memory (`native.keep_freed_memory`) is set by the `grpokit` command for its own process (`for_this_process`),
never by `train_grpo` or this switch. The results equal the plain
path to float32 rounding (tests/fast/test_fast_step.py runs a whole train_step both ways).

The activation record (grpokit.fast.reuse) lives in the scope, not in the `Rollout`: the sampler starts one
when the scope asks for it (`recording_policy`, decided once at entry), hands it back when decoding
ends, and `update_plan` decides once per step whether the update reuses it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from grpokit.fast import fused_ops, master_grads, native, reuse, small_attention, whole_step
from grpokit.model.logprobs import checkpointing_enabled
from grpokit.model.precision import compute_dtype

reused_logprobs = reuse.reused_logprobs   # the update's forward on a record (update.rows_logprobs)


@dataclass
class Scope:
    """One `accelerated` context: whether kernels are on, what the sampler records, the record held."""

    on: bool
    model_id: int = -1
    recording: bool | Callable = False            # False, True, or lengths [N] -> bool (`recording_policy`)
    record: reuse.ActivationRecord | None = None  # the sampler's record of this scope's batch
    started: int = 0                              # records started (a second one: the batch was split)
    plan: tuple | None = None                     # (rollout, update_plan result): decided once per batch


_PLAIN = Scope(on=False)
_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("grpokit_fast", default=None)


def active() -> Scope:
    """The current scope (a plain one outside any `accelerated` context)."""
    return _SCOPE.get() or _PLAIN


@contextlib.contextmanager
def accelerated(model: torch.nn.Module, cfg=None, *, world_size: int = 1, enabled: bool = True,
                record: bool | Callable | None = None, timer=None) -> Iterator[Scope]:
    """Every optional CPU speed-up on for the passes inside (see the module docstring); restored on exit.

    Args:
        model: the policy; its fused ops are swapped in, its sampling may be recorded.
        cfg: the run's GRPOConfig: what to record for reuse (`reuse.recording_policy`); None: no record.
        world_size: processes training together (a record is only reused with one).
        enabled: False runs the plain path (as does `plain()`).
        record: overrides cfg's recording policy (tests, bench): False, True, or lengths -> bool.
        timer: a `grpokit.observe.metrics.PhaseTimer`; the swaps in and out are timed as its "accelerate"
            phase.

    A context entered inside another one changes nothing (the outer one decides).
    """
    if _SCOPE.get() is not None:
        yield active()
        return
    if not enabled:
        with plain() as scope:
            yield scope
        return
    timed = (lambda: timer("accelerate")) if timer is not None else contextlib.nullcontext
    stack = contextlib.ExitStack()
    with timed():
        policy = record if record is not None else (
            reuse.recording_policy(cfg, world_size, model) if cfg is not None else False)
        scope = Scope(on=True, model_id=id(model), recording=policy)
        if not checkpointing_enabled(model):  # a checkpointed recompute would run the class's forward later
            stack.enter_context(fused_ops.fused_ops(model))
        stack.enter_context(small_attention.installed(model))   # with grouped K/V under a mask on the CPU
        if world_size == 1 and compute_dtype(model) is not None:   # pays in mixed precision (not fp32);
            stack.enter_context(master_grads.installed(model))       # DDP / FSDP reduce grads before it adds
        token = _SCOPE.set(scope)
        stack.callback(_SCOPE.reset, token)
    try:
        yield scope
    finally:
        with timed():
            stack.close()


def for_this_process() -> None:
    """The process-wide speed-up, for a process grpokit owns (the `grpokit` command calls it at start):
    glibc keeps freed memory for the next pass (`native.keep_freed_memory`; GRPOKIT_KEEP_MEMORY=0: off)."""
    native.keep_freed_memory()


@contextlib.contextmanager
def plain() -> Iterator[Scope]:
    """The plain PyTorch path for everything inside, even where an `accelerated` context is entered."""
    token = _SCOPE.set(_PLAIN)
    try:
        yield _PLAIN
    finally:
        _SCOPE.reset(token)


def kernels_for(model) -> native.DecodeKernels | None:
    """The C kernels for this model inside an `accelerated` context (float32 on the CPU), else None."""
    return native.kernels_for(model) if active().on else None


def whole_step_for(decoder, rows: int) -> whole_step.WholeStep | None:
    """The lean decoder's whole decode step as one C call where it applies (`WholeStep.plan`), else None."""
    return whole_step.WholeStep.plan(decoder, rows) if active().on else None


def start_record(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                 max_new_tokens: int, dims: dict[str, int], n_layers: int) -> reuse.ActivationRecord | None:
    """A new `ActivationRecord` for the sampler to fill, when this scope records `model`'s batch; else None.
    A second sampling call in one scope (a batch decoded in pieces) drops the record: it covers part only."""
    scope = active()
    if not scope.on or not scope.recording or id(model) != scope.model_id:
        return None
    scope.started += 1
    if scope.started > 1:
        scope.record = None
        return None
    rec = reuse.ActivationRecord(model, prompt_ids, prompt_mask, group_size, max_new_tokens, dims, n_layers)
    rec.pays = None if scope.recording is True else scope.recording
    return rec


def hold_record(record: reuse.ActivationRecord) -> None:
    """The sampler's finished record, kept by the scope until the update takes it (`update_plan`)."""
    scope = active()
    if scope.on and scope.started == 1:
        scope.record = record


def held_record() -> reuse.ActivationRecord | None:
    """The record this scope holds (None: none recorded, dropped, or already taken by the update)."""
    return active().record


def decide_reuse(state, rollout) -> bool:
    """Decide now (once per batch) whether the update reuses the record; a record that will not be used
    is freed at once, before the reference and old-policy passes. True when it will be reused."""
    return _plan(state, rollout)[1] is not None


def update_plan(state, rollout) -> tuple[list[torch.Tensor], reuse.ActivationRecord | None, bool]:
    """(micro-batches, the record to reuse or None, whether that use is its last) for the update of
    `rollout` (`reuse.update_plan`); the record is handed over once. Outside a scope: the plain plan."""
    groups, record, last = _plan(state, rollout)
    scope = active()
    if scope.on:
        scope.record = None
        scope.plan = (rollout, (groups, None, False))   # handed over: a second ask gets the plain plan
    return groups, record, last


def _plan(state, rollout) -> tuple:
    scope = active()
    if scope.plan is not None and scope.plan[0] is rollout:
        return scope.plan[1]
    plan = reuse.update_plan(state, rollout, scope.record if scope.on else None)
    if scope.on:
        scope.plan = (rollout, plan)
        if plan[1] is None:
            scope.record = None                          # it would not pay for these lengths: free it now
    return plan
