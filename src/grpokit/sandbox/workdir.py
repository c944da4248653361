"""process mode's folders and leftovers: where a run writes, and how nothing of it outlives the run.

bwrap mode needs none of this: its writable folders are tmpfs inside the sandbox and its processes live in
the sandbox's PID namespace, so both vanish with it, even when the caller is killed with SIGKILL.

process mode writes in a fresh folder under one known parent, `$TMPDIR/grpokit-sandbox-<uid>/`, named
`<owner>-<random>` where <owner> is the caller's pid and start time. Its processes carry
`GRPOKIT_SANDBOX_RUN=<owner>:<random>` in their environment. After each run, the folder is removed and
every process with the run's marker is killed (one that left the process group with setsid and cleared
its environment escapes: process mode is no isolation). A caller killed with SIGKILL cannot clean up; the
next process-mode run or SandboxPool of any caller removes the folders and kills the marked processes of
owners that are gone (`clean_stale`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

from grpokit.sandbox.command import MARKER_ENV
from grpokit.sandbox.limits import SandboxUnavailable


def base_dir() -> Path:
    """The parent of every process-mode folder of this user (created 0700, refused if someone else's)."""
    base = Path(tempfile.gettempdir()) / f"grpokit-sandbox-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise SandboxUnavailable(f"'{base}' is not a folder of this user: remove it, or set TMPDIR elsewhere")
    return base


def _start_time(pid: int) -> str | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 else None    # field 22 of stat: start time, in clock ticks


@cache
def owner_id() -> str:
    """'<pid>.<start time>' of this process: unique on this machine while it lives."""
    return f"{os.getpid()}.{_start_time(os.getpid())}"


def owner_alive(owner: str) -> bool:
    pid, _, start = owner.partition(".")
    return pid.isdigit() and _start_time(int(pid)) == start


@contextlib.contextmanager
def run_dir() -> Iterator[str]:
    """A fresh folder for one process-mode run, removed when the block ends, whatever ended it."""
    path = tempfile.mkdtemp(prefix=f"{owner_id()}-", dir=base_dir())
    try:
        yield path
    finally:
        remove_tree(path)


def remove_tree(path: str | Path) -> None:
    """rmtree that also removes what the program made unreadable (chmod 000 folders); links not followed."""
    if not os.path.lexists(path):
        return
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    for top, dirs, _ in os.walk(path):
        for d in dirs:
            inner = os.path.join(top, d)
            if not os.path.islink(inner):
                with contextlib.suppress(OSError):
                    os.chmod(inner, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def marked_processes(match: Callable[[str], bool]) -> list[int]:
    """Pids whose environment's MARKER_ENV value satisfies `match` (processes we may not read: skipped)."""
    key, found = (MARKER_ENV + "=").encode(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(key) and match(item[len(key):].decode("ascii", "replace")):
                found.append(int(entry.name))
                break
    return found


def kill_marked(match: Callable[[str], bool], rounds: int = 20) -> int:
    """SIGKILL the processes whose marker satisfies `match`, again while new ones appear; how many."""
    killed = 0
    for _ in range(rounds):
        pids = marked_processes(match)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def clean_stale() -> int:
    """Remove the folders and kill the processes that process-mode runs of vanished callers left; how many
    folders and processes."""
    removed = 0
    for entry in os.scandir(base_dir()):
        owner = entry.name.partition("-")[0]
        if entry.is_dir(follow_symlinks=False) and not owner_alive(owner):
            remove_tree(entry.path)
            removed += 1
    return removed + kill_marked(lambda marker: not owner_alive(marker.partition(":")[0]))
