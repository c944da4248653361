"""`GRPOConfig`: TRL's flat config, field for field, with TRL 1.16's defaults.

    from grpokit.trl import GRPOConfig
    args = GRPOConfig(output_dir="out", learning_rate=1e-6, num_generations=8, beta=0.04)

It holds values only; `grpokit.trl.translate` turns them into grpokit's nested, typed config (the
same translation takes a real `trl.GRPOConfig`). An unknown name is rejected at once with a
suggestion, a refused field when the trainer is built, with the reason. Not to be confused with
`grpokit.config.schema.GRPOConfig`, grpokit's own nested config, whose defaults are the paper's.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

from grpokit.config.schema import ConfigError
from grpokit.trl.fields import FIELDS


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name, list(FIELDS), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class GRPOConfig:
    """TRL's GRPOConfig fields as keyword arguments (see grpokit.trl.fields.FIELDS for each one's fate).

    Args:
        **values: any field of trl.GRPOConfig (and of the transformers.TrainingArguments it inherits);
            unset fields keep TRL 1.16's defaults (loss_type='dapo', beta=0.0, seed=42, ...).

    Raises:
        ConfigError: a name that is not a TRL GRPOConfig field.
    """

    def __init__(self, **values: Any) -> None:
        for name in values:
            if name not in FIELDS:
                raise ConfigError(f"unknown GRPOConfig field '{name}'{_suggest(name)}: "
                                  "grpokit.trl.fields lists TRL's fields")
        for name, f in FIELDS.items():
            setattr(self, name, copy.deepcopy(values[name]) if name in values else copy.deepcopy(f.default))

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in FIELDS:
            raise ConfigError(f"unknown GRPOConfig field '{name}'{_suggest(name)}")
        object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}

    def __repr__(self) -> str:
        changed = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if v != FIELDS[k].default)
        return f"GRPOConfig({changed})"
