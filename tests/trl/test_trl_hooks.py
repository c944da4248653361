"""Callbacks (transformers.TrainerCallback), log_metric / log_extra into metrics.jsonl, async rewards run
concurrently, reward models, and the TRL data formats from Python and the CLI loader."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch

datasets = pytest.importorskip("datasets")


SPANS: list[tuple[float, float]] = []     # (start, end) of each async reward call


async def _slow(value: float, n: int) -> list[float]:
    start = time.monotonic()
    await asyncio.sleep(0.2)
    SPANS.append((start, time.monotonic()))
    return [value] * n


async def slow_a(prompts, completions, **kwargs):
    return await _slow(0.0, len(completions))


async def slow_b(prompts, completions, **kwargs):
    return await _slow(0.5, len(completions))


async def slow_c(prompts, completions, **kwargs):
    return await _slow(1.0, len(completions))


def test_three_async_rewards_score_a_batch_concurrently():
    from grpokit.rewards.scoring import score_responses

    SPANS.clear()
    funcs = [("a", slow_a, 1.0), ("b", slow_b, 1.0), ("c", slow_c, 1.0)]
    scores = score_responses(funcs, ["p"] * 4, ["x"] * 4, {})
    assert len(SPANS) == 3
    # all three were in flight at once: each started before any finished (one after another, the
    # second would start after the first's 0.2 s ended); no wall-time bound, so a loaded machine passes
    assert max(start for start, _ in SPANS) < min(end for _, end in SPANS), SPANS
    assert scores.total.tolist() == [1.5] * 4


def test_reward_calls_are_by_keyword_and_chat_completions_are_messages():
    from grpokit.rewards.scoring import RewardError, score_responses

    def completions_first(completions, **kwargs):   # TRL's own rewards put completions first
        return [float(c[0]["content"] == "4") for c in completions]

    chat = [[{"role": "user", "content": "2+2?"}]] * 2
    assert score_responses([("f", completions_first, 1.0)], chat, ["4", "5"], {}).total.tolist() == [1.0, 0.0]
    with pytest.raises(RewardError, match="reward 'bad' returned str for completion 0"):
        score_responses([("bad", lambda completions, **k: ["x", "y"], 1.0)], chat, ["4", "5"], {})


class StopAtTwo:
    """A real transformers.TrainerCallback subclass, built lazily so the import stays optional here."""

    @staticmethod
    def make():
        from transformers import TrainerCallback

        class Stop(TrainerCallback):
            def __init__(self):
                self.events: list[str] = []
                self.rows: list[dict] = []

            def on_train_begin(self, args, state, control, **kwargs):
                self.events.append("train_begin")

            def on_step_end(self, args, state, control, metrics=None, **kwargs):
                self.events.append(f"step_end:{state.global_step}")
                self.rows.append(metrics)
                if state.global_step == 2:
                    control.should_training_stop = True

            def on_evaluate(self, args, state, control, metrics=None, **kwargs):
                self.events.append(f"evaluate:{metrics.get('tag', 'trl')}")   # tag: grpokit's greedy ones

            def on_save(self, args, state, control, **kwargs):
                self.events.append(f"save:{state.global_step}")

            def on_train_end(self, args, state, control, **kwargs):
                self.events.append("train_end")

        return Stop()


def test_callback_stops_training_and_log_metric_reaches_metrics_jsonl(tiny_model, char_tokenizer, tmp_path):
    from grpokit.trl import GRPOConfig, GRPOTrainer

    def counted(prompts, completions, completion_ids, log_metric, log_extra, **kwargs):
        log_metric("my/length", sum(len(i) for i in completion_ids) / len(completion_ids))
        log_extra("first_chars", [c[:2] for c in completions])
        return [float(len(i)) / 10 for i in completion_ids]

    data = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(8)]
    callback = StopAtTwo.make()
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=6, max_steps=5, beta=0.04, logging_steps=1, save_steps=1,
                      gradient_checkpointing=False, bf16=False, seed=0)
    trainer = GRPOTrainer(model=tiny_model, processing_class=char_tokenizer, args=args, train_dataset=data,
                          eval_dataset=data[:2], reward_funcs=[counted, slow_a, slow_b, slow_c],
                          callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 2
    assert callback.events == ["train_begin", "evaluate:before", "step_end:1", "save:1", "step_end:2",
                               "save:2", "evaluate:after", "train_end"]
    assert "reward_mean" in callback.rows[0] and "rewards/counted" in callback.rows[0]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["my/length"] == pytest.approx(row["completion_length_mean"])   # log_metric's value
        assert len(row["extra/first_chars"]) == 8                                 # log_extra's column
        assert row["time/reward"] < 0.4, row["time/reward"]       # 3 x 0.2 s async, concurrent
    card = (tmp_path / "final" / "README.md").read_text()
    assert "held-out problems: 2" in card and "mean rewards/counted" in card   # the before/after table
    assert trainer._train_state.ref_model is not tiny_model                       # beta > 0: a frozen copy
    metrics = trainer.evaluate()                                  # TRL's: sampled, with the loss
    assert metrics["eval_rewards/counted/mean"] >= 0 and "eval_loss" in metrics
    assert callback.events[-1] == "evaluate:trl"


def test_a_reward_model_scores_by_its_logit(char_tokenizer, tmp_path):
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    from grpokit.rewards.scoring import get_reward_function, score_responses

    config = Qwen2Config(vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                         pad_token_id=char_tokenizer.pad_token_id)
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_config(config)
    rm.save_pretrained(tmp_path)
    char_tokenizer.save_pretrained(tmp_path)
    fn = get_reward_function(str(tmp_path))                   # a model folder in reward funcs: a reward model
    out = score_responses([("rm", fn, 1.0)], ["1+1=", "2+2="], ["2", "4"], {}).total
    enc = char_tokenizer(["1+1=2"], return_tensors="pt", add_special_tokens=False)
    assert out[0].item() == pytest.approx(rm.eval()(**enc).logits[0, 0].item(), abs=1e-5)


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "save_to_disk"])
def test_the_cli_reads_trl_format_data(tmp_path, kind):
    from grpokit.config.schema import build_config
    from grpokit.tasks import load_examples

    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "solution": str(i), "n": i} for i in range(3)]
    ds = datasets.Dataset.from_list(rows)
    path = tmp_path / ("train.jsonl" if kind == "jsonl" else "train.parquet" if kind == "parquet" else "disk")
    {"jsonl": lambda: ds.to_json(str(path)), "parquet": lambda: ds.to_parquet(str(path)),
     "save_to_disk": lambda: ds.save_to_disk(str(path))}[kind]()
    cfg = build_config({"task.name": "hf", "task.path": str(path)})
    examples = load_examples(cfg.task, "train")
    assert [ex.prompt for ex in examples] == [r["prompt"] for r in rows]
    assert examples[1].columns == {"solution": "1", "n": 1}          # the other columns, as they are


def test_peft_config_and_an_iterable_dataset(tiny_model, char_tokenizer, tmp_path):
    peft = pytest.importorskip("peft")
    from grpokit.model.lora import DisabledAdapterReference
    from grpokit.trl import GRPOConfig, GRPOTrainer

    stream = datasets.IterableDataset.from_generator(
        lambda: ({"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(100)))
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=6, max_steps=2, beta=0.04, bf16=False, save_strategy="no")
    def digits(completions, **kwargs):   # varies within a group: a gradient for the adapters
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    trainer = GRPOTrainer(model=tiny_model, processing_class=char_tokenizer,
                          reward_funcs=["accuracy", digits],
                          # TRL default: gradient checkpointing
                          args=args, train_dataset=stream, peft_config=lora)
    # max_steps x 2 prompts taken from the stream
    assert len(trainer.train_examples) == 4
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    assert isinstance(trainer._train_state.ref_model, DisabledAdapterReference)   # no copy of the weights
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if n in before)
    assert (tmp_path / "final" / "adapter_config.json").is_file()
