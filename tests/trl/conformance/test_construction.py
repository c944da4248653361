"""Construction behaviours TRL's GRPOTrainer tests check: what it accepts, refuses and warns about, and
its public helpers (the high-entropy and off-policy masks)."""

from __future__ import annotations

import logging

import pytest
import torch
from conformance_helpers import SKIP, unique_letters


def test_init_minimal(impl, models, data, monkeypatch, tmp_path):
    if impl.name == "trl" and not torch.cuda.is_available():
        pytest.skip(SKIP["gpu"])  # TRL's default args (bf16) refuse a machine without one
    monkeypatch.chdir(tmp_path)  # args=None: the output folder is named after the model
    trainer = impl.GRPOTrainer(model=models.qwen2, reward_funcs=models.reward, train_dataset=data.train)
    assert trainer.model is not None and trainer.processing_class is not None


def test_trust_remote_code(impl, models, data):
    with pytest.raises(ValueError, match="custom code"):
        impl.GRPOTrainer(
            model=models.remote, reward_funcs=unique_letters, args=impl.args(), train_dataset=data.train
        )
    trainer = impl.GRPOTrainer(
        model=models.remote,
        reward_funcs=unique_letters,
        train_dataset=data.train,
        args=impl.args(trust_remote_code=True),
    )
    assert type(trainer.model).__name__ == "RemoteForCausalLM"


def test_no_reward_source_raises(impl, models, data):
    with pytest.raises(ValueError, match="No reward source provided"):
        impl.GRPOTrainer(model=models.qwen2, args=impl.args(), train_dataset=data.conversational)


def test_dataset_required(impl, models):
    with pytest.raises(ValueError, match="train_dataset.? is required"):
        impl.GRPOTrainer(model=models.qwen2, reward_funcs=models.reward, args=impl.args())


def test_iterable_dataset_requires_dispatch_batches_false(impl, models, data):
    args = impl.args(accelerator_config={"dispatch_batches": True})
    with pytest.raises(ValueError, match="Iterable datasets require `dispatch_batches=False`"):
        impl.GRPOTrainer(
            model=models.qwen2,
            reward_funcs=models.reward,
            args=args,
            train_dataset=data.train.to_iterable_dataset(),
        )


def test_iterable_dataset_forces_num_workers_zero(impl, models, data):
    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=models.reward,
        args=impl.args(dataloader_num_workers=4),
        train_dataset=data.train.to_iterable_dataset(),
    )
    assert trainer.args.dataloader_num_workers == 0


def test_iterable_eval_keeps_map_style_train_workers(impl, models, data):
    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=models.reward,
        train_dataset=data.train,
        eval_dataset=data.test.to_iterable_dataset(),
        args=impl.args(dataloader_num_workers=4, per_device_eval_batch_size=3),
    )
    assert trainer.args.dataloader_num_workers == 4


def test_mismatched_reward_processing_classes_length(impl, models, data):
    from transformers import AutoTokenizer

    one = AutoTokenizer.from_pretrained(models.reward)
    with pytest.raises(ValueError, match="must match"):
        impl.GRPOTrainer(
            model=models.qwen2,
            reward_funcs=[models.reward, models.reward_llama],
            reward_processing_classes=one,
            args=impl.args(),
            train_dataset=data.train,
        )


def test_reward_processing_classes(impl, models, data):
    from transformers import AutoTokenizer

    first, second = (
        AutoTokenizer.from_pretrained(models.reward),
        AutoTokenizer.from_pretrained(models.reward_llama),
    )
    trainer = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=[models.reward, models.reward_llama],
        reward_processing_classes=[first, second],
        args=impl.args(),
        train_dataset=data.train,
    )
    assert len(trainer.reward_processing_classes) == 2
    single = impl.GRPOTrainer(
        model=models.qwen2,
        reward_funcs=models.reward,
        reward_processing_classes=first,
        args=impl.args(output_dir=str(impl.tmp / "single")),
        train_dataset=data.train,
    )
    assert len(single.reward_processing_classes) == 1 and single.reward_processing_classes[0] == first


def test_warning_raised_all_rewards_none(impl, models, data, caplog):
    def always_none(completions, **kwargs):
        return [None] * len(completions)

    trainer = impl.GRPOTrainer(
        model=models.qwen2, reward_funcs=always_none, args=impl.args(max_steps=1), train_dataset=data.train
    )
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "all reward functions returned none" in caplog.text.lower()


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"])
def test_warning_sequence_level_with_token_summed_loss(impl, models, data, caplog, loss_type):
    with caplog.at_level(logging.WARNING):
        impl.GRPOTrainer(
            model=models.qwen2,
            reward_funcs=unique_letters,
            train_dataset=data.train,
            args=impl.args(importance_sampling_level="sequence", loss_type=loss_type),
        )
    assert ("completion length" in caplog.text) == (loss_type != "grpo")


