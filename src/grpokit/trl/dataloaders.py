"""TRL's `trainer.get_train_dataloader()` / `get_eval_dataloader()`: the batches a TRL program inspects
(`len(...)`, `next(iter(...))`), laid out as TRL lays them out and drawn in the order grpokit trains on.

    train: one batch per generation batch, `prompts_per_step` prompts, each prompt's row repeated
           num_generations times in a row (TRL's RepeatSampler); the order is the run's seeded
           `PromptStream` from where training stands now (the cursor of the last step, 0 before training),
           one epoch long; TRL's identity collator: a batch is a list of row dicts
    eval:  every eval prompt's row repeated num_generations_eval times, in batches of
           per_device_eval_batch_size rows, in the data's order

Reading a loader never moves training's position: it draws from a copy of the stream. A row is the
dataset's own (its `prompt` and every other column, as the reward functions receive them).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from grpokit.config.schema import ConfigError
from grpokit.train.data import PromptStream


def _row(example: Any) -> dict[str, Any]:
    return {"prompt": example.prompt, **example.columns}


def _loader(batches: list[list[dict]]) -> DataLoader:
    """A DataLoader whose every item is one prepared batch (no re-batching, no tensor conversion)."""
    return DataLoader(batches, batch_size=None, shuffle=False, collate_fn=lambda batch: batch)


def train_dataloader(examples: list, *, seed: int, shuffle: bool, cursor: int, prompts_per_step: int,
                     num_generations: int) -> DataLoader:
    """One epoch of generation batches from `cursor` (module docstring)."""
    if not examples:
        raise ConfigError("get_train_dataloader() needs training prompts: this trainer has none (an "
                          "environment_factory that owns the data makes its prompts at each step)")
    stream = PromptStream(examples, seed, cursor=cursor, shuffle=shuffle)
    steps = max(1, len(examples) // prompts_per_step)
    batches = [[_row(ex) for ex in stream.take(prompts_per_step) for _ in range(num_generations)]
               for _ in range(steps)]
    return _loader(batches)


def eval_dataloader(examples: list, *, num_generations: int, batch_size: int) -> DataLoader:
    """The eval rows, each num_generations times in a row, in batches of batch_size rows."""
    if batch_size % num_generations:
        raise ConfigError(f"per_device_eval_batch_size ({batch_size}) must be a multiple of "
                          f"num_generations_eval (or num_generations) = {num_generations}: change one")
    rows = [_row(ex) for ex in examples for _ in range(num_generations)]
    return _loader([rows[i:i + batch_size] for i in range(0, len(rows), batch_size)])
