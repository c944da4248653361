"""TRL's steps_per_generation / generation_batch_size map to rollout.steps_per_generation (issue 56 item 3):
k = steps_per_generation / gradient_accumulation_steps; other values are one-line errors, TRL's words
where TRL raises."""

from __future__ import annotations

import pytest

from grpokit.config.schema import ConfigError, build_config
from grpokit.trl import GRPOConfig
from grpokit.trl.translate import translate


def k_of(**kw) -> int:
    t = translate(GRPOConfig(max_steps=4, **kw), num_prompts=64)
    cfg = build_config(t.overrides)     # a valid grpokit config
    return cfg.rollout.steps_per_generation


def test_unset_is_one_step_per_generation():
    assert k_of() == 1
    assert k_of(per_device_train_batch_size=4, gradient_accumulation_steps=2) == 1
    assert k_of(steps_per_generation=2, gradient_accumulation_steps=2, per_device_train_batch_size=4) == 1


def test_steps_per_generation_counts_micro_steps():
    # 4 micro-steps per generation, 2 per optimizer step: 2 optimizer steps per generation
    t = translate(GRPOConfig(max_steps=4, steps_per_generation=4, gradient_accumulation_steps=2,
                             per_device_train_batch_size=8), num_prompts=64)
    o = t.overrides
    assert o["rollout.steps_per_generation"] == 2
    assert o["rollout.prompts_per_step"] == 2 and o["optim.micro_batch_size"] == 8   # 16 completions a step
    assert k_of(steps_per_generation=3) == 3


def test_generation_batch_size_counts_completions():
    # 32 completions per generation, 8 per optimizer step (one micro-step each): 4 steps per generation
    assert k_of(generation_batch_size=32, per_device_train_batch_size=8) == 4
    assert k_of(generation_batch_size=32, per_device_train_batch_size=8, gradient_accumulation_steps=2) == 2
    # TRL's __post_init__ fills both fields, consistently: accepted
    assert k_of(generation_batch_size=32, steps_per_generation=4, per_device_train_batch_size=8) == 4


@pytest.mark.parametrize(("kw", "match"), [
    ({"steps_per_generation": 3, "gradient_accumulation_steps": 2},
     "steps_per_generation=3 is not supported .*multiple of gradient_accumulation_steps=2"),
    ({"generation_batch_size": 24, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 8},
     "generation_batch_size=24 is not supported .*multiple of 16"),
    ({"generation_batch_size": 12, "per_device_train_batch_size": 8},
     r"generation_batch_size \(12\) must be divisible by the global batch size \(8\)"),    # TRL's words
    ({"generation_batch_size": 16, "steps_per_generation": 4, "per_device_train_batch_size": 8},
     "can not be both configured at the same time"),                                        # TRL's words
    ({"steps_per_generation": 0}, "steps_per_generation=0 is not supported"),
])
def test_other_values_are_one_line_errors(kw, match):
    with pytest.raises(ConfigError, match=match) as err:
        translate(GRPOConfig(max_steps=4, **kw), num_prompts=64)
    assert "\n" not in str(err.value)


def test_a_real_trl_config_maps_the_same():
    trl = pytest.importorskip("trl")
    import warnings

    kw = dict(output_dir="o", bf16=False, max_steps=5, report_to="none", per_device_train_batch_size=8,
              gradient_accumulation_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_steps = trl.GRPOConfig(steps_per_generation=6, **kw)         # TRL fills generation_batch_size=48
        by_size = trl.GRPOConfig(generation_batch_size=48, **kw)        # and steps_per_generation=6
    for theirs in (by_steps, by_size):
        t = translate(theirs, num_prompts=64)
        assert t.overrides["rollout.steps_per_generation"] == 3
        assert t.overrides == translate(GRPOConfig(steps_per_generation=6, **kw), num_prompts=64).overrides
