"""The config's field helpers: a dataclass field that carries its help text (the config reference), and
a choice field whose help lists a `grpokit.config.choices` Literal's options."""

from __future__ import annotations

import json
import typing
from dataclasses import field
from typing import Any


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its documentation kept in the metadata (the config reference)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: json.loads(json.dumps(d)), metadata={"help": help},
                     **kw)
    return field(default=default, metadata={"help": help}, **kw)


def _choice(choice: Any, default: str, before: str = "", after: str = "", **notes: str) -> Any:
    """A field holding one of `choice`'s options (a `grpokit.config.choices` Literal): its help lists them,
    each with its note, between `before` and `after`; validation checks the value against the same type."""
    listed = " | ".join(f"{o} ({notes[o]})" if o in notes else o for o in typing.get_args(choice))
    return _f(default, before + listed + after)
