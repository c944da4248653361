"""A learned process reward model: one score per reasoning step (DeepSeekMath section 4.1.3).

    prm = ProcessRewardModel(model, tokenizer, step_separator="\\n")   # or load_reward_model(path, cfg.rm)
    prm(prompts, completions, completion_char_ends=[...])   # -> per completion [(token_index, reward), ...]

The model is an `AutoModelForTokenClassification` with one label. For each completion:

    text, start = rm_input(rm_tokenizer, prompt, completion)      # the RM's own text (chat template)
    steps = split_steps(completion, step_separator)               # char spans (s, e) of the steps
    r_j = logit at the RM token holding the step's last non-space char   # step_token_positions
    index(j) = the POLICY token holding char e_j - 1   # from completion_char_ends, as steps_reward

The two tokenizers may cut the text differently; each side is mapped through characters. RM tokens
and their char ends come from `grpokit.rewards.rm_text.rm_tokens` (offset mappings of a fast tokenizer, else
incremental decoding), exactly as training reads them, so a step is scored where it was trained.
The separator's trailing whitespace is left out of the RM position (a "\n" separator is not the
scored token); the policy index is the step's end, separator included, as `steps_reward` places it.
One forward per batch of completions scores every step of each.
The pairs feed `grpokit.core.advantages.process_advantages` unchanged, like the rule-based `steps` reward.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import torch

from grpokit.rewards.calls import RewardError
from grpokit.rewards.rm_batch import (
    check_head,
    check_options,
    input_limit,
    pad_right,
    prepare_tokenizer,
    rm_device,
    scoring,
    squash,
)
from grpokit.rewards.rm_text import (
    completion_text,
    rm_input,
    rm_tokens,
    split_steps,
    step_token_positions,
)


def policy_token(char_ends: list[int], end: int) -> int:
    """The policy token holding char end-1 of the completion: the first token t with char_ends[t] >= end."""
    return min(bisect.bisect_left(char_ends, end), len(char_ends) - 1)


class ProcessRewardModel:
    """A process reward function around an `AutoModelForTokenClassification` with one label.

    `self.model` is read at every call and put in eval mode for it (its previous mode is restored), so
    the model may be trained in place between calls (Algorithm 1).

    Args:
        model: the token classifier; moved to `device` when one is given.
        tokenizer: its own tokenizer (a pad token is set to EOS when missing).
        batch_size: completions per forward pass.
        step_separator: the text that ends a step (`grpokit.rewards.rm_text.split_steps`).
        device, precision, transform, max_length, name, last_turn: as for
            `grpokit.rewards.outcome_rm.RewardModel`.
    """

    kind = "process"
    process = True  # score_responses sends its pairs to process_advantages, not into the outcome total

    def __init__(self, model: torch.nn.Module, tokenizer: Any, batch_size: int = 32, *,
                 step_separator: str = "\n", device: str | torch.device | None = None,
                 precision: str = "fp32", transform: str = "none", max_length: int = 0,
                 name: str | None = None, last_turn: bool = False) -> None:
        self.__name__ = name or Path(str(getattr(model.config, "_name_or_path", "") or "process_rm")).name
        check_head(model, self.kind, self.__name__)
        check_options(precision=precision, transform=transform, batch_size=batch_size, max_length=max_length)
        if not step_separator:
            raise RewardError("a process reward model needs a step separator (rm.step_separator), e.g. '\\n'")
        input_limit(model, max_length, self.__name__)
        prepare_tokenizer(model, tokenizer)
        if device is not None:
            model.to(rm_device(device))
        self.model, self.tokenizer, self.step_separator = model, tokenizer, step_separator
        self.batch_size, self.precision = batch_size, precision
        self.transform, self.max_length, self.last_turn = transform, max_length, last_turn

    def __call__(self, prompts: list, completions: list, completion_char_ends: list | None = None,
                 **kwargs: Any) -> list[list[tuple[int, float]]]:
        if completion_char_ends is None:
            raise RewardError(f"process reward model '{self.__name__}' needs completion_char_ends (the "
                              "policy tokens' char ends, grpokit.rewards.steps.token_char_ends) to place "
                              "step rewards on tokens: score through grpokit's trainer or evaluate, or pass "
                              "them")
        out = []
        for steps, ends in zip(self.score_steps(prompts, completions), completion_char_ends):
            out.append([(policy_token(ends, end), r) for end, r in steps] if ends else [])
        return out

    def score_steps(self, prompts: list, completions: list) -> list[list[tuple[int, float]]]:
        """Per completion, (end char of the step in the completion text, score) for each step."""
        bodies = [completion_text(c) for c in completions]
        inputs = [rm_input(self.tokenizer, p, c, last_turn=self.last_turn)
                  for p, c in zip(prompts, completions)]
        spans = [split_steps(b, self.step_separator) for b in bodies]
        limit = input_limit(self.model, self.max_length, self.__name__)
        out: list[list[tuple[int, float]]] = []
        with scoring(self.model, self.precision) as device:
            for s in range(0, len(inputs), self.batch_size):
                b = slice(s, s + self.batch_size)
                out += self._batch(inputs[b], spans[b], limit, device)
        return out

    def _batch(self, inputs: list[tuple[str, int]], spans: list[list[tuple[int, int]]], limit: tuple,
               device: torch.device) -> list[list[tuple[int, float]]]:
        tokens = [rm_tokens(self.tokenizer, text) for text, _ in inputs]  # (ids, char ends), as in training
        enc = pad_right([ids for ids, _ in tokens], self.tokenizer.pad_token_id, limit=limit,
                        name=self.__name__)
        logits = self.model(input_ids=enc["input_ids"].to(device),
                            attention_mask=enc["attention_mask"].to(device)).logits  # [b, L, 1]
        scores = squash(logits[..., 0], self.transform).cpu()  # [b, L]
        out = []
        for i, ((text, start), steps, (_, ends)) in enumerate(zip(inputs, spans, tokens)):
            at = step_token_positions(text, ends, start, steps) if ends else []
            out.append([(e, float(scores[i, t])) for (_, e), t in zip(steps, at)])
        return out
