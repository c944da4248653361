"""Reward functions and parameter checks shared by the conformance cases."""

from __future__ import annotations

import torch

# The only reasons a case may be skipped for.
SKIP = {
    "gpu": "needs a GPU",
    "liger": "needs liger",
    "vlm": "needs a VLM processor",
    "private": "checks a private TRL helper with no user-facing behaviour",
}


def text_of(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def unique_letters(completions, **kwargs):
    """Rewards completions with more distinct characters (varies within a group, so the weights move)."""
    return [float(len(set(text_of(c)))) for c in completions]


def length_reward(completions, **kwargs):
    return [float(len(text_of(c))) for c in completions]


def snapshot(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def unchanged(trainer, before: dict[str, torch.Tensor], skip=lambda name: False) -> list[str]:
    """The parameters that did not move (TRL's tests expect none, except those `skip` names)."""
    return [n for n, p in before.items() if not skip(n) and torch.equal(p, trainer.model.get_parameter(n))]


def train_and_check(trainer, skip=lambda name: False):
    """TRL's standard check: train, a final row with train_loss, every weight (but `skip`) changed."""
    before = snapshot(trainer)
    out = trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert out.training_loss == trainer.state.log_history[-1]["train_loss"]
    assert unchanged(trainer, before, skip) == []
    return trainer
