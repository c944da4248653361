"""The sampling distribution of grpokit's decode loop (`grpokit.rollout.sampler`): exactly `generate`'s.

logits / temperature, then top-k, then top-p (the order of transformers' logits warpers), then one
categorical draw per row; the returned log-probs are those of the temperature-scaled full distribution,
logp_t = z_t[o_t] / tau - logsumexp(z_t / tau).
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p to [N, V] logits (removed entries -> -inf)."""
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]            # [N, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (keep at least the first).
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def pick_tokens(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                greedy: bool, native=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of [n, V] logits; returns (tokens [n], log-probs [n] of the tempered
    distribution).

    native: `grpokit.fast.native.DecodeKernels` to draw without top-k/top-p in one fused call (the same law).
    """
    unfiltered = (not top_k or top_k >= logits.shape[-1]) and top_p >= 1.0
    if native is not None and unfiltered and logits.dtype == torch.float32 and logits.is_contiguous() \
            and logits.device.type == "cpu":
        return native.sample(logits, temperature, greedy)
    scaled = logits / temperature if temperature != 1.0 else logits
    lse = torch.logsumexp(scaled, -1, keepdim=True)                       # [n, 1]
    if greedy:
        tok = logits.argmax(-1)
    else:
        if unfiltered:
            probs = (scaled - lse).exp_()                                 # softmax(z / tau), lse reused
        else:
            probs = filter_logits(logits, temperature, top_k, top_p).softmax(-1)
        tok = sample_categorical(probs)
    return tok, (scaled.gather(-1, tok[:, None]) - lse).squeeze(-1)


def sample_categorical(probs: torch.Tensor) -> torch.Tensor:
    """One draw per row of [n, V] probabilities by inverse CDF: the first i with cdf_i > u * cdf_V.

    The same categorical distribution as torch.multinomial (zero-probability entries never win: the cdf
    does not rise there), at the cost of one uniform per row instead of V exponentials.
    """
    cdf = probs.cumsum(-1)                                                # [n, V]
    u = torch.rand(probs.shape[0], 1, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


# A finished row costs a row of compute per decode step; dropping rows costs one KV-cache copy: the decode
# loops (grpokit.rollout.sampler, .turns, .tree) drop them in batches, once this share of rows is done.
COMPACT_EVERY = 8


def rows_to_keep(finished: torch.Tensor) -> torch.Tensor | None:
    """[live] indices of the rows not finished, when at least 1 in COMPACT_EVERY of `finished` [rows] is
    (then worth a cache copy); None otherwise."""
    if int(finished.sum()) * COMPACT_EVERY < finished.numel():
        return None
    return (~finished).nonzero().squeeze(-1)
