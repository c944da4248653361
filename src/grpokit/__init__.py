"""grpokit: readable, tested GRPO (Group Relative Policy Optimization, DeepSeekMath) for causal LMs.

The public API keeps the names of the DeepSeekMath GRPO chapter's code map:

    [A] sample_groups                  grpokit.rollout
    [B] rule_reward, score_responses   grpokit.rewards
    [C] group_advantages               grpokit.advantages
    [D] per_token_logprobs             grpokit.logprobs
    [E-F] grpo_objective_from_logprobs grpokit.loss (grpo_loss wraps it with the forward passes)
    [G] train_step, [H] train_grpo     grpokit.trainer
"""

from .advantages import group_advantages, process_advantages
from .config import ConfigError, GRPOConfig, build_config, load_config
from .logprobs import per_token_logprobs
from .loss import grpo_loss, grpo_objective_from_logprobs, k3_kl
from .rollout import Rollout, sample_groups
from .trainer import train_grpo, train_step

__version__ = "0.1.0"


def __getattr__(name: str):
    # rewards pulls in math-verify; import it only when asked for.
    if name in ("rule_reward", "score_responses"):
        from . import rewards

        return getattr(rewards, name)
    raise AttributeError(name)


__all__ = ["sample_groups", "Rollout", "rule_reward", "score_responses", "group_advantages", "process_advantages",
           "per_token_logprobs", "grpo_objective_from_logprobs", "grpo_loss", "k3_kl", "train_step", "train_grpo",
           "GRPOConfig", "ConfigError", "build_config", "load_config"]
