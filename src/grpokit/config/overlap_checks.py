"""reward.overlap (the rewards scored on a thread beside the step's reference / pi_old passes,
grpokit.train.collect.Scoring): the modes it cannot run with, checked with the rest by
`grpokit.config.validation.validate`.

What composes, and why: no reward reads the reference's log-probs (loss.kl_in_reward subtracts
beta * KL in the advantage phase, after the scores are in), so no reward waits on a pass; generation
reuse (rollout.steps_per_generation > 1) scores its whole generation beside that generation's passes;
rollout.async scores the worker's batch on the trainer's side, as without overlap; tools / environments
and MCTS rollouts hand their finished rollout to the rewards, which the passes do not touch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpokit.config.reuse_checks import refuse_combinations
from grpokit.errors import ConfigError


def _shares_device(cfg: Any) -> bool:
    """A learned reward model ('rm:PATH', or a bare folder) that may run on the policy's device."""
    learned = [n for n in cfg.reward.funcs if str(n).startswith("rm:") or Path(str(n)).expanduser().is_dir()]
    devices = {cfg.rm.device, cfg.model.device}
    return bool(learned) and ("auto" in devices or len(devices) == 1)


def check_reward_overlap(cfg: Any) -> None:
    """reward.overlap is a bool; with it on no dynamic sampling, no PPO baseline, no learned reward model
    on the policy's device."""
    on = cfg.reward.overlap
    if not isinstance(on, bool):
        raise ConfigError(f"reward.overlap must be true or false, got {on!r}")
    if not on:
        return
    refused = {
        "rollout.dynamic_sampling": (cfg.rollout.dynamic_sampling,
                                     "its rewards decide which groups to keep, and whether to sample "
                                     "again, before the step can go on"),
        "loss.algorithm=ppo": (cfg.loss.algorithm == "ppo",
                               "the PPO baseline's step (grpokit.train.ppo) scores before its passes"),
        "a learned reward model on the policy's device": (
            _shares_device(cfg),
            "its forward would run in a thread beside the reference's on one device: on a GPU both queue "
            "on the same stream, so nothing overlaps, and both hold their activations at once; on the CPU "
            "they split the same cores; set model.device and rm.device to two different devices"),
    }
    refuse_combinations("reward.overlap=true", "reward.overlap=false", refused)
