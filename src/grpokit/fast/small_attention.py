"""Attention as two explicit matmuls in the training passes, where the score matrix is small.

torch's CPU SDPA kernel (flash attention, blocked) is made for long sequences. Under autograd on short
GRPO passes, its backward costs several times its forward: a SmolLM2 completion pass of 8 rows x 63
queries over 73 keys (9 query / 3 key-value heads) takes ~8 ms a layer backward in bf16 against ~1.6 ms
forward. For such sizes the textbook form is cheaper both ways:

    S = Q K^T * scale (float32)   P = softmax(S + mask)   O = P V      Q [B, Hk, g*Tq, D], K, V [B, Hk, Tk, D]

with the g query heads of each key/value head stacked as rows (no repeat_kv copies). Autograd saves S's
softmax (float32) and P in the compute dtype: 6 bytes a score, so it runs only when
B x heads x Tq x Tk <= MAX_SCORES (6 MiB a layer); longer passes (GSM8K's 500-token prompts) keep SDPA.
No-grad passes (sampling, the reference) keep SDPA too: its forward is as fast and saves nothing.
`installed()` swaps it in for transformers' "sdpa" attention for the duration (`grpokit.fast.accelerated`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

MAX_SCORES = 2**20        # B x query heads x Tq x Tk of one layer's scores
_UNSUPPORTED = ("softcap", "position_bias", "s_aux", "sinks", "sliding_window")


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
              scale: float) -> torch.Tensor:
    """softmax(Q K^T scale + mask) V with grouped heads. query [B, Hq, Tq, D], key/value [B, Hk, Tk, D],
    mask bool [B or 1, 1, Tq, Tk] (True: attend) or None. Returns [B, Hq, Tq, D] in value's dtype."""
    B, Hq, Tq, D = query.shape
    Hk, Tk = key.shape[1], key.shape[2]
    g = Hq // Hk
    scores = (query.reshape(B, Hk, g * Tq, D) @ key.transpose(-1, -2)).float()   # [B, Hk, g*Tq, Tk]
    scores = scores.mul_(scale).view(B, Hk, g, Tq, Tk)
    if mask is not None:   # a fully masked row (a pad query) gets a uniform row, not NaN: never read
        scores = scores.masked_fill(~mask[:, :, None], torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(B, Hk, g * Tq, Tk)
    return (probs @ value).view(B, Hq, Tq, D)


def _applies(query, key, value, mask, dropout: float, kwargs: dict) -> bool:
    if not (torch.is_grad_enabled() and query.requires_grad) or query.device.type != "cpu" or dropout:
        return False
    if any(kwargs.get(name) is not None for name in _UNSUPPORTED) or kwargs.get("output_attentions"):
        return False
    B, Hq, Tq, _ = query.shape
    Hk, Tk = key.shape[1], key.shape[2]
    if Hq % Hk or value.shape[1] != Hk or B * Hq * Tq * Tk > MAX_SCORES:
        return False
    if mask is None:
        return Tq == Tk or Tq == 1        # plain causal, or one query over everything before it
    return mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1 and \
        mask.shape[0] in (1, B) and tuple(mask.shape[2:]) == (Tq, Tk)


def _wrap(sdpa):
    def small_or_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None, **kwargs):
        if not _applies(query, key, value, attention_mask, dropout, kwargs):
            return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, **kwargs)
        Tq, Tk = query.shape[2], key.shape[2]
        mask = attention_mask
        if mask is None and Tq == Tk and Tq > 1 and (is_causal if is_causal is not None
                                                      else getattr(module, "is_causal", True)):
            mask = torch.ones(Tq, Tk, dtype=torch.bool, device=query.device).tril()[None, None]
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = attention(query, key, value, mask, scale)                  # [B, Hq, Tq, D]
        return out.transpose(1, 2).contiguous(), None                    # as transformers' sdpa returns
    small_or_sdpa.grpokit_small_attention = True
    return small_or_sdpa


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """transformers' "sdpa" attention runs `attention` where it applies, for the duration."""
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:
        yield
        return
    current = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if getattr(current, "grpokit_small_attention", False):
        yield
        return
    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    before = local.get("sdpa")
    ALL_ATTENTION_FUNCTIONS["sdpa"] = _wrap(current)
    try:
        yield
    finally:
        if before is None:
            local.pop("sdpa", None)
        else:
            local["sdpa"] = before
