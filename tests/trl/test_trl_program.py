"""A TRL program runs on grpokit by changing one import (grpokit.trl): tiny offline Llama, a
conversational datasets.Dataset with a `solution` column, TRL's rewards and a keyword-only one."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch

datasets = pytest.importorskip("datasets")

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")

try:  # TRL's own rewards when trl is installed, equivalents of our own otherwise
    from trl.rewards import accuracy_reward, think_format_reward
except ImportError:
    def think_format_reward(completions, **kwargs):
        pattern = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL)
        return [1.0 if pattern.match(c[0]["content"]) else 0.0 for c in completions]

    def accuracy_reward(completions, solution, **kwargs):
        return [1.0 if s.strip() in c[0]["content"] else 0.0 for c, s in zip(completions, solution)]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny random-init Llama and the offline character tokenizer (with a chat template), saved."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from grpokit.model.loading import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-llama")
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def conversational_dataset():
    rows = [{"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "solution": str(a + b)}
            for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1)]]
    return datasets.Dataset.from_list(rows)


def run_program(GRPOConfig, GRPOTrainer, model_dir, out_dir, **extra):
    """The TRL quick start, shaped for a tiny model: returns (trainer, what the keyword-only reward saw)."""
    seen: list[dict] = []

    def brevity(*, prompts, completions, completion_ids, solution, trainer_state, **kwargs):
        seen.append({"prompts": prompts, "completions": completions, "solution": solution,
                     "step": trainer_state.global_step, "kwargs": sorted(kwargs)})
        return [0.1 if len(ids) < 8 else 0.0 for ids in completion_ids]

    args = GRPOConfig(output_dir=str(out_dir), num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=16, max_steps=3, beta=0.04, loss_type="grpo", report_to="none",
                      **extra)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[think_format_reward, accuracy_reward, brevity],
                          args=args, train_dataset=conversational_dataset())
    trainer.train()
    return trainer, seen


def check_program(trainer, seen, out_dir):
    from transformers import AutoModelForCausalLM

    assert trainer.state.global_step == 3
    assert [s["step"] for s in seen] == [0, 1, 2]     # trainer_state, read before each step's update
    first = seen[0]
    assert len(first["completions"]) == 8                               # 2 prompts x G = 4
    assert all(isinstance(c, list) and c[0]["role"] == "assistant" and isinstance(c[0]["content"], str)
               for c in first["completions"])                            # conversational completions
    assert all(isinstance(p, list) and p[0]["role"] == "user" for p in first["prompts"])
    assert all(s in {"3", "7", "11", "15", "4", "10"} for s in first["solution"])  # the dataset column
    assert "log_metric" in first["kwargs"] and "log_extra" in first["kwargs"]
    rows = [r for r in trainer.state.log_history if "reward" in r]
    assert len(rows) == 1 and "train_loss" in rows[0]   # logging_steps=10 > 3 steps: TRL's last row has them
    assert "rewards/brevity/mean" in rows[0] and "rewards/accuracy_reward/std" in rows[0]
    final = trainer.save_model(str(out_dir / "exported"))
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.config.model_type == "llama"
    card = (final / "README.md").read_text()
    assert "library_name: grpokit" in card and "- grpo" in card and "| `loss.beta` | `0.04` |" in card
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3 and all(m["rewards/brevity"] >= 0 for m in metrics)
    return first


def test_trl_program_runs_on_grpokit(llama_dir, tmp_path, capsys):
    from grpokit.trl import GRPOConfig, GRPOTrainer

    trainer, seen = run_program(GRPOConfig, GRPOTrainer, llama_dir, tmp_path)
    check_program(trainer, seen, tmp_path)
    printed = capsys.readouterr().out
    assert "run.seed = 42 from TRL's default" in printed and "loss.loss_type" not in printed  # says so
    assert trainer.config.loss.loss_type == "grpo" and trainer.config.rollout.prompts_per_step == 2
    assert trainer.model is not None and trainer._train_state.ref_model is not None   # beta > 0: a reference


def test_real_trl_config_runs_through_grpokit(llama_dir, tmp_path):
    trl = pytest.importorskip("trl")
    from grpokit.trl import GRPOTrainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes on gradient_checkpointing
        # bf16=False: TRL itself refuses its bf16 default on a machine without a GPU
        trainer, seen = run_program(trl.GRPOConfig, GRPOTrainer, llama_dir, tmp_path, bf16=False)
    first = check_program(trainer, seen, tmp_path)
    ours_trainer, ours_seen = run_program(__import__("grpokit.trl", fromlist=["GRPOConfig"]).GRPOConfig,
                                          GRPOTrainer, llama_dir, tmp_path / "ours", bf16=False)
    assert first["kwargs"] == ours_seen[0]["kwargs"]                   # same reward arguments
    assert first["completions"] == ours_seen[0]["completions"]          # same seed, same config: same samples
    assert trainer.config.to_dict() | {"run": None} == ours_trainer.config.to_dict() | {"run": None}
