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

import torch
from torch.utils.checkpoint import checkpoint

from grpokit.model import packing, speedups
from grpokit.model.precision import autocast_for, head_dtype
from grpokit.model.shared_prompts import (
    can_share,
    position_ids_from_mask,
    prompt_groups,
    shared_prompt_hidden,
    uses_plain_head,
)

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
    padding_free: bool = False,
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
        padding_free: the rows' real tokens packed end to end (`grpokit.model.packing`): no padding runs,
            padding gets log-prob (and entropy) 0. Rows must be a left-padded prompt then a right-padded
            completion (else the padded pass runs); under gradient checkpointing, inside
            `packing.installed(model)` (its recompute in backward must see the packed attention too).
    """
    T = completion_length
    targets = input_ids[:, -T:]                                           # [B, T]
    index = None
    with autocast_for(model):                                             # bf16 matmuls in mixed precision
        if padding_free and packing.packable(attention_mask, T):
            hidden, index, weight, bias = packing.packed_final_hidden(model, input_ids, attention_mask, T,
                                                               share_prompts)
            targets = targets.flatten().index_select(0, index)[None]      # [1, n]
        else:
            hidden, weight, bias = _final_hidden(model, input_ids, attention_mask, T, share_prompts)
    dtype = head_dtype(model)
    # an fp32 head (cast_lm_head_to_fp32) computes in fp32 even inside the update's bf16 autocast
    fp32_head = torch.autocast(hidden.device.type, enabled=False) if dtype == torch.float32 else \
        contextlib.nullcontext()
    with fp32_head:
        out = head_logprobs(hidden, targets, weight, bias, temperature=temperature, chunk_rows=chunk_rows,
                            return_entropy=return_entropy, compute_dtype=dtype, entropy_grad=entropy_grad)
    if index is None:
        return out
    B = input_ids.shape[0]
    if return_entropy:
        return packing.unpack(out[0][0], index, B, T), packing.unpack(out[1][0], index, B, T)
    return packing.unpack(out[0], index, B, T)


def _final_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int, share_prompts: bool):
    """(hidden [B, T, H], lm-head weight, bias) that predict the last T tokens; (logits [B, T, V], None, None)
    for models whose head is not a plain linear."""
    groups = (prompt_groups(input_ids, attention_mask, T)
              if share_prompts and can_share(model, input_ids, T) else None)
    if groups is not None and groups[0].shape[0] < input_ids.shape[0]:   # some prompt is used twice
        hidden = shared_prompt_hidden(model, input_ids, attention_mask, T, groups)  # [B, T, H]
    elif uses_plain_head(model):
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
