"""TRL's transformers-generate options (min_p, repetition_penalty, cache_implementation, generation_kwargs)
on grpokit: the translation sends sampling through `model.generate` (rollout.backend=generate), and
these values sit on the model's `generation_config` while the trainer samples (with do_sample=True, so
the config stays valid), then the previous values come back; `restore_saved` rewrites the final model's
generation_config.json, saved during the run, with the user's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_MISSING = object()


@contextlib.contextmanager
def generation_options(model: Any, options: dict[str, Any]) -> Iterator[None]:
    """For the duration, `model.generation_config` carries `options` (nothing to do when empty)."""
    config = getattr(_owner(model), "generation_config", None)
    if not options or config is None:
        yield
        return
    options = {"do_sample": True, **options}
    before = {k: getattr(config, k, _MISSING) for k in options}
    for key, value in options.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is _MISSING:
                delattr(config, key)
            else:
                setattr(config, key, value)


def _owner(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model   # a PeftModel's base


def restore_saved(model: Any, folder: str | Path) -> None:
    """Rewrite generation_config.json in a saved model folder (and its LoRA merge) with the model's own."""
    config = getattr(_owner(model), "generation_config", None)
    for where in (Path(folder), Path(folder) / "merged"):
        if config is not None and (where / "generation_config.json").is_file():
            config.save_pretrained(where)
