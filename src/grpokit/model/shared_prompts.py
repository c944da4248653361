"""Rows that share a prompt (a GRPO group) run that prompt through the decoder once, and the model-side
facts the passes ask: which architectures take a DynamicCache, a plain lm-head, gradient checkpointing.

`shared_prompt_hidden` is the padded form (`grpokit.model.logprobs` takes it); the packed form is
`grpokit.model.packing.shared_packed_hidden`.
"""

from __future__ import annotations

import inspect

import torch

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

def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` computes them. [B, L]"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def uses_plain_head(model) -> bool:
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "get_decoder") or model.get_output_embeddings() is None:
        return False
    return not any(getattr(cfg, name, None) not in (None, 1.0) for name in _LOGIT_TRANSFORMS)


def can_share_prompts(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int) -> bool:
    """Whether `shared_prompt_hidden` applies: a known cache-capable decoder with a plain lm-head, no
    gradient checkpointing (transformers turns the cache off under it), and some prompt used twice."""
    return can_share(model, input_ids, T) and \
        prompt_groups(input_ids, attention_mask, T)[0].shape[0] < input_ids.shape[0]


def model_shares_prompts(model) -> bool:
    """The model-side conditions of `can_share_prompts`: a known cache-capable decoder, a plain lm-head, no
    gradient checkpointing (no look at the prompts themselves)."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", "") in CACHE_MODEL_TYPES and uses_plain_head(model) \
        and not checkpointing_enabled(model)


def can_share(model, input_ids: torch.Tensor, T: int) -> bool:
    """`model_shares_prompts` and a batch shape it applies to."""
    return model_shares_prompts(model) and input_ids.shape[0] >= 2 and input_ids.shape[1] > T


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor,
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
    uniq, inv = groups if groups is not None else prompt_groups(input_ids, attention_mask, T)  # [U, 2P], [B]
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
