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
`installed(model)` runs it for that model's attention for the duration (`grpokit.switch.accelerated`),
through an attention entry of grpokit's own (NAME), which also gives torch's CPU SDPA grouped keys/values
with a mask (no repeat_kv copies saved for backward). No environment variable, no global entry replaced.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F

MAX_SCORES = 2**20        # B x query heads x Tq x Tk of one layer's scores
NAME = "grpokit_sdpa"     # grpokit's entry in transformers' attention and mask registries
LAYER_SCORES = "layer_scores"   # a packed pass (grpokit.model.packing): its layer's scores over all rows
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
    scores = kwargs.get(LAYER_SCORES) or B * Hq * Tq * Tk    # a packed pass: all its rows at this layer
    if Hq % Hk or value.shape[1] != Hk or scores > MAX_SCORES:
        return False
    if mask is None:
        return Tq == Tk or Tq == 1        # plain causal, or one query over everything before it
    return mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1 and \
        mask.shape[0] in (1, B) and tuple(mask.shape[2:]) == (Tq, Tk)


def _grouped_with_mask(module, query, key, mask, kwargs: dict) -> bool:
    """A CPU pass whose grouped keys/values come with a mask: transformers would copy each key/value head
    to every query head it serves (`repeat_kv`, a CUDA kernel's need) and autograd would save the copies;
    torch's CPU SDPA takes the grouped heads with the mask as they are (`enable_gqa`)."""
    return (getattr(module, "num_key_value_groups", 1) > 1 and mask is not None and query.device.type == "cpu"
            and kwargs.get("position_bias") is None
            and kwargs.get("softcap") is None and not kwargs.get("output_attentions"))


def grpokit_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention signature: `attention` where it applies, else SDPA with grouped heads and
    a mask on the CPU, else transformers' own "sdpa" function unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _applies(query, key, value, attention_mask, dropout, kwargs):
        Tq, Tk = query.shape[2], key.shape[2]
        mask = attention_mask
        if mask is None and Tq == Tk and Tq > 1 and (is_causal if is_causal is not None
                                                      else getattr(module, "is_causal", True)):
            mask = torch.ones(Tq, Tk, dtype=torch.bool, device=query.device).tril()[None, None]
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = attention(query, key, value, mask, scale)                  # [B, Hq, Tq, D]
        return out.transpose(1, 2).contiguous(), None                    # as transformers' sdpa returns
    if _grouped_with_mask(module, query, key, attention_mask, kwargs):
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


@functools.cache
def _registered() -> bool:
    """grpokit's attention entry in transformers' registries (its documented extension point), added once,
    at the first `installed`, under its own name, NAME; the "sdpa" entry every other model uses is never
    touched. False when this transformers has no registries."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register(NAME, grpokit_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)     # the masks "sdpa" gets, bit for bit
    return True


@contextlib.contextmanager
def installed(model: torch.nn.Module) -> Iterator[None]:
    """For the duration, this model's "sdpa" attention runs `grpokit_attention` (its configs' attention
    implementation is set to NAME and set back on exit); other models in the process are untouched."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    mine = [c for c in configs.values() if getattr(c, "_attn_implementation", None) == "sdpa"]
    if not mine or not _registered():
        yield
        return
    for c in mine:
        c._attn_implementation = NAME
    try:
        yield
    finally:
        for c in mine:
            c._attn_implementation = "sdpa"
