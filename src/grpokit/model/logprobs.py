"""[D] Per-token log-probabilities of completion tokens, without a [B, T, V] log-softmax.

    logp_t = z_t[o_t] / tau - logsumexp(z_t / tau)

where z_t are the logits that predict completion token o_t and tau is the sampling temperature
(the ratio must compare the distribution the tokens were sampled from). The decoder runs once; the
lm-head, logsumexp and gather run over chunks of rows so only [chunk, V] logits exist at a time.
With gradients on, each chunk is recomputed in backward (activation checkpointing) so the saved
state is the [B, T, H] hidden states, not [B, T, V] logits. Rows that share a prompt (a GRPO group)
run that prompt through the decoder once (`shared_prompt_hidden`).

This is the plain path: PyTorch ops only. The optional CPU kernels (C attention, fused SiLU x up and
RMSNorm, grouped keys/values in SDPA) are switched on around it by `grpokit.switch.accelerated`.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch.utils.checkpoint import checkpoint

from grpokit.model import speedups
from grpokit.model.precision import autocast_for, head_dtype

# Architectures whose decoder takes a transformers DynamicCache with the usual (ids, mask, positions):
# each is in tests/model/test_architectures.py (sampled log-probs = a full forward, shared prompts = one row
# at a time, greedy = model.generate). Not here, as their caches are not a DynamicCache of attention layers:
# the hybrid linear-attention / Mamba models (jamba, bamba, granitemoehybrid, qwen3_next, falcon_h1, zamba2)
# and MiniMax; they sample with model.generate (single-turn only).
CACHE_MODEL_TYPES = (
    "llama", "qwen2", "qwen3", "mistral", "ministral", "gemma", "gemma2", "gemma3_text", "phi", "phi3",
    "olmo", "olmo2", "granite", "smollm3", "cohere", "cohere2", "glm", "glm4", "starcoder2", "stablelm",
    "gpt_neox", "falcon", "exaone4", "ernie4_5", "hunyuan_v1_dense", "seed_oss", "apertus", "arcee", "helium",
    "nemotron", "lfm2",
    # mixture of experts
    "qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "gpt_oss", "granitemoe", "phimoe", "glm4_moe",
    "ernie4_5_moe", "hunyuan_v1_moe")
# Configs whose lm-head output is not plain `hidden @ W.T (+ b)`; they take the generic path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
# Under autograd the lm-head keeps each chunk's probabilities for backward when V <= this x H, or when
# they are 16-bit (bf16 mixed precision) and all rows' take at most KEEP_PROBS_16BIT_BYTES; else recomputes.
KEEP_PROBS_VOCAB_RATIO = 8
KEEP_PROBS_16BIT_BYTES = 256 * 2**20
# Rows per float32 log-softmax block: an [8, V] block (1.5 MB at a 49k vocab) is cast, normalized,
# exponentiated and reduced while in the cores' L2, not in four passes over a [R, V] float32 copy in
# memory (SmolLM2's head, 504 rows: 8-row blocks beat 16-128 and the whole [R, V]; head_logprobs.py bench).
SOFTMAX_BLOCK_ROWS = 8
# On a GPU the whole chunk is one block (0): there the per-block Python loop costs launches, not cache misses.
SOFTMAX_BLOCK_ROWS_GPU = 0


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` computes them. [B, L]"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _tempered_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float):
    """(h W^T + b) / tau in float32, [R, V] (divided in place: the matmul's output is not kept by
    autograd)."""
    z = torch.nn.functional.linear(h, weight, bias).float()               # [R, V]
    return z.div_(temperature) if temperature != 1.0 else z


def logsoftmax_stats(z: torch.Tensor, targets: torch.Tensor, temperature: float, *,
                     probs: torch.Tensor | None = None, with_entropy: bool = False):
    """Logits z [R, V] (any float dtype) -> (log-probs of targets [R], entropy [R] or None), in float32.

    Works on blocks of SOFTMAX_BLOCK_ROWS rows cast to float32: log p = log_softmax(z / tau),
    H = -sum_v p_v log p_v. probs: a [R, V] tensor (it may be z itself) that receives softmax(z / tau)
    in its own dtype. No autograd: the callers differentiate by hand (`HeadLogprobs`) or not at all.
    """
    R = z.shape[0]
    logp = torch.empty(R, device=z.device)
    entropy = torch.empty(R, device=z.device) if with_entropy else None
    step = SOFTMAX_BLOCK_ROWS if z.device.type == "cpu" else SOFTMAX_BLOCK_ROWS_GPU or max(R, 1)
    for start in range(0, R, step):
        s = slice(start, start + step)
        block = z[s].float()
        logsm = torch.log_softmax(block / temperature if temperature != 1.0 else block, dim=-1)  # [r, V]
        logp[s] = logsm.gather(-1, targets[s, None]).squeeze(-1)
        if probs is None and not with_entropy:
            continue
        p = logsm.exp()
        if with_entropy:
            entropy[s] = -(p * logsm).sum(-1)
        if probs is not None:
            probs[s] = p
    return logp, entropy


def chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None, temperature: float, with_entropy: bool = False,
                    entropy_grad: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """hidden [R, H], targets [R] -> log-probs [R] (and entropy [R]); logits exist only for these R rows.

    The entropy reuses the same logits and logsumexp (H = lse - sum_v p_v z_v), so asking for it costs
    elementwise work, not a second lm-head matmul; it carries a gradient only with entropy_grad (an
    entropy bonus in the loss). Without autograd (the reference pass) the log-softmax runs in cache-sized
    blocks (`logsoftmax_stats`).
    """
    if not torch.is_grad_enabled():
        z = torch.nn.functional.linear(hidden, weight, bias)              # [R, V]
        logprobs, entropy = logsoftmax_stats(z, targets, temperature, with_entropy=with_entropy)
        return (logprobs, entropy) if with_entropy else logprobs
    logits = _tempered_logits(hidden, weight, bias, temperature)          # [R, V]
    lse = torch.logsumexp(logits, dim=-1)                                 # [R]
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logprobs
    if entropy_grad:
        return logprobs, lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)    # [R], differentiable
    with torch.no_grad():
        z, lse_d = logits.detach(), lse.detach()
        entropy = lse_d - (torch.exp(z - lse_d[:, None]) * z).sum(-1)    # [R]
    return logprobs, entropy


def _uses_plain_head(model) -> bool:
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "get_decoder") or model.get_output_embeddings() is None:
        return False
    return not any(getattr(cfg, name, None) not in (None, 1.0) for name in _LOGIT_TRANSFORMS)


def per_token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,          # [B, P + T] prompt (left-padded) followed by completion tokens
    attention_mask: torch.Tensor,     # [B, P + T]
    completion_length: int,           # T
    *,
    temperature: float = 1.0,
    chunk_rows: int = 1024,
    return_entropy: bool = False,
    share_prompts: bool = True,
    entropy_grad: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the last `completion_length` tokens of each row. Returns [B, T] (float32).

    Args:
        model: any causal LM; plain lm-head models (Llama, Qwen, Mistral, SmolLM, ...) use the chunked
            path, others compute the completion logits then the same gather - logsumexp.
        chunk_rows: B*T rows per lm-head chunk; peak logits memory is chunk_rows x V.
        return_entropy: also return the policy's token entropy [B, T] (no grad, for metrics and masks;
            with entropy_grad, differentiable: an entropy bonus in the loss).
        share_prompts: rows with the same prompt (a GRPO group) run the prompt through the decoder once
            (`shared_prompt_hidden`); the result equals the plain pass to float rounding.
    """
    T = completion_length
    targets = input_ids[:, -T:]                                           # [B, T]
    with autocast_for(model):                                             # bf16 matmuls in mixed precision
        hidden, weight, bias = _final_hidden(model, input_ids, attention_mask, T, share_prompts)
    dtype = head_dtype(model)
    # an fp32 head (cast_lm_head_to_fp32) computes in fp32 even inside the update's bf16 autocast
    fp32_head = torch.autocast(hidden.device.type, enabled=False) if dtype == torch.float32 else \
        contextlib.nullcontext()
    with fp32_head:
        return head_logprobs(hidden, targets, weight, bias, temperature=temperature, chunk_rows=chunk_rows,
                             return_entropy=return_entropy, compute_dtype=dtype, entropy_grad=entropy_grad)


