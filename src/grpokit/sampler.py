"""grpokit's own decode loop behind `sample_groups` (the "fast" backend).

Why not `model.generate`: GRPO samples G completions of the same prompt, so the prompt is prefilled
once and its KV cache is shared by the group (repeated along the batch, not recomputed); rows that
have finished are dropped from the batch so they cost nothing; and the sampling log-probs come out
with the tokens, so mu = 1 needs no extra forward pass for the old policy.

The distribution is exactly `generate`'s: logits / temperature, then top-k, then top-p (the order of
transformers' logits warpers), then a multinomial draw. The returned log-probs are those of the
temperature-scaled full distribution, log_softmax(z / tau)[o_t], which is what `per_token_logprobs`
recomputes, so they can stand in for the old policy's log-probs.
"""

from __future__ import annotations

import logging

import torch

from .logprobs import position_ids_from_mask

log = logging.getLogger("grpokit")

# Architectures whose forward takes (input_ids, attention_mask, position_ids, cache) and a DynamicCache.
FAST_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "phi3", "olmo", "olmo2", "granite", "smollm3")
_warned: set[str] = set()


def choose_backend(model, backend: str) -> bool:
    """True to use the fast sampler. 'auto' picks it when the architecture is known to work."""
    if backend == "fast":
        return True
    if backend == "generate":
        return False
    if backend == "vllm":
        raise ValueError("rollout.backend=vllm is not available in this build: use auto, fast or generate")
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    ok = model_type in FAST_MODEL_TYPES
    if not ok and model_type not in _warned:
        _warned.add(model_type)
        log.info("sampler: architecture '%s' is not on the fast path; using model.generate", model_type)
    return ok


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


@torch.no_grad()
def fast_sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                max_new_tokens: int, temperature: float, top_p: float, top_k: int, eos_ids: list[int],
                pad_id: int, suppress_eos: bool = False, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample G completions per prompt with a shared-prefix KV cache.

    Args:
        prompt_ids, prompt_mask: [B, P] left-padded prompts (each prefilled once).
        group_size: G.
        greedy: argmax decoding (evaluation); log-probs are still those of the tempered distribution.

    Returns:
        (completion_ids [B*G, T'] padded with pad_id after a row ends, sampling log-probs [B*G, T']),
        T' <= max_new_tokens (the longest row).
    """
    from transformers import DynamicCache

    was_training = model.training
    model.eval()
    try:
        device = prompt_ids.device
        cache = DynamicCache(config=model.config)
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids_from_mask(prompt_mask),
                    cache=cache, use_cache=True, logits_to_keep=1)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        cache.batch_repeat_interleave(group_size)                         # share the prefix: [B*G, ...]
        next_logits = out.logits[:, -1].float().repeat_interleave(group_size, 0)  # [N, V]
        N = next_logits.shape[0]
        mask = prompt_mask.repeat_interleave(group_size, 0)               # [N, P] grows by one per step
        position = mask.sum(-1)                                           # next position of each row [N]
        tokens = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)
        logps = torch.zeros((N, max_new_tokens), dtype=torch.float32, device=device)
        alive = torch.arange(N, device=device)                            # rows still decoding
        eos = torch.tensor(eos_ids, device=device)
        steps = 0
        for t in range(max_new_tokens):
            if suppress_eos:
                next_logits[:, eos] = float("-inf")
            scaled = next_logits / temperature
            if greedy:
                tok = next_logits.argmax(-1)                              # [n_alive]
            else:
                probs = filter_logits(next_logits, temperature, top_k, top_p).softmax(-1)
                tok = torch.multinomial(probs, 1).squeeze(-1)             # [n_alive]
            tokens[alive, t] = tok
            logps[alive, t] = scaled.gather(-1, tok[:, None]).squeeze(-1) - torch.logsumexp(scaled, -1)
            steps = t + 1
            done = torch.isin(tok, eos)
            if t + 1 == max_new_tokens:
                break
            if done.any():
                keep = (~done).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                alive, tok, mask, position = alive[keep], tok[keep], mask[keep], position[keep]
                cache.batch_select_indices(keep)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=position[:, None],
                        cache=cache, use_cache=True)
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            position = position + 1
            next_logits = out.logits[:, -1].float()
        return tokens[:, :steps], logps[:, :steps]
    finally:
        model.train(was_training)