# Ten valid tokens (the last two of row 2 are padding); sorted: .1 .2 .3 .4 .5 .6 .7 .8 .9 1.5. The q-quantile
# interpolates at position 9q: q=.8 -> .82 (keeps .9 and 1.5), q=.5 -> .55 (keeps .6 .7 .8 .9 1.5).
ENTROPIES = torch.tensor([[0.5, 0.1, 0.9, 0.3, 0.7, 0.2], [0.6, 0.4, 1.5, 0.8, 2.0, 2.5]])
TEN_VALID = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
# Eight valid (first four of each row); sorted .1 .2 .3 .6 .7 .8 .9 1.2: q=.8 -> .86 keeps .9 and 1.2; the
# padded .9 of row 2 must not count.
OTHER = torch.tensor([[0.3, 1.2, 0.2, 0.9, 0.4, 0.1], [0.1, 0.7, 0.8, 0.6, 0.3, 0.9]])
EIGHT_VALID = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]])


@pytest.mark.parametrize(
    "entropies, mask, threshold, expected",
    [
        (ENTROPIES, TEN_VALID, 0.8, [[0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0]]),
        (OTHER, EIGHT_VALID, 0.8, [[0, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]]),
        (ENTROPIES, TEN_VALID, 0.5, [[0, 0, 1, 0, 1, 0], [1, 0, 1, 1, 0, 0]]),
        (ENTROPIES, TEN_VALID, 0.0, [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]),  # every valid token
        (ENTROPIES, TEN_VALID, 1.0, [[0, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0]]),  # only the highest
        (ENTROPIES, torch.zeros(2, 6, dtype=torch.long), 0.5, [[0] * 6, [0] * 6]),  # nothing valid
    ],
    ids=["top_20_percent", "padding_ignored", "top_half", "threshold_0", "threshold_1", "all_masked"],
)
def test_high_entropy_mask(impl, entropies, mask, threshold, expected):
    out = impl.high_entropy_mask(entropies, mask, threshold)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.bool))


def test_off_policy_mask(impl):
    """Keep a completion when A >= 0 or its mean drift from the sampler is <= the threshold."""
    logps = torch.tensor([[-3.0] * 4, [-0.2] * 4, [-0.9] * 4])  # drift 3 (A > 0), 0.2, 0.9 (A < 0)
    out = impl.off_policy_mask(
        torch.tensor([[0.5], [-0.3], [-2.0]]), logps, torch.zeros(3, 4), torch.ones(3, 4), 0.5
    )
    torch.testing.assert_close(out, torch.tensor([[1.0], [1.0], [0.0]]))


def test_off_policy_mask_ignores_padding(impl):
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    logps = torch.tensor([[-0.4, -0.4, -0.4, -999.0]])  # the padded value must not count
    adv = torch.tensor([[-1.0]])
    for threshold, keep in ((0.3, 0.0), (0.5, 1.0)):
        out = impl.off_policy_mask(adv, logps, torch.zeros(1, 4), mask, threshold)
        torch.testing.assert_close(out, torch.tensor([[keep]]))


def test_train_dataloader_is_one_epoch_of_generation_batches(impl, models, data):
    """TRL's get_train_dataloader(): each batch is one generation batch of row dicts, every prompt's row
    num_generations times in a row; one epoch visits every prompt once."""
    trainer = impl.GRPOTrainer(model=models.qwen2, reward_funcs=models.reward, train_dataset=data.train,
                               args=impl.args(per_device_train_batch_size=6))
    loader = trainer.get_train_dataloader()
    batches = list(loader)
    prompts_all = list(data.train["prompt"])
    assert len(loader) == len(batches) == len(prompts_all) // 2
    for batch in batches:
        assert len(batch) == 6 and all(isinstance(row, dict) for row in batch)
        prompts = [row["prompt"] for row in batch]
        assert prompts[:3] == [prompts[0]] * 3 and prompts[3:] == [prompts[3]] * 3
    assert sorted(row["prompt"] for batch in batches for row in batch[::3]) == sorted(prompts_all)


def test_eval_dataloader_repeats_each_prompt_num_generations_eval_times(impl, models, data):
    trainer = impl.GRPOTrainer(model=models.qwen2, reward_funcs=models.reward, train_dataset=data.train,
                               eval_dataset=data.test,
                               args=impl.args(per_device_eval_batch_size=4, num_generations_eval=2))
    batches = list(trainer.get_eval_dataloader())
    rows, test_prompts = [row["prompt"] for batch in batches for row in batch], list(data.test["prompt"])
    assert all(len(batch) == 4 for batch in batches)
    assert len(rows) == 2 * len(test_prompts) and sorted(set(rows)) == sorted(test_prompts)
    assert all(rows[i] == rows[i + 1] for i in range(0, len(rows), 2))
