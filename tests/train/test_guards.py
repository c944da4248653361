"""Numerical guards: a non-finite loss, gradient or advantage skips the update (counted, prompts logged);
run.max_bad_steps in a row stops the run with a message naming a good checkpoint on disk."""

import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import grpokit.train.loop as loop_mod
import grpokit.train.step as step_mod
import grpokit.train.update as update_mod
from grpokit.config.schema import build_config
from grpokit.observe.metrics import read_metrics
from grpokit.train.loop import train_grpo
from grpokit.train.resume import verify_checkpoint

DENSE = str(Path(__file__).resolve()) + ":dense_reward"


def dense_reward(prompts, completions, **kwargs):
    """Loaded by import path: a reward that differs within every group, so every good step moves the
    weights."""
    return [sum(map(ord, c)) % 13 / 13 for c in completions]


def tiny(out: Path, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "task.name": "arithmetic", "task.num_train": 64,
              "task.num_eval": 8, "reward.funcs": {DENSE: 1.0}, "rollout.prompts_per_step": 2,
              "rollout.num_generations": 4, "rollout.max_completion_length": 8, "optim.learning_rate": 3e-3,
              "run.eval_limit": 0, "run.progress": False, "run.output_dir": str(out), "run.max_steps": 4}
    values.update(over)
    return build_config(values)


pytestmark = pytest.mark.usefixtures("one_thread")


def nan_loss_on(monkeypatch, steps: set[int], holder: dict) -> None:
    """Test hook: the GRPO objective returns NaN while the trainer is at one of `steps` (1-based)."""
    real = update_mod.grpo_objective_from_logprobs

    def patched(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        if holder["state"].step + 1 in steps:
            loss = loss * float("nan")
        return loss, metrics

    monkeypatch.setattr(update_mod, "grpo_objective_from_logprobs", patched)


def snapshots(holder: dict):
    """after_step hook recording the weights after every step."""
    seen = {}

    def after_step(state, metrics):
        holder["state"] = state
        seen[state.step] = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    return seen, after_step


def run(cfg, monkeypatch, nan_steps: set[int]):
    holder: dict = {}
    seen, after_step = snapshots(holder)
    real_build = loop_mod.build_state

    def build(*args, **kwargs):  # expose the state to the NaN hook before the first step
        holder["state"] = real_build(*args, **kwargs)
        return holder["state"]

    monkeypatch.setattr(loop_mod, "build_state", build)
    nan_loss_on(monkeypatch, nan_steps, holder)
    return holder, seen, (lambda: train_grpo(cfg, hooks={"after_step": after_step}))


def test_a_nan_loss_skips_that_update_counts_it_and_logs_the_prompts(tmp_path, monkeypatch, caplog):
    holder, seen, go = run(tiny(tmp_path / "run"), monkeypatch, nan_steps={2})
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        state = go()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["skipped_updates"] for r in rows] == [0, 1, 1, 1]
    assert [r["bad_steps"] for r in rows] == [0, 1, 0, 0]  # in a row: reset by the next good update
    for name, value in seen[2].items():  # step 2 changed nothing ...
        assert torch.equal(value, seen[1][name]), name
    assert any(not torch.equal(v, seen[2][n]) for n, v in seen[3].items())  # ... step 3 trains again
    assert all(torch.isfinite(p).all() for p in state.model.parameters())
    assert "step 2: non-finite loss or gradient, update skipped (1 in a row" in caplog.text
    prompts = [p for p in holder["state"].stream.examples]  # the batch's prompts are named
    assert any(ex.prompt[:20] in caplog.text for ex in prompts)


def test_a_nan_gradient_with_a_finite_loss_is_skipped(tmp_path, monkeypatch):
    cfg = tiny(tmp_path / "run", **{"run.max_steps": 2})
    holder, seen, go = run(cfg, monkeypatch, nan_steps=set())
    real_build = loop_mod.build_state

    def build(*args, **kwargs):
        state = real_build(*args, **kwargs)
        first = next(p for p in state.model.parameters() if p.requires_grad)
        first.register_hook(lambda g: g * float("nan") if holder["state"].step == 1 else g)
        holder["state"] = state
        return state

    monkeypatch.setattr(loop_mod, "build_state", build)
    go()
    rows = read_metrics(tmp_path / "run")
    assert [r["skipped_updates"] for r in rows] == [0, 1]
    assert all(torch.isfinite(v).all() for v in seen[2].values())


def test_nan_advantages_are_caught_before_the_update(tmp_path, monkeypatch):
    real = step_mod.compute_advantages
    monkeypatch.setattr(step_mod, "compute_advantages", lambda *a, **k: real(*a, **k) * float("nan"))
    state = train_grpo(tiny(tmp_path / "run", **{"run.max_steps": 2, "run.max_bad_steps": 3}))
    assert [r["skipped_updates"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    assert state.bad_steps == 2 and all(torch.isfinite(p).all() for p in state.model.parameters())


def test_max_bad_steps_in_a_row_stops_the_run_with_a_good_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "run"
    cfg = tiny(out, **{"run.max_steps": 10, "run.save_steps": 2, "run.max_bad_steps": 2})
    holder, seen, go = run(cfg, monkeypatch, nan_steps={3, 4, 5, 6})
    with pytest.raises(FloatingPointError) as err:
        go()
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("2 non-finite updates in a row (run.max_bad_steps)")
    assert msg.endswith(f"last good checkpoint: {out / 'checkpoint-2'}")
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4]  # stopped at the second bad step
    assert not (out / "checkpoint-4").exists() and verify_checkpoint(out / "checkpoint-2") is None
    saved = load_file(out / "checkpoint-2" / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in saved.values())
    for name, value in seen[2].items():  # the checkpoint holds the weights of the last good update
        if name in saved:
            assert torch.equal(saved[name], value), name


def test_an_infinite_reward_stops_with_a_message(tmp_path, monkeypatch):
    import grpokit.train.collect as collect_mod

    real = collect_mod.score_responses

    def inf_scores(*args, **kwargs):
        out = real(*args, **kwargs)
        out.total[0] = float("inf")
        return out

    monkeypatch.setattr(collect_mod, "score_responses", inf_scores)
    with pytest.raises(FloatingPointError, match="rewards contain inf: check the reward functions"):
        train_grpo(tiny(tmp_path / "run", **{"run.max_steps": 1}))
