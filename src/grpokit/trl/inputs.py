"""What a TRL program hands the trainer, made into grpokit's: datasets -> Examples, reward_funcs ->
(name, function, weight) triples, a model path or object -> a policy and its tokenizer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grpokit.config.schema import ConfigError
from grpokit.model.loading import load_tokenizer
from grpokit.model.lora import is_peft_model
from grpokit.rewards.outcome_rm import RewardModel, reward_model_for
from grpokit.rewards.process_rm import ProcessRewardModel
from grpokit.rewards.scoring import get_reward_function
from grpokit.tasks.hf import examples_from_rows

IMAGE_COLUMNS = ("image", "images")   # TRL's vision-language dataset columns


def is_iterable_dataset(data: Any) -> bool:
    return type(data).__name__ == "IterableDataset"


def is_dataset_dict(data: Any) -> bool:
    """A dict of datasets (plain, DatasetDict or IterableDatasetDict), not a single dataset."""
    return isinstance(data, dict) or type(data).__name__ in ("DatasetDict", "IterableDatasetDict")


def column_names(data: Any) -> list[str]:
    """A dataset's columns (a list of dicts: its first row's keys; unknown: [])."""
    names = getattr(data, "column_names", None)
    if names is None and isinstance(data, list) and data and isinstance(data[0], dict):
        names = list(data[0])
    return list(names or [])


def refuse_images(data: Any, processing_class: Any, where: str = "train_dataset") -> None:
    """One line for a vision-language setup: grpokit trains text-only models, so images would be dropped
    and the vision tower never updated."""
    found = [c for c in column_names(data) if c in IMAGE_COLUMNS]
    if found:
        raise ConfigError(f"{where} has an '{found[0]}' column: grpokit trains text-only models (the images "
                          "would "
                          f"be ignored and a vision tower never trained); drop the column or use TRL")
    if processing_class is not None and hasattr(processing_class, "image_processor"):
        raise ConfigError(f"processing_class is a multimodal processor ({type(processing_class).__name__}): "
                          "grpokit trains text-only models; pass the processor's tokenizer")


def dataset_examples(data: Any, limit: int | None = None, where: str = "train_dataset") -> list:
    """A datasets.Dataset / IterableDataset (first `limit` rows) / list of dicts as grpokit Examples."""
    if data is None:
        raise ConfigError(f"{where} is required: give a datasets.Dataset or a list of dicts with a 'prompt'")
    if is_dataset_dict(data):
        raise ConfigError(f"{where} is a DatasetDict: pass one split, e.g. dataset['train']")
    rows = itertools.islice(iter(data), limit) if is_iterable_dataset(data) else (
        data.to_list() if hasattr(data, "to_list") else list(data))
    return examples_from_rows(rows, where=where)


def eval_sets(eval_dataset: Any) -> dict[str | None, list]:
    """TRL's eval_dataset as {None: examples} (one set) or {name: examples} (a dict or DatasetDict), each
    refused in one line when it holds images."""
    if eval_dataset is None:
        return {}
    sets = dict(eval_dataset) if is_dataset_dict(eval_dataset) else {None: eval_dataset}
    out = {}
    for name, data in sets.items():
        where = "eval_dataset" if name is None else f"eval_dataset['{name}']"
        refuse_images(data, None, where)
        out[name] = dataset_examples(data, where=where)
    return out


def _unique(name: str, taken: set[str]) -> str:
    out, i = name, 2
    while out in taken:
        out, i = f"{name}_{i}", i + 1
    taken.add(out)
    return out


def _as_function(item: Any, processing_class: Any) -> tuple[str, Callable]:
    """One entry of reward_funcs as (name, callable)."""
    if isinstance(item, (str, Path)):
        fn = get_reward_function(str(item))  # a built-in name, 'module:function' or a reward-model folder
        if isinstance(fn, (RewardModel, ProcessRewardModel)):
            if processing_class is not None:      # the reward tokenizer given for this model
                fn.tokenizer = processing_class
            return fn.__name__, fn
        return str(item), fn
    if isinstance(item, torch.nn.Module):  # a reward model, as in TRL (token classifier: a process RM)
        if processing_class is None:
            processing_class = load_tokenizer(item.config._name_or_path)
        fn = reward_model_for(item, processing_class)
        return fn.__name__, fn
    if callable(item):
        return getattr(item, "__name__", type(item).__name__), item
    raise ConfigError(f"reward_funcs entry {item!r:.60} is not a function, a reward model or a path: "
                      "give a callable(prompts, completions, **kwargs)")


def reward_triples(reward_funcs: Any, weights: list | None, processing_classes: Any,
                   optional: bool = False) -> tuple[list[tuple[str, Callable, float]], list]:
    """TRL's reward_funcs (one or a list), reward_weights and reward_processing_classes as grpokit's
    (name, fn, weight) triples, and the processing classes, one per function (a reward model's own
    tokenizer where none was given; None for plain functions).

    optional: none is fine (an environment's get_reward() is the reward)."""
    items = [] if reward_funcs is None else (
        list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs])
    if not items and optional and not weights:
        return [], []
    if not items:
        raise ConfigError("No reward source provided: pass reward_funcs (a function, a reward model or a "
                          "list "
                          "of them)")
    if weights is not None and len(weights) != len(items):
        raise ConfigError(f"reward_weights has {len(weights)} values for {len(items)} reward functions: "
                          "give one weight per function")
    classes = [None] * len(items) if processing_classes is None else (
        list(processing_classes) if isinstance(processing_classes, (list, tuple)) else [processing_classes])
    if len(classes) != len(items):   # one tokenizer is not reused for several reward models, as in TRL
        raise ConfigError(f"the number of reward_processing_classes ({len(classes)}) must match the number "
                          f"of reward functions ({len(items)}): give a list with one per function (None for "
                          "plain "
                          "functions)")
    taken: set[str] = set()
    out = []
    for i, (item, w) in enumerate(zip(items, weights or [1.0] * len(items))):
        name, fn = _as_function(item, classes[i])
        out.append((_unique(name, taken), fn, float(w)))
        classes[i] = getattr(fn, "tokenizer", None) if classes[i] is None else classes[i]
    return out, classes


