"""The typed config: YAML + dotted overrides, presets, and one-line errors that say what to change."""

import pytest

from grpokit.config.schema import ConfigError, GRPOConfig, build_config, load_config

BAD = [
    ({"loss.betta": 0.1}, "unknown config key 'loss.betta' (did you mean 'loss.beta'?)"),
    ({"num_generation": 4}, "unknown config key 'num_generation' (did you mean 'num_generations'?)"),
    ({"rollout.num_generations": 1},
     "rollout.num_generations must be >= 2 (GRPO compares completions within a group), got 1"),
    ({"optim.micro_batch_size": 5},
     "optim.micro_batch_size (5) must divide the generation batch prompts_per_step * num_generations = 32"),
    ({"loss.epsilon": 1.5}, "loss.epsilon must be in (0, 1), got 1.5"),
    ({"loss.epsilon": 0.0}, "loss.epsilon must be in (0, 1), got 0.0"),
    ({"loss.beta": -0.1}, "loss.beta must be >= 0 (0 disables the KL penalty), got -0.1"),
    ({"optim.learning_rate": 0}, "optim.learning_rate must be > 0, got 0.0"),
    ({"rollout.max_completion_length": 0}, "rollout.max_completion_length must be > 0, got 0"),
    ({"rollout.max_prompt_length": -3}, "rollout.max_prompt_length must be > 0, got -3"),
    ({"loss.loss_type": "grp"},
     "loss.loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo, got 'grp' (did you "
     "mean 'grpo'?)"),
    ({"loss.beta": "high"}, "loss.beta must be a float, got 'high': change it to a float"),
    ({"rollout.num_generations": 2.5}, "rollout.num_generations must be a int, got 2.5: change it to a int"),
    ({"loss.epsilon_high": 0.1}, "loss.epsilon_high (0.1) must be >= loss.epsilon (0.2)"),
    ({"loss.num_iterations": 0}, "loss.num_iterations (mu) must be >= 1, got 0"),
    ({"preset": "dapoo"},
     "unknown preset 'dapoo' (did you mean 'dapo'?): choose one of paper, dr_grpo, dapo, gspo"),
    ({"rollout.temperature": 0}, "rollout.temperature must be > 0, got 0.0"),
    ({"rollout.top_p": 1.5}, "rollout.top_p must be in (0, 1], got 1.5"),
    ({"loss": 3}, "'loss' is a section: set its fields as loss.<field>=value"),
    ({"task.name": "jsonl"}, "task.path is required for task.name=jsonl: give the jsonl file"),
    ({"loss.scale_rewards": "std"}, "loss.scale_rewards must be one of group, batch, none, got 'std'"),
    ({"run.max_steps": 0}, "run.max_steps must be >= 1, got 0"),
    ({"reward.funcs": {}}, "reward.funcs is empty: name at least one reward, e.g. {rule: 1.0}"),
]


@pytest.mark.parametrize("values,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_config_gives_one_line_message(values, message):
    with pytest.raises(ConfigError) as e:
        build_config(values)
    assert str(e.value) == message
    assert "\n" not in str(e.value)


def test_defaults_are_the_paper():
    cfg = GRPOConfig()
    assert (cfg.loss.beta, cfg.loss.epsilon, cfg.loss.num_iterations) == (0.04, 0.2, 1)
    assert (cfg.loss.loss_type, cfg.loss.scale_rewards,
            cfg.loss.importance_sampling_level) == ("grpo", "group", "token")
    assert cfg.optim.learning_rate == 1e-6


def test_yaml_then_dotted_and_bare_overrides(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_text("loss:\n  beta: 0.1\nrollout:\n  num_generations: 4\n")
    cfg = load_config(p, ["loss.beta=0.0", "epsilon=0.3", "reward.funcs={accuracy: 1.0, format: 0.5}"])
    assert cfg.loss.beta == 0.0 and cfg.loss.epsilon == 0.3 and cfg.rollout.num_generations == 4
    assert cfg.reward.funcs == {"accuracy": 1.0, "format": 0.5}


def test_preset_fills_defaults_and_explicit_keys_win():
    cfg = build_config({"preset": "dapo", "loss.loss_type": "grpo"})
    assert cfg.loss.epsilon_high == 0.28 and cfg.loss.beta == 0.0 and cfg.rollout.dynamic_sampling
    assert cfg.loss.loss_type == "grpo"


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("loss: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="is not key=value"):
        load_config(None, ["beta"])


def test_each_choice_is_declared_once_and_help_validation_and_switch_derive_from_it():
    import dataclasses
    import typing

    from grpokit.config import choices as ch
    from grpokit.config.schema import LossConfig
    from grpokit.config.validation import choices
    from grpokit.core.advantages import SCALE_MODES
    from grpokit.core.loss import LOSS_TYPES

    found = choices(GRPOConfig())
    assert found["loss.loss_type"] == typing.get_args(ch.LossType) == LOSS_TYPES
    assert found["loss.scale_rewards"] == typing.get_args(ch.ScaleRewards) == SCALE_MODES
    assert len(found) == 27 and found["model.bnb_4bit_quant_type"] == ("nf4", "fp4")
    assert found["run.ddp_backend"] == ("auto", "nccl", "gloo", "mpi")
    assert found["run.log_level"][0] == "passive"
    from grpokit.sandbox import MODES

    assert found["reward.sandbox"] == MODES == ("bwrap", "process")
    assert found["rollout.backend"] == ("auto", "fast", "generate", "vllm")
    help_text = {f.name: f.metadata["help"] for f in dataclasses.fields(LossConfig)}
    assert help_text["loss_type"].startswith("grpo (eq. 3) | bnpo | dr_grpo | dapo (token mean over the "
                                             "batch) | "
                                             "cispo (MiniMax-M1) | sapo (soft gate) |")
    with pytest.raises(ConfigError, match=r"loss.loss_type must be one of grpo, bnpo, dr_grpo, dapo.*'dapo'"):
        build_config({"loss.loss_type": "dapoo"})
    with pytest.raises(ConfigError, match="rm.objective must be one of pointwise, pairwise"):
        GRPOConfig(rm=dataclasses.replace(GRPOConfig().rm, objective="listwise"))
