"""What grpokit.trl refuses or warns about, in one line each, before any training: images (a vision-language
setup), a missing train_dataset, one reward tokenizer for several reward models, push_to_hub, and the
transformers-generate options kept out of the saved model."""

from __future__ import annotations

import json
import logging

import pytest

from grpokit.config.schema import ConfigError

datasets = pytest.importorskip("datasets")


def rows(n=8):
    return [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(n)]


def args(tmp_path, **kw):
    from grpokit.trl import GRPOConfig

    values = {
        "output_dir": str(tmp_path),
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_steps": 1,
        "max_completion_length": 4,
        "bf16": False,
        "gradient_checkpointing": False,
        "report_to": "none",
    }
    return GRPOConfig(**{**values, **kw})


def digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("column", ["image", "images"])
def test_an_image_dataset_is_refused_in_one_line(tiny_model, char_tokenizer, tmp_path, column):
    from grpokit.trl import GRPOTrainer

    data = datasets.Dataset.from_list([{**r, column: None} for r in rows()])
    with pytest.raises(ConfigError) as err:
        GRPOTrainer(
            model=tiny_model,
            processing_class=char_tokenizer,
            reward_funcs=digits,
            args=args(tmp_path),
            train_dataset=data,
        )
    assert f"'{column}' column" in one_line(err) and "text-only" in str(err.value)


def test_a_multimodal_processor_is_refused(tiny_model, char_tokenizer, tmp_path):
    from grpokit.trl import GRPOTrainer

    class Processor:  # what a VLM's AutoProcessor carries
        tokenizer, image_processor = char_tokenizer, object()

    with pytest.raises(ConfigError) as err:
        GRPOTrainer(
            model=tiny_model,
            processing_class=Processor(),
            reward_funcs=digits,
            args=args(tmp_path),
            train_dataset=rows(),
        )
    assert "multimodal processor" in one_line(err)


def test_no_train_dataset_is_named_as_such(tiny_model, char_tokenizer, tmp_path):
    from grpokit.trl import GRPOTrainer

    with pytest.raises(ConfigError) as err:  # not an IterableDataset complaint about max_steps
        GRPOTrainer(
            model=tiny_model,
            processing_class=char_tokenizer,
            reward_funcs=digits,
            args=args(tmp_path, max_steps=-1),
        )
    assert one_line(err).startswith("`train_dataset` is required")


def test_one_reward_tokenizer_for_two_reward_models_is_refused(char_tokenizer):
    from grpokit.trl.inputs import reward_triples

    with pytest.raises(ConfigError) as err:
        reward_triples([digits, digits], None, char_tokenizer)
    assert "must match" in one_line(err)
    triples, classes = reward_triples([digits, digits], [0.5, 2.0], [None, None])
    assert [(n, w) for n, _, w in triples] == [("digits", 0.5), ("digits_2", 2.0)] and classes == [None, None]


def test_push_to_hub_is_refused_and_train_returns_transformers_train_output(
    tiny_model, char_tokenizer, tmp_path
):
    from transformers.trainer_utils import TrainOutput

    from grpokit.trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=tiny_model,
        processing_class=char_tokenizer,
        reward_funcs=digits,
        args=args(tmp_path, max_steps=2, logging_steps=1),
        train_dataset=rows(),
    )
    with pytest.raises(ConfigError) as err:
        trainer.push_to_hub()
    assert "writes locally only" in one_line(err)
    out = trainer.train()
    assert isinstance(out, TrainOutput) and out.global_step == 2
    steps = [r for r in trainer.state.log_history if "loss" in r and "train_loss" not in r]
    assert [r["step"] for r in steps] == [1, 2]  # logging_steps=1: a row per step
    last = trainer.state.log_history[-1]
    for key in ("train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second"):
        assert key in last and key in out.metrics
    assert out.training_loss == pytest.approx(sum(r["loss"] for r in steps) / 2)
    # total_flos as transformers estimates it: 6 x non-embedding parameters x the tokens trained on
    tokens = trainer.state.num_input_tokens_seen
    assert tokens > 0 and out.metrics["total_flos"] == pytest.approx(
        6 * tiny_model.num_parameters(exclude_embeddings=True) * tokens)
    assert trainer.state.total_flos == out.metrics["total_flos"]


