"""Padding-free passes: a micro-batch's rows packed end to end, attention kept inside each row.

A padded pass over rows of prompt p_b and completion L_b tokens runs B x max(p + L) token-slots; a
packed one runs only the real tokens, as one sequence [1, S] whose position ids restart at every row:

    plain    each row's prompt and completion, end to end:            S = sum_b (p_b + L_b)
    shared   the U distinct prompts padded [U, P] once (a KV cache, as `shared_prompts.shared_prompt_hidden`),
             then the completions packed, each attending to its own prompt's keys: S = sum_b (L_b - 1)

Attention stays inside each row: transformers' attention entry of the model is set, for the duration of
`installed(model)`, to grpokit's own (`grpokit_packed:<previous>`), which runs the previous entry (sdpa,
eager, grpokit's small attention) once per row on that row's queries and keys, with the row's causal
(and sliding-window) mask; a pass that carries no layout (sampling, a padded pass) runs the previous entry
unchanged, its masks built as before. The layout travels as a keyword of the decoder's forward, so an
activation-checkpointed layer recomputed in backward sees it again. The log-probs equal the padded pass's
at every real token to float rounding (tests/model/test_packing.py); padding gets log-prob 0.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from grpokit.model.shared_prompts import (
    cache_kwarg,
    can_share,
    checkpointing_enabled,
    position_ids_from_mask,
    prompt_groups,
    uses_plain_head,
)

PREFIX = "grpokit_packed:"
LAYOUT_KW = "grpokit_packing"
# The layout of the packed forward running now: for decoders whose layers do not pass keyword arguments on
# to their attention (StableLM, Falcon, Nemotron); a recompute in backward has only the keyword.
_CURRENT: contextvars.ContextVar[Layout | None] = contextvars.ContextVar("grpokit_packing", default=None)


@dataclass
class Layout:
    """Where each row sits in the packed sequence, and the prompt keys it attends to in the shared mode.

    starts / lengths: [R] python ints, the row's first position and its token count in the sequence;
    prefix_rows / prefix_lengths: per row its prompt's row in `cache` and real length (shared mode), the
    cache's keys left-padded to P; cache: the prompt pass's transformers cache (None: plain mode).
    """

    starts: list[int]
    lengths: list[int]
    prefix_rows: list[int] | None = None
    prefix_lengths: list[int] | None = None
    cache: object | None = None

    def prefix_length(self, layer: int, row: int) -> int:
        """How many cached prompt keys row attends to at this layer (0 in plain mode); a sliding-window
        layer's cache keeps only its last window tokens."""
        if self.cache is None:
            return 0
        return min(self.prefix_lengths[row], self.cache.layers[layer].keys.shape[2])

    def prefix(self, layer: int, row: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cached keys and values [1, Hk, p, D] of row's prompt at this layer (real tokens only)."""
        if self.cache is None:
            return None
        u, p = self.prefix_rows[row], self.prefix_length(layer, row)
        layer_cache = self.cache.layers[layer]
        return layer_cache.keys[u:u + 1, :, -p:], layer_cache.values[u:u + 1, :, -p:]


def row_mask(q_len: int, prefix: int, window: int | None, device, additive_dtype=None) -> torch.Tensor | None:
    """One row's mask [1, 1, q_len, prefix + q_len]: query i (at position prefix + i) sees key j iff
    j <= prefix + i and, with a sliding window, prefix + i - j < window. None where a plain causal
    pass is the same (no prefix, no window reach); additive_dtype: 0 / -inf floats (eager) not booleans."""
    if prefix == 0 and (window is None or window >= q_len) and additive_dtype is None:
        return None
    q = torch.arange(q_len, device=device)[:, None] + prefix
    k = torch.arange(prefix + q_len, device=device)[None, :]
    keep = k <= q
    if window is not None:
        keep &= (q - k) < window
    if additive_dtype is not None:
        return torch.zeros(keep.shape, dtype=additive_dtype, device=device).masked_fill_(
            ~keep, torch.finfo(additive_dtype).min)[None, None]
    return keep[None, None]


def _previous_fn(module, previous: str):
    """The attention function the model ran before `installed`: the registry's entry, or the modeling
    file's own eager function."""
    from transformers import AttentionInterface

    if previous in AttentionInterface._global_mapping:
        return AttentionInterface._global_mapping[previous]
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if previous == "eager" and eager is not None:
        return eager
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward


def packed_attention(module, query, key, value, attention_mask, *args, previous: str = "sdpa", **kwargs):
    """transformers' attention signature. With a layout (LAYOUT_KW): the previous entry once per row on
    query/key/value [1, H, S, D] sliced to the row (and its prompt's cached keys prepended); else the
    previous entry as it was."""
    layout: Layout | None = kwargs.pop(LAYOUT_KW, None) or _CURRENT.get()
    fn = _previous_fn(module, previous)
    if layout is None:
        if _is_no_mask(attention_mask) and query.shape[2] > 1:
            raise RuntimeError(f"a packed pass reached {type(module).__name__} without its layout (a layer "
                               "recomputed in backward that drops keyword arguments): turn off gradient "
                               "checkpointing or optim.padding_free for this model")
        return fn(module, query, key, value, attention_mask, *args, **kwargs)
    window = kwargs.pop("sliding_window", None)
    eager = previous == "eager"
    prefixes = [layout.prefix_length(module.layer_idx, r) for r in range(len(layout.lengths))]
    # the layer's scores over all rows, as one padded call would count them (fast.small_attention's limit)
    kwargs["layer_scores"] = query.shape[1] * sum(n * (n + p) for n, p in zip(layout.lengths, prefixes))
    outs = []
    for r, (start, n) in enumerate(zip(layout.starts, layout.lengths)):
        if n == 0:
            continue
        q = query[:, :, start:start + n]
        k, v = key[:, :, start:start + n], value[:, :, start:start + n]
        prefix = layout.prefix(module.layer_idx, r)
        if prefix is not None:
            k, v = torch.cat([prefix[0].to(k.dtype), k], 2), torch.cat([prefix[1].to(v.dtype), v], 2)
        p = k.shape[2] - n
        mask = row_mask(n, p, window, query.device, query.dtype if eager else None)
        out, _ = fn(module, q, k, v, mask, *args, **kwargs)                # [1, n, Hq, D]
        outs.append(out)
    return torch.cat(outs, 1), None


@functools.cache
def _registered(previous: str) -> str:
    """Register `grpokit_packed:<previous>` (attention, and the previous entry's masks where it has
    them) once; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = PREFIX + previous
    AttentionInterface.register(name, functools.partial(packed_attention, previous=previous))
    masks = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    AttentionMaskInterface.register(name, masks.get(previous, masks["sdpa"]))
    return name


@contextlib.contextmanager
def installed(model: torch.nn.Module) -> Iterator[None]:
    """For the duration, the model's attention runs `packed_attention` over whatever it ran before (every
    config of the model, set back on exit). Passes without a layout are unchanged."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    saved = {}
    for key, c in configs.items():
        current = getattr(c, "_attn_implementation", None)
        if isinstance(current, str) and not current.startswith(PREFIX):
            saved[key] = current
            c._attn_implementation = _registered(current)
    try:
        yield
    finally:
        for key, current in saved.items():
            configs[key]._attn_implementation = current


