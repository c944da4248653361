"""The one switch for grpokit's optional CPU speed-ups: `with switch.accelerated(model, cfg) as scope:`.

This is the only module outside grpokit.fast that imports it (tests/test_imports.py keeps it so). The
readable path (the sampler, the update, the lm-head's log-probs) asks `grpokit.model.speedups.active()`;
inside this switch that is a `grpokit.fast.Scope`, handed the objects it needs at entry, and outside
it the plain answers. What the switch changes for its duration, and restores on exit even when the block
raises:

    the policy's MLP and RMSNorm forwards    fused_ops.fused_ops      (instance attributes, deleted after)
    its configs' attention implementation     small_attention.installed (set back to "sdpa" after)
    its trainable embeddings' forwards        master_grads.installed   (mixed precision, one process)
    the scope answering `speedups.active()`   speedups.scoped          (a context variable, reset after)

No environment variable, no module attribute, no transformers registry entry but grpokit's own (added once
under its own name) is written. What each speed-up pays is in grpokit/fast/__init__.py's table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from grpokit import fast
from grpokit.fast import fused_ops, master_grads, native, reuse, small_attention
from grpokit.model import speedups
from grpokit.model.precision import compute_dtype
from grpokit.model.shared_prompts import checkpointing_enabled


@contextlib.contextmanager
def accelerated(model: torch.nn.Module, cfg=None, *, world_size: int = 1, enabled: bool = True,
                record: bool | Callable | None = None, timer=None,
                buffers: dict | None = None) -> Iterator[speedups.Speedups]:
    """Every optional CPU speed-up on for the passes inside (see the module docstring); restored on exit.

    Args:
        model: the policy; its fused ops are swapped in, its sampling may be recorded.
        cfg: the run's GRPOConfig: what to record for reuse (`reuse.recording_policy`); None: no record.
        world_size: processes training together (a record is only reused with one).
        enabled: False runs the plain path (as does `plain()`).
        record: overrides cfg's recording policy (tests, bench): False, True, or lengths -> bool.
        timer: a `grpokit.observe.metrics.PhaseTimer`; the swaps in and out are timed as its "accelerate"
            phase.
        buffers: a dict the caller keeps between calls for the activation record's reusable buffers (the
            train state's); None: a fresh one for this call.

    Yields the scope in force (`grpokit.model.speedups.Speedups`). A switch entered inside another one
    changes nothing (the outer one decides).
    """
    if speedups.entered():
        yield speedups.active()
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
        if not checkpointing_enabled(model):  # a checkpointed recompute would run the class's forward later
            stack.enter_context(fused_ops.fused_ops(model))
        stack.enter_context(small_attention.installed(model))   # with grouped K/V under a mask on the CPU
        casts = None
        if world_size == 1 and compute_dtype(model) is not None:   # pays in mixed precision (not fp32);
            casts = stack.enter_context(master_grads.installed(model))   # DDP / FSDP reduce grads first
        scope = stack.enter_context(speedups.scoped(fast.Scope(model, policy, casts, buffers)))
    try:
        yield scope
    finally:
        with timed():
            stack.close()


@contextlib.contextmanager
def plain() -> Iterator[speedups.Speedups]:
    """The plain PyTorch path for everything inside, even where an `accelerated` switch is entered."""
    with speedups.scoped(speedups.PLAIN) as scope:
        yield scope


def for_this_process() -> None:
    """The process-wide speed-up, for a process grpokit owns (the `grpokit` command calls it at start):
    glibc keeps freed memory for the next pass (`native.keep_freed_memory`; GRPOKIT_KEEP_MEMORY=0: off)."""
    native.keep_freed_memory()
