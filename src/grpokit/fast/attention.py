"""The training passes' attention on the CPU: a C forward and backward that skip the masked-out half.

In a GRPO forward pass every query attends its prompt and the completion tokens before it: a causal
mask, offset by the prompt (the completion pass runs on the prompt's cached keys). PyTorch's CPU flash
kernel computes every (query, key) pair of each 512-key block and masks afterwards, so about half of
its work is thrown away, forward and backward. `gk_attention_fwd` and `gk_attention_bwd`
(csrc/attention_train.c) stop each query at its last attended key; the backward recomputes the
probabilities from the forward's logsumexp, as flash attention does (the formulas are in the C file).

`kernel_attention(model)` routes transformers' "sdpa" attention through `attention_forward` inside
`grpokit.fast.accelerated`; anything the kernel does not cover (no mask, dropout, other devices or dtypes, a
query that attends nothing) goes to transformers' own function unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from grpokit.fast.native import DecodeKernels, float32_cpu, kernels


class KernelAttention(torch.autograd.Function):
    """out [B, L, H, hd] = softmax(q k^T * scale + mask) v, from q [B, H, L, hd], k, v [B, Hkv, S, hd] and a
    bool or uint8 mask [B, L, S] (nonzero: attend). Forward gk_attention_fwd, backward gk_attention_bwd."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                lib: DecodeKernels) -> torch.Tensor:
        B, H, L, hd = q.shape
        out = q.new_empty(B, L, H, hd)                                    # [B, L, H, hd]: HF's layout
        lse = q.new_empty(B, L, H)                                        # log sum_j e^(s_ij), for backward
        m8 = mask.to(torch.uint8).contiguous()                            # no copy when already uint8
        lib.attention_fwd(q, k, v, m8, scale=scale, out=out, lse=lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.m8, ctx.scale, ctx.lib = m8, scale, lib
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        B, H, L, hd = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        dq, dk, dv = q.new_empty(B, H, L, hd), k.new_empty(B, Hkv, S, hd), v.new_empty(B, Hkv, S, hd)
        ctx.lib.attention_bwd(q, k, v, ctx.m8, out, d_out.contiguous(), lse, scale=ctx.scale, dq=dq, dk=dk,
                              dv=dv)
        return dq, dk, dv, None, None, None


def _usable(lib, query, key, value, mask, dropout: float, kwargs: dict, attends: bool | None = None) -> bool:
    """Whether the kernel computes what transformers' sdpa function would for these arguments. attends:
    whether every query of `mask` attends some key, when already known."""
    if lib is None or dropout or mask is None or mask.dtype != torch.bool or any(
            kwargs.get(name) for name in ("softcap", "position_bias", "output_attentions", "sliding_window")):
        return False
    B, H, L, hd = query.shape
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1
               for t in (query, key, value)):
        return False
    if key.shape != value.shape or key.shape[0] != B or H % key.shape[1]:
        return False
    if key.stride(2) != hd or value.stride(2) != hd:                     # each key's hd floats are contiguous
        return False
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[0] != B \
            or tuple(mask.shape[2:]) != (L, key.shape[2]):
        return False
    return bool(mask.any(-1).all()) if attends is None else attends     # every query attends some key


@contextlib.contextmanager
def kernel_attention(model) -> Iterator[None]:
    """For the duration, the model's "sdpa" attention runs the C forward where it applies (float32 on the
    CPU with a boolean mask: every pass of `per_token_logprobs` with a cache); else nothing changes.
    The library is loaded by the first attention call (inside a pass), not on entry."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) != "sdpa" \
            or not float32_cpu(model):
        yield
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    had_local = "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping

    last: list[tuple] = []  # [(mask, every query attends, uint8 copy)]: each layer of a pass gets one mask

    def mask_facts(mask: torch.Tensor) -> tuple:
        if not last or last[0][0] is not mask:                           # a new pass: forget the last mask
            last[:] = [(mask, bool(mask.any(-1).all()), mask[:, 0].to(torch.uint8).contiguous())]
        return last[0]

    def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                          is_causal=None, **kwargs):
        facts = mask_facts(attention_mask) if isinstance(attention_mask, torch.Tensor) and \
            attention_mask.dtype == torch.bool and attention_mask.dim() == 4 else (None, None, None)
        lib = kernels()                                                   # None: no build, GRPOKIT_NATIVE=0
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