def test_generation_options_sample_through_generate_and_stay_out_of_the_saved_model(
    tiny_model, char_tokenizer, tmp_path
):
    from grpokit.trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=tiny_model,
        processing_class=char_tokenizer,
        reward_funcs=digits,
        args=args(
            tmp_path,
            min_p=0.05,
            repetition_penalty=1.2,
            generation_kwargs={"top_k": 7, "no_repeat_ngram_size": 2},
        ),
        train_dataset=rows(),
    )
    assert trainer.config.rollout.backend == "generate" and trainer.config.rollout.top_k == 7
    trainer.train()
    saved = json.loads((tmp_path / "final" / "generation_config.json").read_text())
    assert "min_p" not in saved and "repetition_penalty" not in saved
    assert getattr(tiny_model.generation_config, "min_p", None) is None


def test_sequence_level_ratio_with_a_token_summed_loss_warns(tiny_model, char_tokenizer, tmp_path, caplog):
    from grpokit.trl import GRPOTrainer

    with caplog.at_level(logging.WARNING, logger="grpokit"):
        GRPOTrainer(
            model=tiny_model,
            processing_class=char_tokenizer,
            reward_funcs=digits,
            train_dataset=rows(),
            args=args(tmp_path, importance_sampling_level="sequence", loss_type="dapo"),
        )
    assert "completion length" in caplog.text and "loss.loss_type=grpo" in caplog.text


@pytest.mark.parametrize("kind", ["lm_head", "prompt_learning"])
def test_peft_configs_grpokit_cannot_train_are_refused_in_trls_words(tiny_model, char_tokenizer, tmp_path,
                                                                     kind):
    """An adapter on lm_head would never train (the log-probs read lm_head.weight), and a prompt-learning
    config's virtual tokens shift the completion's positions: both refused, TRL's phrase contained."""
    peft = pytest.importorskip("peft")
    from grpokit.trl import GRPOTrainer

    if kind == "lm_head":
        config, phrase = peft.LoraConfig(r=4, target_modules=["q_proj", "lm_head"]), "`lm_head`"
    else:
        config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
        phrase = "prompt-learning"
    with pytest.raises(ConfigError) as err:
        GRPOTrainer(model=tiny_model, processing_class=char_tokenizer, reward_funcs=digits,
                    args=args(tmp_path), train_dataset=rows(), peft_config=config)
    assert phrase in one_line(err) and "\n" not in str(err.value)


def test_trls_phrases_are_in_grpokits_messages(caplog):
    """Words TRL's tests and users' scripts match on, inside grpokit's own sentences."""
    from grpokit.config.schema import build_config
    from grpokit.config.validation import objective_warnings
    from grpokit.rewards.scoring import score_responses
    from grpokit.trl.agents import check_data

    cfg = build_config({"loss.importance_sampling_level": "sequence", "loss.loss_type": "dapo"})
    assert any("weights each sequence by its completion length" in w for w in objective_warnings(cfg))
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        score_responses([("none", lambda prompts, completions, **kw: [None] * len(completions), 1.0)],
                        ["p", "q"], ["a", "b"], {})
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    with pytest.raises(ConfigError, match="requires a `train_dataset`"):
        check_data(None, {"a": object, "b": object}, 10)
    from grpokit.agents.environments import EnvironmentPool

    class Env:
        def reset(self, **row):
            return None

    with pytest.raises(ConfigError, match="not among the environments"):
        EnvironmentPool({"a": Env}, seed=0).take(["b"])
