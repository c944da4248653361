"""pi_ref, the frozen reference policy: a frozen copy, its reset towards the policy, and eval mode.

A LoRA policy needs no copy (its reference is the base with adapters disabled: grpokit.model.lora);
`lora.reference_for` picks between the two.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch


def weights_owner(model) -> torch.nn.Module:
    """The module whose weights a forward over `model` runs on: itself, or for a view that holds none of
    its own (LoRA's reference, `lora.DisabledAdapterReference`) the model it views."""
    return getattr(model, "weights_owner", model)


def frozen_reference(model) -> torch.nn.Module:
    """A frozen copy of the policy: pi_ref, kept in eval mode with no gradients."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


@torch.no_grad()
def sync_reference(ref: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    """Iterative GRPO's reference update: ref <- alpha * policy + (1 - alpha) * ref (alpha = 1: reset)."""
    for r, p in zip(ref.parameters(), policy.parameters()):
        r.mul_(1.0 - alpha).add_(p.detach(), alpha=alpha) if alpha < 1 else r.copy_(p.detach())


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """model.eval() for the duration (no dropout), then every submodule's own mode back: a plain
    model.train(was_training) would also switch on blocks the caller had frozen in eval mode."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training
