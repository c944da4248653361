"""Checks made before a run touches its output folder: the machine, then the loaded inputs.

The config validates its own values when it is built (`grpokit.config.validation`); what it cannot know
is whether this machine has the device it names or the optional packages it needs. `check_environment`
asks before any model is loaded, so that `model.device=cuda:3` on a one-GPU machine or
`optim.optim=adamw_8bit` without bitsandbytes is a one-line `ConfigError`, not a traceback after
minutes of loading. `check_prompts` runs once model, tokenizer and data are loaded, before
`--overwrite` may clear anything: the prompts render (a chat template exists) and, with
rollout.truncate_prompt=error, none is too long.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from grpokit.config.schema import ConfigError, GRPOConfig
from grpokit.model.devices import resolve_device
from grpokit.model.quantized import BNB_HINT
from grpokit.rollout.groups import PromptTooLongError
from grpokit.rollout.vllm_backend import INSTALL_HINT as VLLM_HINT
from grpokit.tasks import TaskError


def check_environment(cfg: GRPOConfig) -> None:
    """Raise ConfigError when this machine lacks the device or a package that `cfg` needs, or the launch
    asks for a combination grpokit does not run."""
    check_device(cfg.model.device)
    for package, message in required_packages(cfg):
        if importlib.util.find_spec(package) is None:
            raise ConfigError(message)


def check_device(name: str) -> None:
    """model.device names a device this machine (and this rank, under a launcher) has; the spelling was
    checked when the config was built. The rules: `grpokit.model.devices`."""
    resolve_device(name)


def required_packages(cfg: GRPOConfig) -> list[tuple[str, str]]:
    """(import name, what to do when it is missing) for each optional package the config uses."""
    out = []
    if cfg.optim.optim == "adamw_8bit":
        out.append(("bitsandbytes", ("optim.optim=adamw_8bit needs bitsandbytes: pip install bitsandbytes, "
                                     "or use optim.optim=adamw")))
    if cfg.rollout.backend == "vllm" and cfg.rollout.vllm_mode == "colocate":  # server: vLLM runs elsewhere
        out.append(("vllm", VLLM_HINT))
    if cfg.model.load_in_4bit or cfg.model.load_in_8bit:
        out.append(("bitsandbytes", BNB_HINT))
    if cfg.model.lora_r > 0:
        out.append(("peft", ("model.lora_r > 0 needs peft: pip install 'grpokit[peft]', "
                             "or set model.lora_r=0")))
    return out


def prompt_tokens(tokenizer, prompt: str | list, chat_template_kwargs: dict) -> int:
    """Tokens of one prompt as `rollout.sample_groups` encodes it (chat messages via the chat template).

    Raises:
        TaskError: chat messages and a tokenizer without a chat template.
    """
    if isinstance(prompt, str):
        return len(tokenizer(prompt)["input_ids"])
    try:
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False,
                                             **chat_template_kwargs)
    except (ValueError, AttributeError, TypeError) as e:
        raise TaskError("cannot apply a chat template with this tokenizer "
                        f"({' '.join(str(e).split())[:120]}): "
                        "set task.chat_template=false or use a tokenizer that has one") from None
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def check_prompts(cfg: GRPOConfig, tokenizer, train: list, evals: list) -> None:
    """The loaded prompts can be encoded: the first of each split renders; with truncate_prompt=error,
    every training prompt fits rollout.max_prompt_length (evaluation checks its own: evaluate.py)."""
    kwargs = cfg.task.chat_template_kwargs
    for examples in (train[:1], evals[:1]):
        for ex in examples:
            prompt_tokens(tokenizer, ex.prompt, kwargs)
    if cfg.rollout.truncate_prompt != "error":
        return
    limit = cfg.rollout.max_prompt_length
    long = [n for n in (prompt_tokens(tokenizer, ex.prompt, kwargs) for ex in train) if n > limit]
    if long:
        raise PromptTooLongError(f"{len(long)} of {len(train)} training prompts have more than "
                                 f"rollout.max_prompt_length={limit} tokens (longest {max(long)}): raise the "
                                 "limit or set rollout.truncate_prompt=left")


def enable_full_determinism() -> None:
    """run.full_determinism (TRL's full_determinism): every op a deterministic kernel, or a RuntimeError
    naming the op that has none. On CUDA, cuBLAS needs a fixed workspace for that
    (CUBLAS_WORKSPACE_CONFIG, read when CUDA starts: set here unless the user set it)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
