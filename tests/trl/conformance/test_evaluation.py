"""Evaluation behaviours TRL's GRPOTrainer tests check: eval during training, eval datasets of every
shape, evaluate() with a dataset, and the loss key it reports."""

from __future__ import annotations

import pytest

EVAL = {"per_device_eval_batch_size": 3, "eval_strategy": "steps", "eval_steps": 1}


def eval_dataset_of(data, kind: str):
    """The test split as TRL's tests pass it: one dataset, a DatasetDict, or a dict, streamed or not."""
    datasets = pytest.importorskip("datasets")
    split = data.test.to_iterable_dataset() if "iterable" in kind else data.test
    if kind in ("dataset", "iterable_dataset"):
        return split
    if kind in ("dataset_dict", "iterable_dataset_dict"):
        cls = datasets.IterableDatasetDict if "iterable" in kind else datasets.DatasetDict
        return cls({"data1": split, "data2": split})
    return {"data1": split, "data2": split}


KINDS = [
    "dataset",
    "iterable_dataset",
    "dataset_dict",
    "iterable_dataset_dict",
    "dict_of_dataset",
    "dict_of_iterable_dataset",
]


@pytest.mark.parametrize(
    "options",
    [{}, {"num_generations_eval": 1}, {"loss_type": "grpo", "eval_on_start": True}],
    ids=["with_eval", "num_generations_eval", "eval_on_start"],
)
def test_train_with_eval(impl, models, data, options):
    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=models.reward,
        train_dataset=data.train,
        eval_dataset=data.test,
        args=impl.args(**EVAL, **options),
    )
    trainer.train()
    evals = [row for row in trainer.state.log_history if "eval_loss" in row]
    assert len(evals) == 2 + bool(options.get("eval_on_start"))  # every eval_steps (and at start)
    assert all(row["eval_reward"] is not None for row in evals)
    assert trainer.state.log_history[-1]["train_loss"] is not None


@pytest.mark.parametrize("kind", KINDS + ["none"])
def test_init_with_eval_dataset(impl, models, data, kind):
    eval_dataset = None if kind == "none" else eval_dataset_of(data, kind)
    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=models.reward,
        args=impl.args(),
        train_dataset=data.train,
        eval_dataset=eval_dataset,
    )
    if eval_dataset is None:
        assert trainer.eval_dataset is None
    elif isinstance(trainer.eval_dataset, dict):
        assert set(trainer.eval_dataset) == {"data1", "data2"}
    else:
        assert trainer.eval_dataset is eval_dataset


@pytest.mark.parametrize("kind", KINDS)
def test_evaluate_with_eval_dataset(impl, models, data, kind):
    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=models.reward,
        train_dataset=data.train,
        args=impl.args(per_device_eval_batch_size=3),
    )
    metrics = trainer.evaluate(eval_dataset=eval_dataset_of(data, kind))
    if kind in ("dataset", "iterable_dataset"):
        assert metrics["eval_loss"] is not None
    else:
        assert metrics["eval_data1_loss"] is not None and metrics["eval_data2_loss"] is not None


def test_evaluate_reports_trl_metrics(impl, models, data):
    """evaluate() returns transformers' figures and TRL's reward metrics, and logs them as a row."""
    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=models.reward,
        train_dataset=data.train,
        eval_dataset=data.test,
        args=impl.args(per_device_eval_batch_size=3),
    )
    metrics = trainer.evaluate()
    for key in (
        "eval_loss",
        "eval_reward",
        "eval_reward_std",
        "eval_runtime",
        "eval_samples_per_second",
        "eval_completions/mean_length",
    ):
        assert key in metrics, key
    assert trainer.state.log_history[-1]["eval_loss"] == metrics["eval_loss"]
