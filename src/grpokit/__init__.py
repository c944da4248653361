"""grpokit: readable, tested GRPO (Group Relative Policy Optimization, DeepSeekMath) for causal LMs.

The public API keeps the names of the DeepSeekMath GRPO chapter's code map:

    [A] sample_groups                  grpokit.rollout.groups
    [B] rule_reward, score_responses   grpokit.rewards.scoring
    [C] group_advantages               grpokit.core.advantages
    [D] per_token_logprobs             grpokit.model.logprobs
    [E-F] grpo_objective_from_logprobs grpokit.core.loss (grpo_loss, with the forward passes: train.update)
    [G] train_step                     grpokit.train.step
    [H] train_grpo                     grpokit.train.loop

Each name is imported from its module on first use (PEP 562), so `import grpokit.core.loss` loads the
pure math alone, not the trainer, the sampler or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {  # public name -> the module that defines it
    "sample_groups": "rollout.groups", "Rollout": "rollout.groups",
    "rule_reward": "rewards.scoring", "score_responses": "rewards.scoring",
    "group_advantages": "core.advantages", "process_advantages": "core.advantages",
    "per_token_logprobs": "model.logprobs",
    "grpo_objective_from_logprobs": "core.loss", "grpo_loss": "train.update", "k3_kl": "core.loss",
    "train_step": "train.step", "train_grpo": "train.loop",
    "GRPOConfig": "config.schema", "ConfigError": "config.schema", "build_config": "config.schema",
    "load_config": "config.schema",
}
__all__ = list(_PUBLIC)

def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'grpokit' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
