"""The TRL-style Python API and the CLI (`task.name=hf`) give the same metrics for one seed and config."""

from __future__ import annotations

import json

import pytest
import yaml

datasets = pytest.importorskip("datasets")

COMPARED = ("reward_mean", "reward_std", "rewards/accuracy", "rewards/format", "loss", "approx_kl",
            "grad_norm", "completion_length_mean", "advantage_mean", "learning_rate")


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_python_api_and_cli_give_the_same_metrics(tmp_path, capsys):
    from grpokit.cli.main import main
    from grpokit.trl import GRPOConfig, GRPOTrainer

    data = tmp_path / "train.jsonl"
    rows = [{"prompt": f"What is {a}+{b}?", "answer": str(a + b), "level": a % 3} for a in range(10, 16)
            for b in range(20, 24)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = GRPOConfig(output_dir=str(tmp_path / "api"), num_generations=4, per_device_train_batch_size=16,
                      max_completion_length=24, max_steps=2, learning_rate=1e-4, seed=0, logging_steps=1,
                      save_strategy="no", gradient_checkpointing=False, bf16=False, beta=0.04,
                      report_to="none")
    trainer = GRPOTrainer(model="builtin:arith-demo", reward_funcs=["accuracy", "format"], args=args,
                          train_dataset=datasets.load_dataset("json", data_files=str(data), split="train"))
    trainer.train()
    cfg = trainer.config.to_dict()
    cfg["task"].update(name="hf", path=str(data))
    cfg["run"].update(output_dir=str(tmp_path / "cli"), progress=False)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "cfg.yaml")]) == 0
    api, cli = _rows(tmp_path / "api" / "metrics.jsonl"), _rows(tmp_path / "cli" / "metrics.jsonl")
    assert len(api) == len(cli) == 2
    for a, c in zip(api, cli):
        assert {k: a[k] for k in COMPARED} == {k: c[k] for k in COMPARED}
    assert api[0]["rewards/accuracy"] > 0   # the demo model answers some additions: the rewards really ran