def _final_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int, share_prompts: bool):
    """(hidden [B, T, H], lm-head weight, bias) that predict the last T tokens; (logits [B, T, V], None, None)
    for models whose head is not a plain linear."""
    groups = (_prompt_groups(input_ids, attention_mask, T)
              if share_prompts and _can_share(model, input_ids, T) else None)
    if groups is not None and groups[0].shape[0] < input_ids.shape[0]:   # some prompt is used twice
        hidden = shared_prompt_hidden(model, input_ids, attention_mask, T, groups)  # [B, T, H]
    elif _uses_plain_head(model):
        out = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids_from_mask(attention_mask))
        hidden = out.last_hidden_state[:, -T - 1:-1]                      # [B, T, H] predicts tokens -T..-1
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids_from_mask(attention_mask),
                       logits_to_keep=T + 1).logits[:, :-1]
        return logits, None, None                                         # [B, T, V]
    head = model.get_output_embeddings()
    return hidden, head.weight, head.bias


class HeadLogprobs(torch.autograd.Function):
    """log-probs [R] (and entropy [R], no grad) of targets t [R] under softmax((h W^T + b) / tau), h [R, H].

    Forward: z = (h W^T + b) / tau, logp = log_softmax(z)[t] (float32, `logsoftmax_stats`). Backward,
    with p = softmax(z):
        dz = g (onehot(t) - p) / tau,   dh = dz W,   dW = dz^T h,   db = sum_r dz
    computed in place on one [R, V] buffer in the logits' dtype (autograd's gather and logsumexp backward
    allocate several float32 ones); at the targets g (1 - p_t) / tau comes from the float32 log-prob,
    so a confident token's gradient is not lost to bf16 rounding of p_t near 1.
    keep_probs: save p for backward (R x V in the logits' dtype) instead of recomputing z (a second
    lm-head matmul).
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, t: torch.Tensor,
                temperature: float, keep_probs: bool, with_entropy: bool):
        z = torch.nn.functional.linear(h, weight, bias)                  # [R, V] in the compute dtype
        logprobs, entropy = logsoftmax_stats(z, t, temperature, probs=z if keep_probs else None,
                                             with_entropy=with_entropy)   # z becomes p when kept
        ctx.save_for_backward(h, weight, bias, t, logprobs, z if keep_probs else None)
        ctx.temperature = temperature
        if with_entropy:
            ctx.mark_non_differentiable(entropy)
            return logprobs, entropy
        return logprobs

    @staticmethod
    def backward(ctx, g: torch.Tensor, *_):
        h, weight, bias, t, logprobs, p = ctx.saved_tensors
        if p is None:                                                     # recompute softmax(z), in place
            p = torch.nn.functional.linear(h, weight, bias)
            logsoftmax_stats(p, t, ctx.temperature, probs=p)
        tau = ctx.temperature
        dz = p.mul_((-g / tau).to(p.dtype)[:, None])                     # [R, V]: -g p / tau, in place
        dz[torch.arange(len(t), device=t.device), t] = (g * -torch.expm1(logprobs) / tau).to(dz.dtype)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]                 # a frozen head (LoRA): no dW matmul
        return (dz @ weight if need_h else None, dz.t() @ h if need_w else None,
                dz.sum(0) if bias is not None and need_b else None, None, None, None, None)


def _plain_tensors(*tensors) -> bool:
    return all(x is None or type(x) in (torch.Tensor, torch.nn.Parameter) for x in tensors)


def head_logprobs(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor | None,
                  bias: torch.Tensor | None, *, temperature: float, chunk_rows: int = 1024,
                  return_entropy: bool = False, compute_dtype: torch.dtype | None = None,
                  entropy_grad: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states [B, T, H] (or logits [B, T, V] when weight is None) -> log-probs of targets [B, T].

    The lm-head runs over chunks of `chunk_rows` rows (`HeadLogprobs` under autograd), so at most
    [chunk_rows, V] logits exist at a time. With gradients, each chunk keeps its probabilities for
    backward when V <= KEEP_PROBS_VOCAB_RATIO * H (then they cost no more than a few of the [rows, H]
    activations each decoder layer keeps), or when they are bf16 and take at most KEEP_PROBS_16BIT_BYTES
    (no more than the recompute's own [chunk_rows, V] buffer, at up to 2 chunks of a 49k vocab); else the
    chunk's logits are recomputed in backward. compute_dtype (bf16 mixed precision): the head's matmuls,
    forward and backward, run in it on cast copies (the gradients flow back to the fp32 weights through
    the casts); the logits are cast up to float32 block by block before the log-softmax, so log-softmax,
    ratio, KL and loss stay float32.
    """
    if compute_dtype is not None and weight is not None:
        # autograd's cast; inside the switch in mixed precision, one cast leaf per update whose gradient is
        # added into the float32 .grad in place (`grpokit.fast.master_grads`)
        hidden, weight = hidden.to(compute_dtype), speedups.active().cast_head(weight, compute_dtype)
        bias = None if bias is None else bias.to(compute_dtype)
    B, T, H = hidden.shape
    flat_h = hidden.reshape(B * T, H)                                     # [B*T, H]
    flat_t = targets.reshape(B * T)
    entropy_grad = entropy_grad and return_entropy and torch.is_grad_enabled()
    # a differentiable entropy takes the checkpointed chunk path (HeadLogprobs' hand backward has no H term)
    fused = (weight is not None and torch.is_grad_enabled() and _plain_tensors(hidden, weight, bias)
             and not entropy_grad)
    keep = fused and (weight.shape[0] <= KEEP_PROBS_VOCAB_RATIO * H or weight.element_size() == 2
                      and B * T * weight.shape[0] * 2 <= KEEP_PROBS_16BIT_BYTES)
    pieces, entropies = [], []
    for h, t in zip(flat_h.split(chunk_rows), flat_t.split(chunk_rows)):  # split: backward is one cat, not a
        if weight is None:                                                # zero-filled [B*T, H] per slice
            logp = torch.log_softmax(h.float() / temperature, -1)
            out = logp.gather(-1, t[:, None]).squeeze(-1)
            if return_entropy:
                ent = -(logp.exp() * logp).sum(-1)
                out = (out, ent if entropy_grad else ent.detach())
        elif fused:
            out = HeadLogprobs.apply(h, weight, bias, t, temperature, keep, return_entropy)
        elif torch.is_grad_enabled():
            out = checkpoint(chunk_logprobs, h, t, weight, bias, temperature, return_entropy, entropy_grad,
                             use_reentrant=False)
        else:
            out = chunk_logprobs(h, t, weight, bias, temperature, return_entropy)
        lp, ent = out if return_entropy else (out, None)
        pieces.append(lp)
        entropies.append(ent)
    logprobs = torch.cat(pieces).view(B, T)
    if return_entropy:
        return logprobs, torch.cat(entropies).view(B, T)
    return logprobs


