"""Training behaviours TRL's GRPOTrainer tests check: a run ends with transformers' last log row
(train_loss), and every trainable weight moved (or, where TRL expects it, did not)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from conformance_helpers import SKIP, length_reward, snapshot, train_and_check, unchanged, unique_letters


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3_moe"])
def test_train(impl, models, data, arch):
    trainer = impl.GRPOTrainer(
        model=getattr(models, arch), reward_funcs=models.reward, args=impl.args(), train_dataset=data.train
    )
    train_and_check(trainer)
    if trainer.aux_loss_enabled:  # an MoE model with its router loss on
        assert trainer.state.log_history[-1]["aux_loss"] is not None


@pytest.mark.parametrize("fmt", ["standard", "conversational"])
def test_train_dataset_format(impl, models, data, fmt):
    dataset = data.train if fmt == "standard" else data.conversational
    train_and_check(
        impl.GRPOTrainer(
            model=models.qwen2, reward_funcs=models.reward, args=impl.args(), train_dataset=dataset
        )
    )


@pytest.mark.parametrize("loss_type", ["bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_train_loss_types(impl, models, data, loss_type):
    args = impl.args(
        loss_type=loss_type,
        gradient_accumulation_steps=2,
        max_completion_length=16,
        importance_sampling_level="sequence" if loss_type == "luspo" else "token",
    )
    train_and_check(
        impl.GRPOTrainer(model=models.qwen2, reward_funcs=unique_letters, args=args, train_dataset=data.train)
    )


@pytest.mark.parametrize(
    "options",
    [
        {"num_iterations": 2},
        {"beta": 0.1},
        {"beta": 0.1, "use_bias_correction_kl": True},
        {"delta": 2.0},
        {"num_iterations": 2, "importance_sampling_level": "sequence"},
        {"pad_to_multiple_of": 8},
        {"dataloader_num_workers": 2},
        {"off_policy_mask_threshold": 0.5},
        {"top_entropy_quantile": 0.2},
        {"multi_objective_aggregation": "normalize_then_sum"},
        {"top_p": 0.9, "top_k": 10, "min_p": 0.01, "repetition_penalty": 1.1},
        {"generation_kwargs": {"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}},
        {"num_generations": 6, "gradient_accumulation_steps": 2},
    ],
    ids=[
        "multiple_iterations",
        "beta_non_zero",
        "bias_correction_kl",
        "delta_clipping",
        "sequence_is",
        "pad_to_multiple_of",
        "dataloader_workers",
        "off_policy_mask",
        "entropy_filter",
        "normalize_then_sum",
        "additional_generation_kwargs",
        "generation_kwargs",
        "num_generations_larger_than_batch",
    ],
)
def test_train_with_option(impl, models, data, options):
    funcs = [unique_letters, length_reward] if "multi_objective_aggregation" in options else models.reward
    train_and_check(
        impl.GRPOTrainer(
            model=models.qwen2, reward_funcs=funcs, args=impl.args(**options), train_dataset=data.train
        )
    )


@pytest.mark.parametrize("scale_rewards", [False, "group", "batch", True, "none"])
def test_train_scale_rewards(impl, models, data, scale_rewards):
    train_and_check(
        impl.GRPOTrainer(
            model=models.qwen2,
            reward_funcs=models.reward,
            args=impl.args(scale_rewards=scale_rewards),
            train_dataset=data.train,
        )
    )


def test_train_iterable_dataset(impl, models, data):
    stream = data.train.to_iterable_dataset()
    trainer = impl.GRPOTrainer(
        model=models.qwen2, reward_funcs=models.reward, args=impl.args(max_steps=2), train_dataset=stream
    )
    train_and_check(trainer)


def test_train_reward_functions(impl, models, data):
    """Plain, async and model rewards together, one of them abstaining (None), with weights; the last row
    reports each function's mean and std."""

    async def async_unique(completions, **kwargs):
        await asyncio.sleep(0)
        return unique_letters(completions)

    def abstains(completions, **kwargs):
        return [None] * len(completions)

    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        args=impl.args(reward_weights=[0.7, 0.3, 1.0, 1.0]),
        reward_funcs=[length_reward, async_unique, abstains, models.reward],
        train_dataset=data.train,
    )
    train_and_check(trainer)
    last = trainer.state.log_history[-1]
    for name in ("length_reward", "async_unique"):
        assert f"rewards/{name}/mean" in last and f"rewards/{name}/std" in last


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_reward_metric_reflects_reward_weights(impl, models, data, aggregation):
    def one(completions, **kwargs):
        return [1.0] * len(completions)

    def zero(completions, **kwargs):
        return [0.0] * len(completions)

    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=[one, zero],
        train_dataset=data.train,
        args=impl.args(reward_weights=[0.7, 0.3], multi_objective_aggregation=aggregation),
    )
    trainer.train()
    assert abs(trainer.state.log_history[-1]["reward"] - 0.7) < 1e-5


