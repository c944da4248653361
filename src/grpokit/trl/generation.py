"""TRL's transformers-generate options (min_p, repetition_penalty, cache_implementation, generation_kwargs)
on grpokit: the translation sends sampling through `model.generate` (rollout.backend=generate), and
these values sit on the model's `generation_config` while the trainer samples, then the previous values
come back (the saved model's generation_config stays the user's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_MISSING = object()


@contextlib.contextmanager
def generation_options(model: Any, options: dict[str, Any]) -> Iterator[None]:
    """For the duration, `model.generation_config` carries `options` (nothing to do when empty)."""
    owner = model.get_base_model() if hasattr(model, "get_base_model") else model   # a PeftModel's base
    config = getattr(owner, "generation_config", None)
    if not options or config is None:
        yield
        return
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
