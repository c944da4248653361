"""Gradients of the two [V, H] matrices added straight into the master weight's `.grad`, in place.

The token embedding and the lm-head (one tensor when tied, as in SmolLM2: V = 49,152, H = 576, 113 MB
in float32) are the largest weights of a small LM, and autograd moves their gradients in whole tensors
on every micro-batch:

- embedding: its backward zero-fills a dense [V, H] gradient for each lookup (two per micro-batch in
  `shared_prompts.shared_prompt_hidden`: the prompt pass and the completion pass), index-adds a few hundred
  rows into it, and the engine adds the whole tensor into `.grad`. torch.profiler on one SmolLM2 bf16
  step (micro-batches of 8): 8 `fill_` calls of ~200 ms.
- lm-head in bf16 mixed precision (`logprobs.head_logprobs`): the float32 weight is cast to bf16 per
  micro-batch, and in backward the bf16 gradient is cast to a new float32 [V, H] tensor, then added.

Here the lookup reads a detached weight; its output is a leaf, and a hook on it index-adds the incoming
rows into `weight.grad`. The head's bf16 copy is made once per weight version (a new one after each
optimizer step) as a leaf; after each backward its bf16 gradient is added into the float32 `.grad`
(mixed-dtype `add_`s of `ADD_ROWS` rows) and dropped. Each addition commutes with autograd's own
accumulation, so the result is the same sum in another order: equal to autograd's to float rounding.
The same treatment of every linear layer's weight (autocast's casts) was measured and paid nothing
(1.04x for all three against 1.05x for these two, `benchmarks/fast_gains.py`, 2026-12-03): their
gradients are small enough to stay in cache.

One process only: DistributedDataParallel and FSDP reduce a gradient when autograd accumulates it,
before these hooks would add to it (`grpokit.switch.accelerated` installs this at world size 1, in mixed
precision only: in fp32 it measured 0.98x, within that day's noise). Plain
`nn.Embedding`s whose weight trains (no max_norm, scale_grad_by_freq or sparse) and plain Parameter
heads only; anything else keeps autograd's path.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch


def lookup(module: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """module(ids) [*, H]; under autograd its weight's gradient arrives as rows (`add_rows`)."""
    weight = module.weight
    out = torch.nn.functional.embedding(ids, weight.detach(), module.padding_idx)
    if not (torch.is_grad_enabled() and weight.requires_grad):
        return out
    out.requires_grad_()
    out.register_hook(functools.partial(add_rows, weight, ids, module.padding_idx))
    return out


def add_rows(weight: torch.Tensor, ids: torch.Tensor, padding_idx: int | None, grad: torch.Tensor) -> None:
    """weight.grad[ids[i]] += grad[i] for every looked-up position i (a padding_idx row gets nothing)."""
    ids, grad = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])         # [N], [N, H]
    if padding_idx is not None:
        keep = ids != padding_idx
        ids, grad = ids[keep], grad[keep]
    with torch.no_grad():
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        sum_rows_into(weight.grad, ids, grad.to(weight.grad.dtype), sorted_sum=weight.device.type == "cuda")


def sum_rows_into(dst: torch.Tensor, ids: torch.Tensor, src: torch.Tensor, *, sorted_sum: bool) -> None:
    """dst[ids[i]] += src[i] (dst [V, H], ids [N], src [N, H]), in an order that repeats run after run.

    CPU: `index_add_` adds the rows one after another. CUDA: `index_add_` adds with atomics in whatever order
    the threads arrive (a repeated token's rows sum differently each run; PyTorch lists it among the ops
    `use_deterministic_algorithms` must fix), so `sorted_sum` takes `index_put_(accumulate=True)`, whose
    CUDA kernel sorts the ids and sums each id's rows in one thread: what index_add_ itself does under
    PyTorch's deterministic mode, without switching that process-wide flag from inside a backward hook."""
    if sorted_sum:
        dst.index_put_((ids,), src, accumulate=True)
    else:
        dst.index_add_(0, ids, src)


class HeadCasts:
    """The head's cast for the duration of `installed` (the switch's scope answers
    `Speedups.cast_head` with it): one cast leaf per (weight, version, dtype)."""

    def __init__(self) -> None:
        self.casts: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}

    def __call__(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if weight.dtype == dtype or type(weight) is not torch.nn.Parameter or not weight.requires_grad \
                or not torch.is_grad_enabled():   # no-grad / inference-mode passes: a plain cast, not kept
            return weight.to(dtype)
        held = self.casts.get(id(weight))
        if held is not None and held[0] is weight and held[1] == weight._version and held[2].dtype == dtype:
            return held[2]
        cast = weight.detach().to(dtype).requires_grad_()
        cast.register_post_accumulate_grad_hook(functools.partial(_into_master, weight))
        self.casts[id(weight)] = (weight, weight._version, cast)
        return cast


# Rows per mixed-dtype add into the master gradient: a whole [V, H] `add_` of bf16 into float32 first
# converts all of it to a float32 temporary (108 MiB for SmolLM2's head, at the update's peak RSS);
# 4096-row slices keep that to ~9 MiB and ran faster (0.024 against 0.059 s, 2026-12-03).
ADD_ROWS = 4096


def _into_master(master: torch.Tensor, cast: torch.Tensor) -> None:
    """master.grad += cast.grad (mixed-dtype adds in place, `ADD_ROWS` rows at a time), then the cast's
    gradient is dropped."""
    with torch.no_grad():
        if master.grad is None:
            master.grad = torch.zeros_like(master)
        for part, add in zip(master.grad.split(ADD_ROWS), cast.grad.split(ADD_ROWS)):
            part.add_(add)
    cast.grad = None


def _swappable(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.Embedding and module.weight.requires_grad and module.max_norm is None \
        and not module.scale_grad_by_freq and not module.sparse and type(module.weight) is torch.nn.Parameter


@contextlib.contextmanager
def installed(model: torch.nn.Module) -> Iterator[HeadCasts]:
    """For the duration: the model's trainable plain embeddings look up with `lookup` (restored on exit).
    Yields the `HeadCasts` the lm-head's compute-dtype copy should come from, for the switch to hand to
    the passes inside (`grpokit.model.speedups.Speedups.cast_head`); nothing outside the call sees it."""
    swapped = [m for m in model.modules() if _swappable(m)]
    for m in swapped:
        m.forward = functools.partial(lookup, m)
    ours = [(m, vars(m)["forward"]) for m in swapped]
    try:
        yield HeadCasts()
    finally:
        for m, forward in ours:   # only ours: code inside the scope may have put the class's own back
            if vars(m).get("forward") is forward:
                del m.forward
