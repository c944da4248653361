"""What the readable path may ask of the optional speed-ups (`Speedups`), and the plain answers.

The sampler, the update and the lm-head's log-probs are written against this small protocol, never against
grpokit.fast: they ask `active()`, which is the scope of the one switch (`grpokit.switch.accelerated`) for
the duration of a call inside it, and `PLAIN` everywhere else, whose every answer is the plain PyTorch
path: no C kernels, no activation record, the update's own micro-batch plan, autograd's cast of the head.
The switch fills the slot with `scoped` and empties it on exit; nothing here outlives the call.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch


class Speedups:
    """The questions the readable path asks, answered for the plain path (the switch's scope overrides them).

    A record (`start_record`) is an object with `put`, `keep_rows`, `finish` (the sampler fills it),
    `logprobs(model, rows, input_ids, attention_mask, T, temperature=, consume=, ...)` (the update's forward
    on it) and `release()` (spent).
    """

    on = False          # whether any speed-up is in force

    def decode_kernels(self, model) -> Any | None:
        """C kernels for the sampler's decode steps (`rollout.sampling.pick_tokens` takes them too)."""
        return None

    def whole_step(self, decoder, rows: int) -> Any | None:
        """The lean decoder's whole decode step as one callable (with `.prefill`), or None."""
        return None

    def start_record(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                     max_new_tokens: int, dims: dict[str, int], n_layers: int) -> Any | None:
        """A record of the sampler's projection outputs to fill, or None (not recording)."""
        return None

    def hold_record(self, record) -> None:
        """The sampler's finished record, kept until the update asks for its plan."""

    def held_record(self) -> Any | None:
        """The record held now (None: none recorded, dropped, or taken by the update)."""
        return None

    def update_plan(self, state, rollout, plain_plan: Callable) -> tuple[list[torch.Tensor], Any, bool]:
        """(micro-batches, a record for the first update's forward or None, whether that use is its last).

        plain_plan(state, rollout): the update's own micro-batches (`grpokit.train.update.micro_batch_plan`).
        """
        return plain_plan(state, rollout), None, False

    def decide_reuse(self, state, rollout, plain_plan: Callable) -> bool:
        """Decide once per batch whether the update will use the record (a record it will not use is freed
        at once); True when it will."""
        return False

    def cast_head(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The lm-head weight in the compute dtype (mixed precision); autograd carries its gradient back."""
        return weight.to(dtype)


PLAIN = Speedups()
_ACTIVE: contextvars.ContextVar[Speedups | None] = contextvars.ContextVar("grpokit_speedups", default=None)


def active() -> Speedups:
    """The scope the one switch has put in force for this call, or `PLAIN`."""
    return _ACTIVE.get() or PLAIN


def entered() -> bool:
    """Whether a switch (accelerated or plain) is in force: an inner switch then changes nothing."""
    return _ACTIVE.get() is not None


@contextlib.contextmanager
def scoped(scope: Speedups) -> Iterator[Speedups]:
    """`scope` answers `active()` for the duration (the switch's own way in); the previous one after."""
    token = _ACTIVE.set(scope)
    try:
        yield scope
    finally:
        _ACTIVE.reset(token)
