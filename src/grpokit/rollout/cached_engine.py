"""The decode loop's engine for architectures the lean decoder lacks: the model's own forward with a
transformers DynamicCache, the prompt prefilled once and its cache repeated to the group's G rows."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from grpokit.model.shared_prompts import cache_kwarg, position_ids_from_mask


class CachedEngine:
    """The model's own forward with a transformers DynamicCache (architectures the lean decoder lacks)."""

    def __init__(self, model, prompt_ids, prompt_mask, group_size: int) -> None:
        self.model, self.cache_arg = model, cache_kwarg(model)
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask,
                    position_ids=position_ids_from_mask(prompt_mask), use_cache=True, logits_to_keep=1,
                    **{self.cache_arg: DynamicCache(config=model.config)})
        self.cache = self._cache(out)
        self.cache.batch_repeat_interleave(group_size)                    # share the prefix: [B*G, ...]
        self.logits0 = out.logits[:, -1].repeat_interleave(group_size, 0)
        self.mask = prompt_mask.repeat_interleave(group_size, 0)          # [N, P] grows by one per step
        self.pos = self.mask.sum(-1)

    @staticmethod
    def _cache(out):
        return out.cache if getattr(out, "cache", None) is not None else out.past_key_values

    def first_logits(self) -> torch.Tensor:
        return self.logits0

    def step(self, tok: torch.Tensor, t: int) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.mask,
                         position_ids=(self.pos + t)[:, None], use_cache=True, **{self.cache_arg: self.cache})
        self.cache = self._cache(out)
        return out.logits[:, -1]

    def keep_rows(self, keep: torch.Tensor, t: int) -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.pos = self.mask[keep], self.pos[keep]
