"""grpokit: readable, tested GRPO (Group Relative Policy Optimization, DeepSeekMath) for causal LMs.

The public API keeps the names of the DeepSeekMath GRPO chapter's code map:

    [A] sample_groups                  grpokit.rollout
    [B] rule_reward, score_responses   grpokit.rewards
    [C] group_advantages               grpokit.advantages
    [D] per_token_logprobs             grpokit.logprobs
    [E-F] grpo_objective_from_logprobs grpokit.loss (grpo_loss wraps it with the forward passes)
    [G] train_step, [H] train_grpo     grpokit.trainer

Each name is imported from its module on first use (PEP 562), so `import grpokit.loss` loads the
pure math alone, not the trainer, the sampler or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {  # public name -> the module that defines it
    "sample_groups": "rollout", "Rollout": "rollout",
    "rule_reward": "rewards", "score_responses": "rewards",
    "group_advantages": "advantages", "process_advantages": "advantages",
    "per_token_logprobs": "logprobs",
    "grpo_objective_from_logprobs": "loss", "grpo_loss": "loss", "k3_kl": "loss",
    "train_step": "trainer", "train_grpo": "trainer",
    "GRPOConfig": "config", "ConfigError": "config", "build_config": "config", "load_config": "config",
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
