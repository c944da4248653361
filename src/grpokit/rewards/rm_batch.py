"""What the outcome and the process reward model share when they score a batch.

    model.to(rm_device("auto", policy_device))        # auto = the policy's device
    limit = input_limit(model, max_length, name)      # rm.max_length, else max_position_embeddings
    enc = encode(tokenizer, texts, limit=limit, ...)  # right padding; an over-long text is an error
    with scoring(model, "bf16") as device:            # eval mode, inference_mode, bf16 autocast
        logits = model(**{k: v.to(device) for k, v in enc.items()}).logits

Precision: bf16 is autocast over the forward; the weights stay as they are (fp32), because the
iterative loop (Algorithm 1) trains the same model in place between policy iterations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from grpokit.errors import ConfigError
from grpokit.model.devices import resolve_device
from grpokit.rewards.calls import RewardError

TRANSFORMS = ("none", "sigmoid")
PRECISIONS = ("fp32", "bf16")


def rm_device(device: str | torch.device | None,
              policy_device: str | torch.device | None = None) -> torch.device:
    """Where a reward model runs: the device given, or (auto) the policy's, else this rank's device
    (`grpokit.model.devices.resolve_device`: CUDA when visible, cuda:LOCAL_RANK under a launcher)."""
    if isinstance(device, torch.device):
        return device
    if device in (None, "auto") and policy_device is not None:
        return torch.device(policy_device)
    try:
        return resolve_device(device or "auto", where="rm.device", per_rank=False)
    except ConfigError as e:
        raise RewardError(str(e)) from None


def rm_autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16: torch.autocast over the forward (weights untouched); fp32: nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def scoring(model: torch.nn.Module, precision: str) -> Iterator[torch.device]:
    """A scoring pass over `model` as it is now: eval mode, inference_mode, the precision's autocast.

    Yields the model's device. Its previous train/eval mode is restored afterwards, so a model that is
    being trained between calls (Algorithm 1) is left as its trainer had it.
    """
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    try:
        with torch.inference_mode(), rm_autocast(device, precision):
            yield device
    finally:
        model.train(was_training)


def check_options(*, precision: str, transform: str, batch_size: int, max_length: int) -> None:
    """The scoring options a model object gets outside the validated config (the Python API)."""
    if precision not in PRECISIONS:
        raise RewardError(f"reward-model precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if transform not in TRANSFORMS:
        raise RewardError(f"reward-model transform must be one of {', '.join(TRANSFORMS)}, got {transform!r}")
    if batch_size < 1 or max_length < 0:
        raise RewardError(f"reward-model batch_size must be >= 1 and max_length >= 0, got {batch_size} "
                          f"and {max_length}")


def check_head(model: torch.nn.Module, kind: str, name: str) -> None:
    """A reward model of `kind` has the matching scalar head: one label, the right architecture class."""
    want = "ForSequenceClassification" if kind == "outcome" else "ForTokenClassification"
    cls = type(model).__name__
    if not cls.endswith(want):
        raise RewardError(f"reward model '{name}' is a {cls}, not a *{want} ({kind} reward model): "
                          "train one with `grpokit rm train`")
    labels = getattr(getattr(model, "config", None), "num_labels", 1)
    if labels != 1:
        raise RewardError(f"reward model '{name}' has {labels} labels: a reward model has one (its logit is "
                          "the score); train one with `grpokit rm train`")


def input_limit(model: torch.nn.Module, max_length: int, name: str) -> tuple[int | None, str]:
    """The longest input in tokens and the setting it comes from: rm.max_length, else the model's
    max_position_embeddings (None when it has none)."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if max_length and positions and max_length > positions:
        raise RewardError(f"rm.max_length={max_length} is more than reward model '{name}' takes "
                          f"(max_position_embeddings={positions}): set rm.max_length<={positions} or 0")
    if max_length:
        return max_length, "rm.max_length"
    return positions, "max_position_embeddings"


def prepare_tokenizer(model: torch.nn.Module, tokenizer: Any) -> None:
    """A pad token (EOS when missing) on the tokenizer and the model config (HF pools at the last non-pad)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = getattr(model, "config", None)
    if config is not None and config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id


def encode(tokenizer: Any, texts: list[str], *, limit: tuple[int | None, str],
           name: str) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask [b, L] for texts (no special tokens added: a chat template
    writes its own). Raises RewardError for a text over the limit (see `pad_right`)."""
    ids = [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return pad_right(ids, tokenizer.pad_token_id, limit=limit, name=name)


def pad_right(ids: list[list[int]], pad_id: int, *, limit: tuple[int | None, str],
              name: str) -> dict[str, torch.Tensor]:
    """Token id lists as right-padded input_ids / attention_mask [b, L].

    Raises:
        RewardError: a list is longer than the limit; the message names both lengths and what to change.
    """
    most, source = limit
    longest = max((len(x) for x in ids), default=0)
    if most is not None and longest > most:
        fix = ("raise rm.max_length (up to the model's max_position_embeddings) or shorten" if source ==
               "rm.max_length" else "use a reward model with more positions or shorten")
        raise RewardError(f"reward model '{name}': an input has {longest} tokens, more than its "
                          f"{source}={most}: {fix} prompts and completions (rollout.max_prompt_length, "
                          "rollout.max_completion_length)")
    width = max(longest, 1)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)  # [b, L]
    mask = torch.zeros((len(ids), width), dtype=torch.long)              # [b, L]
    for i, row in enumerate(ids):
        input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, :len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def squash(logits: torch.Tensor, transform: str) -> torch.Tensor:
    """The score from the head's logit: the logit itself (none) or sigmoid(logit), a probability."""
    logits = logits.float()
    return torch.sigmoid(logits) if transform == "sigmoid" else logits