def can_share_prompts(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int) -> bool:
    """Whether `shared_prompt_hidden` applies: a known cache-capable decoder with a plain lm-head, no
    gradient checkpointing (transformers turns the cache off under it), and some prompt used twice."""
    return _can_share(model, input_ids, T) and \
        _prompt_groups(input_ids, attention_mask, T)[0].shape[0] < input_ids.shape[0]


def model_shares_prompts(model) -> bool:
    """The model-side conditions of `can_share_prompts`: a known cache-capable decoder, a plain lm-head, no
    gradient checkpointing (no look at the prompts themselves)."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", "") in CACHE_MODEL_TYPES and _uses_plain_head(model) \
        and not checkpointing_enabled(model)


def _can_share(model, input_ids: torch.Tensor, T: int) -> bool:
    """`model_shares_prompts` and a batch shape it applies to."""
    return model_shares_prompts(model) and input_ids.shape[0] >= 2 and input_ids.shape[1] > T


def _prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct prompts [U, 2P] as ids then mask, the row -> prompt index [B])."""
    P = input_ids.shape[1] - T
    prompts = torch.cat([input_ids[:, :P], attention_mask[:, :P].to(input_ids.dtype)], 1)
    return torch.unique(prompts, dim=0, return_inverse=True)


def cache_kwarg(module) -> str:
    """The forward's name for the KV cache: `cache` (transformers 5) or `past_key_values` (4.x)."""
    fwd = type(module).forward if isinstance(module, torch.nn.Module) else module
    try:
        return "cache" if "cache" in inspect.signature(fwd).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "cache"


