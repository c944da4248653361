"""The records every task produces, and the JSON-lines reader with line-numbered errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple


class TaskError(ValueError):
    """Bad task data or settings; the message is one line (for a bad row: file and line number)."""


@dataclass
class Example:
    """One training or evaluation prompt with what its rewards need."""

    prompt: str | list[dict]  # text, or chat messages [{'role', 'content'}] when task.chat_template
    answer: str  # reference final answer (GSM8K: the text after '####', commas removed)
    columns: dict[str, Any] = field(default_factory=dict)  # reward keywords; always holds 'answer'


class Problem(NamedTuple):
    """A task's raw item before prompting: what a few-shot demonstration is made of too."""

    question: str | list[dict]  # the question text (or chat messages from a jsonl prompt column)
    answer: str
    reasoning: str  # worked solution before the boxed answer ('' when the data has none)
    columns: dict[str, Any]  # extra reward columns from the data ('solution', 'subject', ...)


def read_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) for each non-blank line; `where` is 'path line N' for error messages.

    Raises:
        TaskError: a line that is not UTF-8, not JSON or not an object; a file with no rows at all.
    """
    rows = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path} line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TaskError(f"{where}: not UTF-8 text (byte {e.start} of the line): save the file as "
                                "UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskError(f"{where}: not valid JSON ({e.msg} at column {e.colno}): "
                                f"fix or remove the line") from None
            if not isinstance(row, dict):
                raise TaskError(f"{where}: expected a JSON object, got {type(row).__name__}")
            rows += 1
            yield where, row
    if not rows:
        raise TaskError(f"'{path}' has no examples (the file is empty or holds only blank lines): add one "
                        "JSON object per line, or point task.path at another file")


def text_field(row: dict[str, Any], key: str, where: str, allow_number: bool = False) -> str:
    """A required non-empty string field (numbers allowed for answers), stripped."""
    if key not in row:
        raise TaskError(f"{where}: missing field '{key}' (fields: {', '.join(map(str, row)) or 'none'})")
    value = row[key]
    if allow_number and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{where}: field '{key}' must be a non-empty string, got {value!r:.60}")
    return value.strip()
