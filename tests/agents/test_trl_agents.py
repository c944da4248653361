"""TRL's agent surface on grpokit.trl: tools=, environment_factory= (with and without a dataset),
rollout_func=, max_tool_calling_iterations."""

from __future__ import annotations

import json

import pytest
import torch
from agent_envs import DiceCalculator, Quiz
from agent_models import PROMPTS, plain_caller, product

from grpokit.agents.builtin import multiply
from grpokit.config.schema import ConfigError
from grpokit.trl import GRPOConfig, GRPOTrainer


def _args(tmp_path, **over):
    values = dict(output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4,
                  max_completion_length=120, max_steps=2, report_to="none", bf16=False,
                  gradient_checkpointing=False, learning_rate=1e-3, seed=0, logging_steps=1)
    values.update(over)
    return GRPOConfig(**values)


def _rows():
    return [{"prompt": p, "answer": str(product(p)[2])} for p in PROMPTS]


def _metrics(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_tools_and_max_tool_calling_iterations(tmp_path):
    seen = []

    def right(completions, answer, **kw):
        seen.append(completions)
        return [float(f"\\boxed{{{a}}}" in c) for c, a in zip(completions, answer)]

    model, tok = plain_caller()
    trainer = GRPOTrainer(model, reward_funcs=right, args=_args(tmp_path, max_tool_calling_iterations=1),
                          train_dataset=_rows(), processing_class=tok, tools=[multiply])
    assert trainer.config.rollout.max_tool_calling_iterations == 1
    assert trainer.config.rollout.tools == ["grpokit.agents.builtin:multiply"]
    trainer.train()
    rows = _metrics(tmp_path)
    assert len(rows) == 2 and all(r["tools/call_frequency"] > 0 and r["turns/mean"] > 1 for r in rows)
    assert any("<tool_response>" in c for c in seen[0])     # rewards see the whole stream (text prompts)


def test_an_environment_without_a_dataset_owns_the_prompts_and_the_reward(tmp_path):
    got = []

    def sees_envs(completions, environments, **kw):
        got.append(environments)
        return [0.0] * len(completions)

    model, tok = plain_caller()
    trainer = GRPOTrainer(model, reward_funcs=[sees_envs], args=_args(tmp_path), processing_class=tok,
                          environment_factory=Quiz)
    assert trainer.reward_func_names == ["sees_envs", "Quiz"]
    assert trainer.train_examples[0].prompt == ""      # no chat template: a text placeholder
    trainer.train()
    assert all(len(e) == 4 and all(type(x) is Quiz for x in e) for e in got)
    assert all("rewards/Quiz" in r and r["turns/mean"] > 1 for r in _metrics(tmp_path))
    with pytest.raises(ConfigError, match=r"set GRPOConfig\(max_steps=...\)"):
        GRPOTrainer(model, args=_args(tmp_path, max_steps=-1), processing_class=tok,
                    environment_factory=DiceCalculator)


def test_get_reward_alone_is_a_reward(tmp_path):
    model, tok = plain_caller()
    trainer = GRPOTrainer(model, args=_args(tmp_path), train_dataset=_rows(), processing_class=tok,
                          environment_factory=DiceCalculator)
    assert trainer.reward_func_names == ["DiceCalculator"]
    trainer.train()
    assert all(r["rewards/DiceCalculator"] >= 0 for r in _metrics(tmp_path))


def test_rollout_func_ids_are_trained_as_given_with_env_mask_as_the_loss_mask(tmp_path):
    calls = []

    def my_rollout(prompts, trainer):
        calls.append((list(prompts), trainer))
        tok = trainer.processing_class
        comp = [tok("12<tool_response>9</tool_response>3", add_special_tokens=False)["input_ids"]
                + [tok.eos_token_id] for _ in prompts]
        mask = [[1, 1] + [0] * 32 + [1, 1] for _ in prompts]     # "12", the response, "3" + EOS
        return {"prompt_ids": [tok(p)["input_ids"] for p in prompts], "completion_ids": comp,
                "logprobs": [[-1.0] * len(c) for c in comp], "env_mask": mask, "tag": ["x"] * len(prompts)}

    def tagged(completions, tag, **kw):
        return [float(t == "x") + 0.1 * i for i, t in enumerate(tag)]

    model, tok = plain_caller()
    trainer = GRPOTrainer(model, reward_funcs=tagged, args=_args(tmp_path), train_dataset=_rows(),
                          processing_class=tok, rollout_func=my_rollout)
    trainer.train()
    prompts, who = calls[0]
    assert who is trainer and len(prompts) == 4 and prompts[0] == prompts[1]   # each prompt G times
    rows = _metrics(tmp_path)
    assert rows[0]["tokens/model_mean"] == 4 and rows[0]["tokens/env_mean"] == 32
    assert rows[0]["turns/mean"] == 2 and torch.isfinite(torch.tensor(rows[0]["loss"]))
