"""The training passes' attention on the CPU: a C forward and backward that skip the masked-out half.

In a GRPO forward pass every query attends its prompt and the completion tokens before it: a causal
mask, offset by the prompt (the completion pass runs on the prompt's cached keys). PyTorch's CPU flash
kernel computes every (query, key) pair of each 512-key block and masks afterwards, so about half of
its work is thrown away, forward and backward. `gk_attention_fwd` and `gk_attention_bwd`
(csrc/attention_train.c) stop each query at its last attended key; the backward recomputes the
probabilities from the forward's logsumexp, as flash attention does (the formulas are in the C file).

`kernel_attention(model)` routes transformers' "sdpa" attention through `attention_forward` for the
duration of a pass; anything the kernel does not cover (no mask, dropout, other devices or dtypes, a
query that attends nothing) goes to transformers' own function unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

import torch

from .native import DecodeKernels, kernels_for


def _int64s(*values: int) -> ctypes.Array:
    return (ctypes.c_int64 * len(values))(*values)


class KernelAttention(torch.autograd.Function):
    """out [B, L, H, hd] = softmax(q k^T * scale + mask) v, from q [B, H, L, hd], k, v [B, Hkv, S, hd] and a
    bool or uint8 mask [B, L, S] (nonzero: attend). Forward gk_attention_fwd, backward gk_attention_bwd."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                lib: DecodeKernels) -> torch.Tensor:
        B, H, L, hd = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        out = q.new_empty(B, L, H, hd)                                    # [B, L, H, hd]: what transformers returns
        lse = q.new_empty(B, L, H)                                        # log sum_j e^(s_ij), for backward
        m8 = mask.to(torch.uint8).contiguous()                            # no copy when already uint8
        lib._attention_fwd(q.data_ptr(), _int64s(*q.stride()[:3]), k.data_ptr(), _int64s(*k.stride()[:2]),
                           v.data_ptr(), _int64s(*v.stride()[:2]), m8.data_ptr(), B, H, Hkv, L, S, hd, scale,
                           out.data_ptr(), lse.data_ptr())
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.m8, ctx.scale, ctx.lib = m8, scale, lib
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        B, H, L, hd = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        dq, dk, dv = q.new_empty(B, H, L, hd), k.new_empty(B, Hkv, S, hd), v.new_empty(B, Hkv, S, hd)
        d_out = d_out.contiguous()
        ctx.lib._attention_bwd(q.data_ptr(), _int64s(*q.stride()[:3]), k.data_ptr(), _int64s(*k.stride()[:2]),
                               v.data_ptr(), _int64s(*v.stride()[:2]), ctx.m8.data_ptr(), out.data_ptr(),
                               d_out.data_ptr(), lse.data_ptr(), B, H, Hkv, L, S, hd, ctx.scale, dq.data_ptr(),
                               dk.data_ptr(), dv.data_ptr())
        return dq, dk, dv, None, None, None


def _usable(lib, query, key, value, mask, dropout: float, kwargs: dict, attends: bool | None = None) -> bool:
    """Whether the kernel computes what transformers' sdpa function would for these arguments. attends:
    whether every query of `mask` attends some key, when already known."""
    if lib is None or dropout or mask is None or mask.dtype != torch.bool or any(
            kwargs.get(name) for name in ("softcap", "position_bias", "output_attentions", "sliding_window")):
        return False
    B, H, L, hd = query.shape
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1 for t in (query, key, value)):
        return False
    if key.shape != value.shape or key.shape[0] != B or H % key.shape[1]:
        return False
    if key.stride(2) != hd or value.stride(2) != hd:                     # each key's hd floats follow the last
        return False
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[0] != B or tuple(mask.shape[2:]) != (L, key.shape[2]):
        return False
    return bool(mask.any(-1).all()) if attends is None else attends     # every query attends some key


@contextlib.contextmanager
def kernel_attention(model) -> Iterator[None]:
    """For the duration, the model's "sdpa" attention runs the C forward where it applies (float32 on the
    CPU with a boolean mask: every pass of `per_token_logprobs` with a cache); else nothing changes."""
    lib = kernels_for(model) if getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa" \
        else None
    if lib is None:
        yield
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    had_local = "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping

    masks: dict[int, tuple] = {}  # id -> (mask, every query attends, uint8 copy): every layer gets the same mask

    def mask_facts(mask: torch.Tensor) -> tuple:
        facts = masks.get(id(mask))
        if facts is None or facts[0] is not mask:
            facts = masks[id(mask)] = (mask, bool(mask.any(-1).all()), mask[:, 0].to(torch.uint8).contiguous())
        return facts

    def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                          **kwargs):
        facts = mask_facts(attention_mask) if isinstance(attention_mask, torch.Tensor) and \
            attention_mask.dtype == torch.bool and attention_mask.dim() == 4 else (None, None, None)
        if not _usable(lib, query, key, value, attention_mask, dropout, kwargs, facts[1]):
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return KernelAttention.apply(query, key, value, facts[2], scale, lib), None

    ALL_ATTENTION_FUNCTIONS["sdpa"] = attention_forward
    try:
        yield
    finally:
        if had_local:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = original
        else:
            del ALL_ATTENTION_FUNCTIONS["sdpa"]
