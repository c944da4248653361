"""[G-H] train_step / train_grpo end to end on a tiny random-init model (CPU, seconds)."""

import json
from pathlib import Path

import torch

from easy_task import PROMPTS, easy_config
from grpokit.train.loop import build_state, train_grpo
from grpokit.train.step import train_step


def test_every_trainable_parameter_changes_and_loss_is_finite(tmp_path):
    cfg = easy_config(tmp_path, **{"run.max_steps": 2})
    state = build_state(cfg, train_examples=PROMPTS)
    before = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    for _ in range(2):
        m = train_step(state)
        assert torch.isfinite(torch.tensor(m["loss"]))
    unchanged = [n for n, p in state.model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []
    # the reference stays frozen
    for n, p in state.ref_model.named_parameters():
        assert torch.equal(p, before[n]) and not p.requires_grad


def test_mean_reward_rises_on_an_easy_reward(tmp_path):
    cfg = easy_config(tmp_path)
    state = train_grpo(cfg, train_examples=PROMPTS)
    rows = [json.loads(line)
            for line in (Path(cfg.run.output_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 31))
    first = sum(r["reward_mean"] for r in rows[:5]) / 5
    last = sum(r["reward_mean"] for r in rows[-5:]) / 5
    assert last > first + 0.2, (first, last)
    for key in ("reward_std", "loss", "policy_loss", "approx_kl", "mean_ratio", "clip_ratio",
                "completion_length_mean", "time/generate", "time/update"):
        assert key in rows[-1]
    assert state.step == 30


def test_final_model_reloads_with_plain_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = easy_config(tmp_path, **{"run.max_steps": 1, "loss.beta": 0.0})
    state = train_grpo(cfg, train_examples=PROMPTS)
    assert state.ref_model is None  # beta = 0 loads no reference
    out = Path(cfg.run.output_dir) / "final"
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == "<eos>"
    for (n, a), b in zip(model.state_dict().items(), state.model.state_dict().values()):
        assert torch.equal(a, b), n
    assert json.loads((out / "grpokit_config.json").read_text())["loss"]["beta"] == 0.0