def model_name(model: Any) -> str:
    """A name for the config and the model card: the path it came from, else its class."""
    base = getattr(model, "base_model", None) if type(model).__name__ == "PeftModel" else None
    config = getattr(base.model if base is not None else model, "config", None)
    return str(getattr(config, "_name_or_path", "") or type(model).__name__)


def disable_dropout(model: torch.nn.Module) -> None:
    """TRL's disable_dropout: every Dropout module gets p = 0."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def wrap_peft(model: torch.nn.Module, peft_config: Any) -> torch.nn.Module:
    """The model with the adapters of a peft config (a LoraConfig, ...): only they train."""
    if peft_config is None or is_peft_model(model):
        return model
    try:
        import peft
    except ImportError:
        raise ConfigError("peft_config needs peft: pip install 'grpokit[peft]'") from None
    if getattr(peft_config, "is_prompt_learning", False):
        raise ConfigError(f"peft_config is a prompt-learning config ({type(peft_config).__name__}): its "
                          "virtual tokens shift the positions grpokit reads the completion's log-probs "
                          "at: use a LoraConfig")
    if getattr(model, "is_gradient_checkpointing", False):
        model.enable_input_require_grads()   # else checkpointed blocks of frozen weights pass no gradient on
    wrapped = peft.get_peft_model(model, peft_config)
    if isinstance(wrapped.get_output_embeddings(), peft.tuners.tuners_utils.BaseTunerLayer):
        raise ConfigError("Applying a PEFT adapter to `lm_head` is not supported: grpokit computes the "
                          "log-probs from `lm_head.weight` directly (grpokit.model.logprobs), so the adapter "
                          "would never train: remove 'lm_head' from the LoraConfig's target_modules")
    wrapped.train()
    return wrapped


def qlora_keys(overrides: dict[str, Any], peft_config: Any, model: Any) -> dict[str, Any]:
    """grpokit's model.lora_* keys for a base that model_init_kwargs' quantization_config loads quantized
    (TRL's QLoRA recipe): the adapters are peft_config's; {} without quantization.

    Raises:
        ConfigError: the model is already loaded, or no LoRA peft_config is given (a quantized base is
            frozen: only adapters can train).
    """
    if not (overrides.get("model.load_in_4bit") or overrides.get("model.load_in_8bit")):
        return {}
    if not isinstance(model, str):
        raise ConfigError("model_init_kwargs' quantization_config applies to a model given by path, but the "
                          "model is already loaded: pass the path, or load it quantized yourself and unset "
                          "model_init_kwargs")
    if getattr(peft_config, "r", None) is None:
        raise ConfigError("model_init_kwargs' quantization_config freezes the quantized base, so only "
                          "adapters can train: pass peft_config=LoraConfig(...)")
    keys: dict[str, Any] = {"model.lora_r": int(peft_config.r)}
    if getattr(peft_config, "lora_alpha", None) is not None:
        keys["model.lora_alpha"] = int(peft_config.lora_alpha)
    if getattr(peft_config, "lora_dropout", None) is not None:
        keys["model.lora_dropout"] = float(peft_config.lora_dropout)
    if isinstance(peft_config.target_modules, (list, set, tuple)):
        keys["model.lora_target_modules"] = sorted(peft_config.target_modules)
    return keys
