"""TRL's `steps_per_generation` / `generation_batch_size` -> grpokit's rollout.steps_per_generation (k), the
optimizer steps one generation batch feeds (grpokit.train.generations); `grpokit.trl.translate` calls it."""

from __future__ import annotations

from typing import Any

from grpokit.config.schema import ConfigError
from grpokit.trl.fields import REASONS


def steps_per_generation(v: dict[str, Any], world_size: int) -> int:
    """rollout.steps_per_generation = k = TRL's steps_per_generation / gradient_accumulation_steps: the
    optimizer steps one generation feeds. TRL's own rules first (its __post_init__: generation_batch_size =
    per_device_train_batch_size x ranks x steps_per_generation), then grpokit's: whole optimizer steps."""
    per_device, accum = v["per_device_train_batch_size"], v["gradient_accumulation_steps"]
    spg, gbs, global_batch = v["steps_per_generation"], v["generation_batch_size"], per_device * world_size
    if spg is not None and gbs is not None and gbs != global_batch * spg:   # TRL's post-init: both, equal
        raise ConfigError("'generation_batch_size' and 'steps_per_generation' can not be both configured at "
                          "the same time: set one of them")
    if spg is None and gbs is not None:
        if gbs % global_batch:
            raise ConfigError(f"generation_batch_size ({gbs}) must be divisible by the global batch size "
                              f"({global_batch}): make it a multiple of per_device_train_batch_size x ranks")
        if (gbs // global_batch) % accum:
            raise ConfigError(f"GRPOConfig.generation_batch_size={gbs} is not supported "
                              f"({REASONS['steps']}): make it a multiple of {global_batch * accum} "
                              "(per_device_train_batch_size x ranks x gradient_accumulation_steps), or leave "
                              "it unset")
        spg = gbs // global_batch
    spg = accum if spg is None else int(spg)
    if spg < 1 or spg % accum:
        raise ConfigError(f"GRPOConfig.steps_per_generation={spg} is not supported "
                          f"({REASONS['steps']}): make it a multiple of gradient_accumulation_steps={accum}, "
                          "or leave it unset")
    return spg // accum
