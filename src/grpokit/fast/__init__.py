"""grpokit's optional CPU speed-ups, switched on by the one switch: `with switch.accelerated(model, cfg):`.

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
memory (`native.keep_freed_memory`) is set by the `grpokit` command for its own process
(`switch.for_this_process`), never by `train_grpo` or the switch. The results equal the plain
path to float32 rounding (tests/fast/test_fast_step.py runs a whole train_step both ways).

Only `grpokit.switch` imports this package. The readable path asks `grpokit.model.speedups.active()`,
which inside the switch is this package's `Scope`: its answers bring the kernels, the activation record
and the head's casts, each to the call that asked. The activation record (grpokit.fast.reuse) lives in
the scope, not in the `Rollout`: the sampler starts one when the scope asks for it (`recording_policy`,
decided once at entry), hands it back when decoding ends, and `update_plan` decides once per step
whether the update reuses it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpokit.fast import fused_ops, master_grads, native, reuse, small_attention, whole_step
from grpokit.model.speedups import Speedups

__all__ = ["Scope", "fused_ops", "master_grads", "native", "reuse", "small_attention", "whole_step"]


class Scope(Speedups):
    """One `switch.accelerated` call's answers to `Speedups`: the kernels, the record it holds, the plan.

    Args:
        model: the policy (only its sampling is recorded).
        recording: False, True, or lengths [N] -> bool (`reuse.recording_policy`).
        head_casts: the lm-head's cast leaves (`master_grads.HeadCasts`), or None: autograd's cast.
        buffers: the record's reusable gate/up buffers, a dict the caller may keep between calls.
    """

    on = True

    def __init__(self, model: torch.nn.Module, recording: bool | Callable = False,
                 head_casts: master_grads.HeadCasts | None = None, buffers: dict | None = None) -> None:
        self.model_id = id(model)
        self.recording = recording
        self.head_casts = head_casts
        self.buffers = {} if buffers is None else buffers
        self.record: reuse.ActivationRecord | None = None   # the sampler's record of this scope's batch
        self.started = 0                                     # records started (2: the batch was split)
        self.plan: tuple | None = None                       # (rollout, update plan): decided once per batch

    def decode_kernels(self, model) -> native.DecodeKernels | None:
        """The C kernels for this model (float32 on the CPU), else None."""
        return native.kernels_for(model)

    def whole_step(self, decoder, rows: int) -> whole_step.WholeStep | None:
        """The lean decoder's whole decode step as one C call where it applies (`WholeStep.plan`); None."""
        return whole_step.WholeStep.plan(decoder, rows)

    def start_record(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                     max_new_tokens: int, dims: dict[str, int], n_layers: int
                     ) -> reuse.ActivationRecord | None:
        """A new `ActivationRecord` when this scope records `model`'s batch, else None. A second sampling
        call in one scope (a batch decoded in pieces) drops the record: it covers part only."""
        if not self.recording or id(model) != self.model_id:
            return None
        self.started += 1
        if self.started > 1:
            self.record = None
            return None
        rec = reuse.ActivationRecord(model, prompt_ids, prompt_mask, group_size, max_new_tokens, dims,
                                     n_layers, pool=self.buffers)
        rec.pays = None if self.recording is True else self.recording
        return rec

    def hold_record(self, record: reuse.ActivationRecord) -> None:
        if self.started == 1:
            self.record = record

    def held_record(self) -> reuse.ActivationRecord | None:
        return self.record

    def decide_reuse(self, state, rollout, plain_plan: Callable) -> bool:
        return self._plan(state, rollout, plain_plan)[1] is not None

    def update_plan(self, state, rollout, plain_plan: Callable) -> tuple[list[torch.Tensor],
                                                                        reuse.ActivationRecord | None, bool]:
        """`reuse.update_plan` for `rollout`, decided once; the record is handed over once (a second ask
        gets the plain plan)."""
        groups, record, last = self._plan(state, rollout, plain_plan)
        self.record = None
        self.plan = (rollout, (groups, None, False))
        return groups, record, last

    def _plan(self, state, rollout, plain_plan: Callable) -> tuple:
        if self.plan is not None and self.plan[0] is rollout:
            return self.plan[1]
        plan = reuse.update_plan(state, rollout, plain_plan(state, rollout), self.record)
        self.plan = (rollout, plan)
        if plan[1] is None:
            self.record = None                          # it would not pay for these lengths: free it now
        return plan

    def cast_head(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.head_casts(weight, dtype) if self.head_casts is not None else weight.to(dtype)
