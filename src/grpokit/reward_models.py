"""A sequence-classification model as a reward function, the way TRL scores with one.

    reward = RewardModel.from_path("path/to/rm")        # or RewardModel(model, tokenizer)
    reward(prompts=[...], completions=[...])             # -> one float per completion: logits[:, 0]

The model reads prompt + completion as one text: chat prompts go through the reward tokenizer's
chat template with the completion as the assistant turn (TRL's format), plain prompts are joined
with their completion. One label: the score is that logit. Right padding, batches of `batch_size`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .reward_calls import RewardError


def _content(completion: Any) -> str:
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


class RewardModel:
    """A reward function around a `AutoModelForSequenceClassification` with one output label.

    Args:
        model: the classifier (eval mode, no gradients).
        tokenizer: its tokenizer (a pad token is set to EOS when missing).
        batch_size: texts per forward pass.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, batch_size: int = 32) -> None:
        labels = getattr(model.config, "num_labels", 1)
        if labels != 1:
            raise RewardError(f"reward model '{model.config._name_or_path}' has {labels} labels: a reward "
                              "model has one (its logit is the score)")
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self.batch_size = batch_size
        self.__name__ = Path(str(model.config._name_or_path or "reward_model")).name

    @classmethod
    def from_path(cls, path: str | Path, tokenizer: Any = None) -> RewardModel:
        """Load a local reward-model folder (and its tokenizer unless one is given)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
            tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise RewardError(f"reward model '{path}' cannot be loaded: {str(e).splitlines()[0]}") from None
        return cls(model, tokenizer)

    def _text(self, prompt: Any, completion: Any) -> str:
        if isinstance(prompt, list):
            messages = prompt + [{"role": "assistant", "content": _content(completion)}]
            if getattr(self.tokenizer, "chat_template", None):
                return self.tokenizer.apply_chat_template(messages, tokenize=False)
            return "\n".join(str(m["content"]) for m in messages)
        return str(prompt) + _content(completion)

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        texts = [self._text(p, c) for p, c in zip(prompts, completions)]
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for s in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[s:s + self.batch_size], return_tensors="pt", padding=True,
                                 padding_side="right", add_special_tokens=False).to(device)
            scores += self.model(**enc).logits[:, 0].float().tolist()
        return scores