def test_train_conversational_reward_function_and_extra_column(impl, models, data):
    dataset = data.conversational.add_column("some_values", list(range(len(data.conversational))))
    seen = {}

    def close_to_value(completions, some_values, trainer_state, **kwargs):
        seen.update(step=trainer_state.global_step, content=completions[0][0]["content"])
        return [float(abs(len(c[0]["content"]) - v)) for c, v in zip(completions, some_values)]

    train_and_check(
        impl.GRPOTrainer(
            model=models.qwen2, reward_funcs=close_to_value, args=impl.args(), train_dataset=dataset
        )
    )
    assert isinstance(seen["content"], str) and seen["step"] >= 0


def test_train_different_reward_model(impl, models, data):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    reward_model = AutoModelForSequenceClassification.from_pretrained(models.reward_llama)
    reward_tokenizer = AutoTokenizer.from_pretrained(models.reward_llama)
    train_and_check(
        impl.GRPOTrainer(
            model=models.qwen2,
            reward_funcs=reward_model,
            args=impl.args(),
            train_dataset=data.conversational,
            reward_processing_classes=reward_tokenizer,
        )
    )


def test_train_with_sync_ref_model(impl, models, data):
    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=models.reward,
        train_dataset=data.train,
        args=impl.args(beta=0.1, sync_ref_model=True, ref_model_sync_steps=2),
    )
    assert trainer.ref_model is not None
    before_ref = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    train_and_check(trainer)
    assert [n for n, p in before_ref.items() if torch.equal(p, trainer.ref_model.get_parameter(n))] == []


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_train_with_cast_lm_head_to_fp32(impl, models, data, tied):
    args = impl.args(cast_lm_head_to_fp32=True, model_init_kwargs={"dtype": "bfloat16"})
    trainer = impl.GRPOTrainer(
        model=models.qwen2_tied if tied else models.llama,
        reward_funcs=models.reward,
        args=args,
        train_dataset=data.train,
    )
    train_and_check(trainer)
    assert trainer.model.lm_head.weight.dtype == torch.float32


def test_train_with_static_entropy(impl, models, data):
    trainer = train_and_check(
        impl.GRPOTrainer(
            model=models.qwen2,
            reward_funcs=models.reward,
            args=impl.args(entropy_coef=0.1),
            train_dataset=data.train,
        )
    )
    last = trainer.state.log_history[-1]
    assert last["policy_loss"] is not None and last["entropy_coef"] is not None


def test_train_with_adaptive_entropy(impl, models, data):
    args = impl.args(entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=15.0)
    trainer = train_and_check(
        impl.GRPOTrainer(model=models.qwen2, reward_funcs=models.reward, args=args, train_dataset=data.train)
    )
    assert trainer.state.log_history[-1]["entropy_coef"] is not None and trainer.entropy_coef > 0.01


def test_train_with_adaptive_entropy_gradient_accumulation(impl, models, data):
    args = impl.args(
        entropy_coef=0.01,
        use_adaptive_entropy=True,
        entropy_target=15.0,
        entropy_coef_delta=0.005,
        gradient_accumulation_steps=2,
    )
    trainer = train_and_check(
        impl.GRPOTrainer(model=models.qwen2, reward_funcs=models.reward, args=args, train_dataset=data.train)
    )
    assert trainer.entropy_coef == pytest.approx(min(0.01 + 0.005 * trainer.state.global_step, 1.0), abs=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "luspo"])
