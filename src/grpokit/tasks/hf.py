"""TRL-format data: a `prompt` column (text, or chat messages) and any other columns for the rewards.

The same rows reach the trainer from Python (`grpokit.trl.GRPOTrainer(train_dataset=...)`, a
`datasets.Dataset`, `IterableDataset` or list of dicts) and from the command line
(``task.name=hf task.path=...``: a .jsonl / .json / .parquet / .csv file, a folder holding
``{split}.<ext>`` files, or a `save_to_disk` folder, read with `datasets`):

    prompt                    -> the policy's prompt; chat messages go through the chat template
    every other column        -> a keyword list for the reward functions, one value per completion
    task.answer_column        -> only if present: grpokit's accuracy metric (TRL needs no answer)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from grpokit.config.schema import TaskConfig
from grpokit.tasks.base import Example, TaskError

# Keywords every reward call already carries: a column with one of these names would collide.
RESERVED = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")
_EXTENSIONS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _datasets():
    try:
        import datasets
    except ImportError:
        raise TaskError("task.name=hf needs the 'datasets' package: pip install 'grpokit[hf]'") from None
    return datasets


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value)


def examples_from_rows(rows: Iterable[dict[str, Any]], prompt_column: str = "prompt",
                       answer_column: str = "answer", where: str = "the dataset") -> list[Example]:
    """TRL-format rows as grpokit Examples.

    Args:
        rows: dicts with a prompt column (a string, or a list of {'role', 'content'} messages).
        prompt_column: the column holding the prompt (TRL: 'prompt').
        answer_column: a column grpokit's accuracy metric reads when present (optional).
        where: names the data in error messages.

    Returns:
        One Example per row; its columns are the row's other columns, exactly as they are.

    Raises:
        TaskError: a missing or empty prompt, or a column named like a reward keyword.
    """
    out = []
    for i, row in enumerate(rows):
        row = dict(row)
        if i == 0:
            clash = [c for c in row if c in RESERVED]
            if clash:
                raise TaskError(f"{where}: column '{clash[0]}' collides with a reward-function keyword: "
                                "rename it")
        prompt = row.get(prompt_column)
        if not (_is_messages(prompt) or (isinstance(prompt, str) and prompt.strip())):
            have = ", ".join(map(str, row)) or "none"
            raise TaskError(f"{where} row {i}: column '{prompt_column}' must be text or chat messages "
                            f"[{{'role', 'content'}}], got {prompt!r:.60} (columns: {have})")
        answer = row.get(answer_column)
        columns = {k: v for k, v in row.items() if k != prompt_column}
        out.append(Example(prompt, "" if answer is None else str(answer), columns))
    if not out:
        raise TaskError(f"{where} has no rows: give at least one prompt")
    return out


def _load_split(path: Path, split: str, task: TaskConfig):
    """A datasets.Dataset for one split of task.path."""
    datasets = _datasets()
    if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "dataset_info.json").is_file()):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise TaskError(f"task hf: no '{split}' split in {path} (found: {', '.join(loaded)}): set "
                                "task.train_split / task.eval_split to one of them")
            return loaded[split]
        if split != task.train_split:
            raise TaskError(f"task hf: {path} is one Dataset (no splits): it serves only task.train_split; "
                            "set run.eval_limit=0 or save a DatasetDict")
        return loaded
    if path.is_dir():
        found = [path / f"{split}{ext}" for ext in _EXTENSIONS if (path / f"{split}{ext}").is_file()]
        if not found:
            have = ", ".join(sorted(p.name for p in path.iterdir() if p.suffix in _EXTENSIONS)) or "none"
            raise TaskError(f"task hf: no '{split}' file in {path} (found: {have}): add {split}.jsonl or "
                            "{split}.parquet, or set task.train_split / task.eval_split")
        path = found[0]
    elif split != task.train_split:
        sibling = [p for p in (path.with_name(f"{split}{ext}") for ext in _EXTENSIONS) if p.is_file()]
        if not sibling:
            raise TaskError(f"task hf: task.path {path} is one file, for task.train_split; put {split}"
                            f"{path.suffix} beside it or set run.eval_limit=0")
        path = sibling[0]
    kind = _EXTENSIONS.get(path.suffix)
    if kind is None:
        raise TaskError(f"task hf: cannot read {path.name}: give a .jsonl, .json, .parquet or .csv file, "
                        "or a save_to_disk folder")
    try:
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    except (OSError, ValueError, datasets.exceptions.DatasetGenerationError) as e:  # a bad file: name it
        msg = " ".join(str(e).split())[:160]
        raise TaskError(f"task hf: {path} could not be read ({type(e).__name__}: {msg}): fix the "
                        "file") from None


def hf_examples(task: TaskConfig, split: str) -> list[Example]:
    """The Examples of one split of ``task.name=hf`` (see the module docstring for task.path)."""
    if task.path is None:
        raise TaskError("task.name=hf needs task.path: a .jsonl / .parquet file or a save_to_disk folder")
    path = Path(task.path).expanduser()
    if not path.exists():
        raise TaskError(f"task.path '{path}' does not exist: give a data file or a save_to_disk folder")
    return examples_from_rows(_load_split(path, split, task), task.prompt_column, task.answer_column,
                              where=f"{path} ({split})")