def checkpointing_enabled(model) -> bool:
    model = model.get_base_model() if hasattr(model, "get_base_model") else model   # a PeftModel: its base
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):   # transformers 5 / 4 names
        if hasattr(type(model), name):                                    # a property of the class
            return bool(getattr(model, name))
    return False


def shared_prompt_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int,
                         groups: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Final hidden states [B, T, H] that predict the last T tokens, each distinct prompt run once.

    GRPO scores G completions of one prompt, so a plain pass runs the prompt's P tokens G times. Here
    the U distinct prompts go through the decoder once ([U, P]); their keys/values are gathered to the
    B rows (an index select, so the backward sums the G rows' gradients into the one prompt pass); the
    completions then run on that cache. Token t's prediction comes from position P + t - 1: the
    prompt's last hidden state for t = 0, the completion pass for t >= 1. Cost: U*P + B*T token
    forwards instead of B*(P + T). `groups`: the `_prompt_groups` result when the caller already has it.
    """
    P = input_ids.shape[1] - T
    uniq, inv = groups if groups is not None else _prompt_groups(input_ids, attention_mask, T)  # [U, 2P], [B]
    p_ids, p_mask = uniq[:, :P], uniq[:, P:].to(attention_mask.dtype)
    dec = model.get_decoder()
    cache_arg = cache_kwarg(dec)
    return _two_pass_hidden(dec, cache_arg, model.config, input_ids, attention_mask, p_ids, p_mask, inv, T)


def _two_pass_hidden(dec, cache_arg: str, config, input_ids, attention_mask, p_ids, p_mask, inv, T: int):
    """The prompt pass over [U, P], then the completion pass over [B, T - 1] on the gathered cache."""
    from transformers import DynamicCache

    P = p_ids.shape[1]
    first = dec(input_ids=p_ids, attention_mask=p_mask, position_ids=position_ids_from_mask(p_mask),
                use_cache=True, **{cache_arg: DynamicCache(config=config)})
    cache = first.past_key_values if getattr(first, "cache", None) is None else first.cache
    last = first.last_hidden_state[:, -1:].index_select(0, inv)           # [B, 1, H]
    if T == 1:
        return last
    _select_cache_rows(cache, inv)                                        # [U, ...] -> [B, ...]
    rest = dec(input_ids=input_ids[:, P:-1], attention_mask=attention_mask[:, :-1],
               position_ids=position_ids_from_mask(attention_mask)[:, P:-1], use_cache=True,
               **{cache_arg: cache})
    return torch.cat([last, rest.last_hidden_state], 1)                   # [B, T, H]


def _select_cache_rows(cache, rows: torch.Tensor) -> None:
    """Gather cache rows with `index_select`, whose backward (`index_add_`) sums the G rows of a prompt in
    row order on the CPU; on CUDA (where index_add_ adds with atomics) by `GatherRows`. Advanced indexing
    (what `Cache.batch_select_indices` does) accumulates its backward with atomic adds over threads on
    CPU, so two identical runs would differ in the last bits."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
        cache.batch_select_indices(rows)                                  # another cache layout
        return
    for layer in layers:
        gather = GatherRows.apply if layer.keys.device.type == "cuda" else torch.Tensor.index_select
        layer.keys, layer.values = gather(layer.keys, 0, rows), gather(layer.values, 0, rows)


class GatherRows(torch.autograd.Function):
    """x[rows] (x [U, ...], rows [B]) whose backward sums each source row's gradients in a fixed order:
    a one-hot [U, B] matmul, which repeats bit for bit on a GPU where `index_add_` (index_select's
    backward) adds with atomics in whatever order the threads arrive."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, rows: torch.Tensor) -> torch.Tensor:
        assert dim == 0, "GatherRows gathers rows (dim 0)"
        ctx.save_for_backward(rows)
        ctx.sources = x.shape[0]
        return x.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (rows,) = ctx.saved_tensors
        B = rows.numel()
        onehot = torch.zeros(ctx.sources, B, dtype=grad.dtype, device=grad.device)     # [U, B]
        onehot[rows, torch.arange(B, device=rows.device)] = 1
        summed = onehot @ grad.reshape(B, -1)                                          # [U, prod(...)]
        return summed.view(ctx.sources, *grad.shape[1:]), None, None
