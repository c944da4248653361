"""The commands' error boundary: a user's mistake is one line and exit 2, a bug keeps its traceback.

Every `grpokit` command runs inside `run_command`. An exception whose type means "the input is
wrong" (`user_errors`: a bad config, model, data file, reward function, output path, ...) prints

    error: <one line naming the culprit and what to change>

and exits 2; any other exception is a bug in grpokit and propagates with its traceback. `--debug`
lets every exception propagate. Errors raised by other libraries on user input (torch, safetensors,
peft, file decoding) are turned into one of these types where they happen, so the message can name
the file or setting; the OS errors of a user-supplied path (permission denied, a folder where a
file was expected) are user errors as they are.

Output files are written aside and renamed (`written_aside`), so a failed command never leaves a
half-written or emptied file under the name the user asked for.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

# (module, class) of each user-error type; looked up lazily so that `grpokit --help` imports no torch
_USER_ERRORS = (("grpokit.model.loading", "ModelError"), ("grpokit.train.run_dir", "OutputDirError"),
                ("grpokit.rollout.groups", "PromptTooLongError"), ("grpokit.tasks", "TaskError"),
                ("grpokit.rewards.scoring", "RewardError"), ("grpokit.model.lora", "LoRAError"),
                ("grpokit.rollout.vllm_engine", "VLLMError"),
                ("grpokit.train.async_rollouts", "AsyncWorkerError"))


class ConfigError(ValueError):
    """A user error in the configuration: the message is one line that says what to change."""


def suggest(word: str, options: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the option closest to a mistyped word, or ''."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


class UserError(ValueError):
    """A bad command-line argument outside the config (an --out path, a run folder): says what to change."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that are the user's to fix: printed as one line, no traceback."""
    errors: list[type[BaseException]] = [ConfigError, UserError, FloatingPointError, FileNotFoundError,
                                         PermissionError, IsADirectoryError, NotADirectoryError]
    for module, name in _USER_ERRORS:
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def one_line(e: BaseException) -> str:
    """The message of a user error on one line; an OS error names its path."""
    if isinstance(e, OSError) and e.filename is not None:
        what = (e.strerror or type(e).__name__).lower()
        return f"'{e.filename}': {what}: check the path and its permissions"
    return " ".join(str(e).split()) or type(e).__name__


def run_command(command: Callable[[list[str]], int], argv: list[str], debug: bool = False) -> int:
    """Run one command; a user error becomes `error: ...` on stderr and exit 2 (--debug: the traceback).

    SIGINT / SIGTERM (`grpokit.train.interrupt.RunInterrupted`, or a bare Ctrl-C) print one line saying
    where the command stopped and exit 128 + the signal number (130, 143). An error marked `quiet` (a
    torchrun rank other than 0 repeating rank 0's) prints nothing.
    """
    try:
        return command(argv)
    except user_errors() as e:
        if debug:
            raise
        if not getattr(e, "quiet", False):
            print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt as e:
        if debug:
            raise
        if not getattr(e, "quiet", False):
            print(f"grpokit: {str(e) or 'interrupted'}", file=sys.stderr, flush=True)
        return getattr(e, "exit_code", 130)


def check_out_file(path: str | Path, flag: str) -> Path:
    """An output file path that can be written: not a folder, its parent not a file. Checked before work."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise UserError(f"{flag} '{out}' is a folder: give a file path, e.g. {flag} {out / 'out.json'}")
    _check_parent(out, flag)
    return out


def check_out_dir(path: str | Path, flag: str) -> Path:
    """An output folder path that can be created: not a file, no file on its way. Checked before work."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} '{out}' is a file: give a folder path")
    _check_parent(out, flag)
    return out


def _check_parent(out: Path, flag: str) -> None:
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag} '{out}': '{parent}' is a file, not a folder: choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} '{out}': cannot write in '{parent}' (permission denied): "
                        "choose another path")


@contextlib.contextmanager
def written_aside(path: Path) -> Iterator[Path]:
    """A hidden file `.tmp-<name>` beside path to write into; renamed to path when the block ends.

    The suffix is kept (`.tmp-reward.png`), so writers that infer the format from it still work.
    An error removes the hidden file and leaves whatever was at path untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_text_aside(path: Path, text: str) -> None:
    """Write text (UTF-8) to path through `written_aside`."""
    with written_aside(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