def test_entropy_bonus_scale(impl, models, data, loss_type):
    """With one micro-batch the bonus is entropy_coef x the mean token entropy, for every loss type."""
    args = impl.args(
        entropy_coef=0.5,
        loss_type=loss_type,
        max_completion_length=16,
        logging_steps=1,
        importance_sampling_level="sequence" if loss_type == "luspo" else "token",
    )
    trainer = impl.GRPOTrainer(
        model=models.qwen2, reward_funcs=models.reward, args=args, train_dataset=data.train
    )
    trainer.train()
    rows = [h for h in trainer.state.log_history if "policy_loss" in h and "loss" in h and h.get("entropy")]
    ratios = sorted((h["policy_loss"] - h["loss"]) / h["entropy"] for h in rows)
    assert rows and ratios[len(ratios) // 2] == pytest.approx(0.5, rel=0.3)


def test_train_with_mask_truncated_completions(impl, models, data):
    """Completions that end (an EOS-biased model) keep training with the truncated ones masked (dapo)."""
    train_and_check(
        impl.GRPOTrainer(
            model=models.ends_early,
            reward_funcs=unique_letters,
            train_dataset=data.train,
            args=impl.args(mask_truncated_completions=True, loss_type="dapo"),
        )
    )


def test_train_with_mask_truncated_completions_all_masked(impl, models, data):
    """A model that never ends a completion: every one is masked, no weight moves."""
    trainer = impl.GRPOTrainer(
        model=models.never_ends,
        reward_funcs=unique_letters,
        train_dataset=data.train,
        args=impl.args(mask_truncated_completions=True),
    )
    before = snapshot(trainer)
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert len(unchanged(trainer, before)) == len(before)


def test_train_with_chat_template_kwargs(impl, models, data):
    seen = []

    def prompts_seen(prompts, completions, **kwargs):
        seen.extend(prompts)
        return unique_letters(completions)

    train_and_check(
        impl.GRPOTrainer(
            model=models.qwen2,
            reward_funcs=prompts_seen,
            train_dataset=data.conversational,
            args=impl.args(chat_template_kwargs={"enable_thinking": False}),
        )
    )
    assert seen and isinstance(seen[0], list)


def test_reward_function_hooks(impl, models, data):
    """trainer_state, log_extra (into _logs['extra']) and log_metric (into log_history) reach rewards."""

    def hooked(completions, trainer_state, log_extra, log_metric, **kwargs):
        assert hasattr(trainer_state, "global_step")
        log_extra("test_column", [str(c)[:5] for c in completions])
        log_metric("custom_accuracy", 0.75)
        return unique_letters(completions)

    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=hooked,
        args=impl.args(log_completions=True),
        train_dataset=data.train,
    )
    trainer.train()
    assert "test_column" in trainer._logs["extra"]
    assert "custom_accuracy" in {k for row in trainer.state.log_history for k in row}


@pytest.mark.parametrize("how", ["peft_config", "peft_model", "peft_gradient_checkpointing"])
def test_train_peft(impl, models, data, how):
    """LoRA: every adapter weight moves, no base weight does."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(models.qwen2, dtype="float32")
    base = {f"base_model.model.{n}" for n, _ in model.named_parameters()}
    config = peft.LoraConfig(target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(model, config) if how == "peft_model" else model
    trainer = impl.GRPOTrainer(
        model=model,
        reward_funcs=models.reward,
        train_dataset=data.train,
        args=impl.args(gradient_checkpointing=how == "peft_gradient_checkpointing"),
        peft_config=None if how == "peft_model" else config,
    )
    before = snapshot(trainer)
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    moved = {n for n in before if n not in unchanged(trainer, before)}
    assert not moved & base  # the base weights stay
    assert {n for n in before if "lora" in n and ".ref." not in n} <= moved  # every adapter weight moves


@pytest.mark.skip(reason=SKIP["liger"])
@pytest.mark.parametrize(
    "case",
    [
        "loss_types",
        "bias_correction_kl",
        "delta_clipping",
        "off_policy_mask",
        "vllm_is_ratio",
        "peft_lm_head",
        "peft_non_lm_head",
        "peft_modules_to_save",
        "peft_prompt_learning",
    ],
)
def test_liger_kernel(case):
    """TRL's use_liger_kernel variants (liger-kernel is not installed here, and grpokit refuses the field)."""