def is_installed(model: torch.nn.Module) -> bool:
    """Whether `installed(model)` is in force (the model's config runs the packed attention)."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return isinstance(current, str) and current.startswith(PREFIX)


def packable(attention_mask: torch.Tensor, T: int) -> bool:
    """Whether rows [B, P + T] are a left-padded prompt (at least one token) then a right-padded
    completion: the layout a packed pass reproduces exactly."""
    P = attention_mask.shape[1] - T
    if P < 1:
        return False
    m = attention_mask.bool()
    prompt, completion = m[:, :P], m[:, P:]
    p_len, c_len = prompt.sum(-1), completion.sum(-1)
    cols_p = torch.arange(P, device=m.device)
    cols_c = torch.arange(T, device=m.device)
    return bool((p_len >= 1).all() and (prompt == (cols_p >= P - p_len[:, None])).all()
                and (completion == (cols_c < c_len[:, None])).all())


# Sentinel 4D mask: transformers returns a 4D mask as it is, so no [S, S] mask is built for a packed pass;
# packed_attention ignores it (each row gets its own).
def _no_mask(device) -> torch.Tensor:
    return torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)


def _is_no_mask(mask) -> bool:
    return isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and tuple(mask.shape) == (1, 1, 1, 1)


@contextlib.contextmanager
def _running(layout: Layout) -> Iterator[None]:
    token = _CURRENT.set(layout)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def plain_packed_hidden(dec, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int, *,
                        position_ids: torch.Tensor, logits: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden [n, H] that predict the n real completion tokens in row order, their flat index into
    [B, T]); every row's real tokens packed end to end (plain mode). logits: `dec` is the causal LM
    itself (a head that is not a plain linear): its logits [n, V] at those positions instead."""
    B, L = input_ids.shape
    P = L - T
    real = attention_mask.bool()
    ids = input_ids[real][None]                                           # [1, S]
    pos = position_ids[real][None]
    lengths = real.sum(-1).tolist()
    starts = [0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()]
    packed_at = (real.flatten().long().cumsum(0) - 1).view(B, L)          # padded column -> packed position
    c_real = real[:, P:]                                                  # [B, T]
    src = packed_at[:, P - 1:L - 1][c_real]                               # the position that predicts each
    extra = {"logits_to_keep": src} if logits else {}
    layout = Layout(starts, lengths)
    with _running(layout):
        out = dec(input_ids=ids, attention_mask=_no_mask(ids.device), position_ids=pos, use_cache=False,
                  **{LAYOUT_KW: layout}, **extra)
    if logits:
        return out.logits[0], _flat_index(c_real)                         # [n, V]
    return out.last_hidden_state[0].index_select(0, src), _flat_index(c_real)


