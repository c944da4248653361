"""get_train_dataloader() draws what grpokit trains on, in that order, from where training stands, without
moving it; an iterable train set gives the rows it was read into; a named eval set is picked, an unknown
name refused in one line."""

from __future__ import annotations

import pytest

from grpokit.config.schema import ConfigError

datasets = pytest.importorskip("datasets")


def _rows(n: int) -> list[dict]:
    return [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(n)]


def _trainer(tiny_model, char_tokenizer, tmp_path, seen: list, train=None, **kw):
    from grpokit.trl import GRPOConfig, GRPOTrainer

    def record(prompts, completions, answer, **kwargs):
        seen.append((list(prompts), list(answer)))
        return [0.0] * len(completions)

    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8,
                      max_steps=2, max_completion_length=4, bf16=False, report_to="none", **kw)
    return GRPOTrainer(model=tiny_model, processing_class=char_tokenizer, reward_funcs=record, args=args,
                       train_dataset=train if train is not None else datasets.Dataset.from_list(_rows(10)))


def test_the_loader_is_the_training_order_and_reading_it_moves_nothing(tiny_model, char_tokenizer, tmp_path):
    seen: list = []
    trainer = _trainer(tiny_model, char_tokenizer, tmp_path, seen)
    before = [[(r["prompt"], r["answer"]) for r in batch] for batch in trainer.get_train_dataloader()]
    assert len(before) == 5 and all(len(b) == 8 for b in before)   # 10 prompts, 2 a step, 4 rows each
    assert before == [[(r["prompt"], r["answer"]) for r in batch] for batch in trainer.get_train_dataloader()]
    trainer.train()
    trained = [list(zip(prompts, answers)) for prompts, answers in seen]
    assert trained == before[:2]                       # the two steps drew the loader's first two batches
    after = [[(r["prompt"], r["answer"]) for r in batch] for batch in trainer.get_train_dataloader()]
    assert after[:3] == before[2:]                     # from the cursor on: the rest of the epoch first


def test_an_iterable_train_set_gives_the_rows_it_was_read_into(tiny_model, char_tokenizer, tmp_path):
    stream = datasets.Dataset.from_list(_rows(40)).to_iterable_dataset()
    trainer = _trainer(tiny_model, char_tokenizer, tmp_path, [], train=stream)
    batches = list(trainer.get_train_dataloader())
    assert len(batches) == 2      # max_steps x prompts per step = 4 rows read from the stream
    assert {r["prompt"] for b in batches for r in b} == {f"{a}+{a}=" for a in range(4)}


def test_a_named_eval_set_is_picked_and_an_unknown_one_refused(tiny_model, char_tokenizer, tmp_path):
    from grpokit.trl import GRPOConfig, GRPOTrainer

    evals = {"small": datasets.Dataset.from_list(_rows(2)), "big": datasets.Dataset.from_list(_rows(6))}
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8,
                      per_device_eval_batch_size=4, max_steps=1, bf16=False, report_to="none")
    trainer = GRPOTrainer(model=tiny_model, processing_class=char_tokenizer, reward_funcs=lambda completions,
                          **k: [0.0] * len(completions), args=args,
                          train_dataset=datasets.Dataset.from_list(_rows(8)), eval_dataset=evals)
    assert len(list(trainer.get_eval_dataloader("small"))) == 2
    assert len(list(trainer.get_eval_dataloader())) == 8
    with pytest.raises(ConfigError, match="'huge' is not one of the trainer's eval datasets"):
        trainer.get_eval_dataloader("huge")
