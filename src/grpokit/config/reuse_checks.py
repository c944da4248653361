"""rollout.steps_per_generation (generation reuse, grpokit.train.generations) and optim.padding_free (packed
updates, grpokit.model.packing): their ranges and the modes they cannot run with, checked with the rest by
`grpokit.config.validation.validate`."""

from __future__ import annotations

from typing import Any

from grpokit.errors import ConfigError


def check_generation_reuse(cfg: Any) -> None:
    """k >= 1; with k > 1 no asynchronous worker, no PPO critic, no dynamic sampling, no forced activation
    reuse."""
    r, k = cfg.rollout, cfg.rollout.steps_per_generation
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"rollout.steps_per_generation must be an integer >= 1 (1 = sample every step), "
                          f"got {k!r}")
    if k == 1:
        return
    refused = {
        "rollout.async.max_staleness": (r.async_max_staleness is not None,
                                        "the worker samples one step's batch per policy version"),
        "loss.algorithm=ppo": (cfg.loss.algorithm == "ppo", "the critic baseline samples every step"),
        "rollout.dynamic_sampling": (r.dynamic_sampling, "it may keep fewer than k x prompts_per_step "
                                     "groups, so the k slices would not hold prompts_per_step groups each"),
        "rollout.reuse_activations=true": (r.reuse_activations is True,
                                           "the sampler's record holds the sampling weights' activations, "
                                           "stale after the generation's first step; auto turns it off"),
    }
    refuse_combinations(f"rollout.steps_per_generation={k}", "rollout.steps_per_generation=1", refused)


def check_padding_free(cfg: Any) -> None:
    """A token budget >= 0, and only on packed updates; packed updates without forced activation reuse
    (the record is the sampler's padded rows) or the PPO critic (its value head runs padded rows)."""
    o = cfg.optim
    if o.max_tokens_per_micro_batch < 0:
        raise ConfigError(f"optim.max_tokens_per_micro_batch must be >= 0 (0 = by rows), got "
                          f"{o.max_tokens_per_micro_batch}")
    if o.max_tokens_per_micro_batch and not o.padding_free:
        raise ConfigError("optim.max_tokens_per_micro_batch budgets packed micro-batches: set "
                          "optim.padding_free=true too, or leave it 0")
    if not o.padding_free:
        return
    refuse_combinations("optim.padding_free=true", "optim.padding_free=false", {
        "rollout.reuse_activations=true": (cfg.rollout.reuse_activations is True,
                                           "the record replays the sampler's padded rows; auto skips it"),
        "loss.algorithm=ppo": (cfg.loss.algorithm == "ppo", "the critic's value head runs padded rows"),
    })


def refuse_combinations(setting: str, undo: str, refused: dict[str, tuple[bool, str]]) -> None:
    """The first of `refused` (other setting -> (is it on, why not)) that is on, as one ConfigError line."""
    for key, (on, why) in refused.items():
        if on:
            raise ConfigError(f"{setting} with {key}: not supported ({why}): set {undo} or drop the other")
