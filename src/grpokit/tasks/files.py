"""Tasks read from JSON-lines files: GSM8K, MATH-500 and any jsonl with a prompt and an answer.

`task.path` is a file or a folder holding ``{split}.jsonl``. Without it, GSM8K and MATH-500 look
for ``../shared/data/<task>`` beside the working directory, then for the Hugging Face hub through
`datasets` when that is installed; otherwise the error says to set `task.path`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from grpokit.config.schema import TaskConfig
from grpokit.rewards.answers import normalize_number
from grpokit.tasks.base import Problem, TaskError, read_jsonl, text_field

logger = logging.getLogger(__name__)

HUB = {"gsm8k": ("openai/gsm8k", "main"), "math500": ("HuggingFaceH4/MATH-500", None)}
# Lengths (tokens) each file task brings when it replaces the built-in demo's arithmetic (grpokit.cli.main):
# GSM8K questions reach ~850 characters (~250 BPE tokens) before any template, MATH-500 problems ~1,700
# and their solutions ~3,400; a jsonl task of unknown shape gets the paper defaults (512 / 256).
TASK_LENGTHS: dict[str, dict[str, int]] = {
    "gsm8k": {"rollout.max_prompt_length": 512, "rollout.max_completion_length": 512},
    "math500": {"rollout.max_prompt_length": 1024, "rollout.max_completion_length": 1024},
}
_CALCULATOR = re.compile(r"<<[^<>]*>>")


def _split_file(path: Path, split: str, task: TaskConfig) -> Path:
    """The file of one split under task.path (a folder, or a file serving every split)."""
    if path.is_dir():
        found = path / f"{split}.jsonl"
        if not found.is_file():
            have = ", ".join(sorted(p.stem for p in path.glob("*.jsonl"))) or "no .jsonl files"
            hint = "MATH-500 is a test set; " if task.name == "math500" else ""
            raise TaskError(f"task {task.name}: no '{split}' split in {path} (found: {have}): {hint}set "
                            f"task.train_split / task.eval_split to one of them, or add {split}.jsonl")
        return found
    sibling = path.with_name(f"{split}.jsonl")
    if path.stem != split and path.stem in (task.train_split, task.eval_split) and sibling.is_file():
        return sibling  # task.path=.../train.jsonl: the eval split is the test.jsonl beside it
    if split == task.eval_split and split != task.train_split:
        logger.warning("task.path %s is a single file: the '%s' split reuses it", path, split)
    return path


def _rows(task: TaskConfig, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) pairs of a split, from task.path, the shared data folder, or the hub."""
    if task.path is not None:
        path = Path(task.path).expanduser()
        if not path.exists():
            raise TaskError(f"task.path '{path}' does not exist: "
                            f"give a .jsonl file or a folder holding {split}.jsonl")
        yield from read_jsonl(_split_file(path, split, task))
        return
    shared = Path("..") / "shared" / "data" / task.name
    if shared.is_dir():
        yield from read_jsonl(_split_file(shared, split, task))
        return
    yield from _hub_rows(task, split)


def _hub_rows(task: TaskConfig, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if task.name not in HUB:
        raise TaskError(f"task {task.name} needs task.path: give a .jsonl file or a folder holding "
                        f"{split}.jsonl")
    try:
        import datasets
    except ImportError:
        raise TaskError(f"task {task.name}: no local data (../shared/data/{task.name} is missing) and the "
                        f"'datasets' package is not installed: set task.path to a folder holding "
                        f"{split}.jsonl") from None
    repo, config = HUB[task.name]
    try:
        rows: Iterable[dict[str, Any]] = datasets.load_dataset(repo, config, split=split)
    except Exception as e:  # offline, unknown split, hub errors: all mean "give a local file"
        msg = " ".join(str(e).split())[:160]
        raise TaskError(f"task {task.name}: could not load {repo} split '{split}' from the hub "
                        f"({type(e).__name__}: {msg}): set task.path to a local folder") from None
    for i, row in enumerate(rows):
        yield f"{repo} {split} row {i}", dict(row)


def gsm8k_final(answer: str, where: str) -> tuple[str, str]:
    """GSM8K's answer field -> (final answer without commas, reasoning without calculator marks)."""
    if "####" not in answer:
        raise TaskError(f"{where}: answer has no '#### <number>' final answer")
    reasoning, _, final = answer.rpartition("####")
    final = final.strip().replace(",", "")
    if normalize_number(final) is None:
        raise TaskError(f"{where}: final answer {final!r} after '####' is not a number")
    return final, _CALCULATOR.sub("", reasoning).strip()


def gsm8k_problems(task: TaskConfig, split: str) -> list[Problem]:
    out = []
    for where, row in _rows(task, split):
        question = text_field(row, "question", where)
        final, reasoning = gsm8k_final(text_field(row, "answer", where), where)
        out.append(Problem(question, final, reasoning, {"solution": f"{reasoning} \\boxed{{{final}}}"}))
    return out


def math500_problems(task: TaskConfig, split: str) -> list[Problem]:
    out = []
    for where, row in _rows(task, split):
        question = text_field(row, "problem", where)
        answer = text_field(row, "answer", where, allow_number=True)
        solution = row.get("solution") if isinstance(row.get("solution"), str) else ""
        extra = {k: v for k, v in row.items() if k not in ("problem", "answer")}
        out.append(Problem(question, answer, solution.strip(), extra))
    return out


def _messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value)


def jsonl_problems(task: TaskConfig, split: str) -> list[Problem]:
    out = []
    for where, row in _rows(task, split):
        value = row.get(task.prompt_column)
        question = value if _messages(value) else text_field(row, task.prompt_column, where)
        answer = text_field(row, task.answer_column, where, allow_number=True)
        solution = row.get("solution") if isinstance(row.get("solution"), str) else ""
        extra = {k: v for k, v in row.items() if k != task.prompt_column}
        out.append(Problem(question, answer, solution.strip(), extra))
    return out


LOADERS = {"gsm8k": gsm8k_problems, "math500": math500_problems, "jsonl": jsonl_problems}