def shared_packed_hidden(dec, cache_arg: str, config, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         T: int, groups: tuple[torch.Tensor, torch.Tensor], *,
                         position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`plain_packed_hidden`'s result with each distinct prompt run once (shared mode): the prompt pass
    [U, P] with a cache, then the completions packed (each row's tokens but its last), row by row on its
    prompt's keys."""
    from transformers import DynamicCache

    B, L = input_ids.shape
    P = L - T
    uniq, inv = groups
    p_ids, p_mask = uniq[:, :P], uniq[:, P:].to(attention_mask.dtype)
    first = dec(input_ids=p_ids, attention_mask=p_mask, position_ids=position_ids_from_mask(p_mask),
                use_cache=True, **{cache_arg: DynamicCache(config=config)})
    cache = first.past_key_values if getattr(first, "cache", None) is None else first.cache
    last = first.last_hidden_state[:, -1]                                 # [U, H] predicts token 0
    c_real = attention_mask[:, P:].bool()                                 # [B, T]
    c_len = c_real.sum(-1)
    feed = c_real[:, 1:]                                                  # token t is fed iff t + 1 is real
    lengths = feed.sum(-1).tolist()
    starts = [0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()]
    pieces = [last]
    if sum(lengths):
        ids = input_ids[:, P:L - 1][feed][None]                           # [1, S]
        pos = position_ids[:, P:L - 1][feed][None]
        layout = Layout(starts, lengths, inv.tolist(), p_mask.sum(-1)[inv].tolist(), cache)
        with _running(layout):
            out = dec(input_ids=ids, attention_mask=_no_mask(ids.device), position_ids=pos, use_cache=False,
                      **{LAYOUT_KW: layout})
        pieces.append(out.last_hidden_state[0])                           # [S, H]
    hidden = torch.cat(pieces, 0)                                         # [U + S, H]
    t = torch.arange(T, device=input_ids.device)[None].expand(B, T)
    row_start = torch.tensor(starts, device=input_ids.device)[:, None]
    src = torch.where(t == 0, inv[:, None], last.shape[0] + row_start + t - 1)   # [B, T]
    src = src[t < c_len[:, None]]
    return hidden.index_select(0, src), _flat_index(c_real)


def _flat_index(c_real: torch.Tensor) -> torch.Tensor:
    """[n] flat positions in [B, T] of the real completion tokens, in row order."""
    return c_real.flatten().nonzero().flatten()


def unpack(values: torch.Tensor, index: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """[n] values at `index` -> [B, T] with 0 elsewhere (differentiable in values)."""
    return values.new_zeros(B * T).index_copy(0, index, values).view(B, T)


def packed_final_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int,
                        share_prompts: bool):
    """(hidden [1, n, H] that predict the n real completion tokens, their flat index into [B, T], lm-head
    weight, bias); logits [1, n, V] and no weight for a head that is not a plain linear. Packed passes
    (`grpokit.model.packing`): each distinct prompt once where the model shares prompts."""
    if checkpointing_enabled(model) and not is_installed(model):
        raise ValueError("padding-free log-probs under gradient checkpointing must run inside "
                         "grpokit.model.packing.installed(model): the recompute in backward needs it")
    pos = position_ids_from_mask(attention_mask)
    groups = (prompt_groups(input_ids, attention_mask, T)
              if share_prompts and can_share(model, input_ids, T) else None)
    with installed(model):
        if groups is not None and groups[0].shape[0] < input_ids.shape[0]:   # some prompt is used twice
            dec = model.get_decoder()
            hidden, index = shared_packed_hidden(dec, cache_kwarg(dec), model.config, input_ids,
                                                 attention_mask, T, groups, position_ids=pos)
        elif uses_plain_head(model):
            hidden, index = plain_packed_hidden(model.get_decoder(), input_ids, attention_mask, T,
                                                position_ids=pos)
        else:
            logits, index = plain_packed_hidden(model, input_ids, attention_mask, T, position_ids=pos,
                                                logits=True)
            return logits[None], index, None, None
    head = model.get_output_embeddings()
    return hidden[None], index, head.weight, head.bias
