"""One writer per output folder: an OS file lock, held for the length of a run.

    lock = FolderLock(Path("runs/x/.grpokit.lock"), "run.output_dir 'runs/x'")   # grpokit train's
    lock.acquire()                                   # a second run: RunInUseError naming the first one
    ...
    lock.release()                                   # the lock file is deleted again

The lock is `fcntl.flock` on the lock file: the kernel drops it when the holding process ends, however it
ends, so a SIGKILLed run never leaves a stale lock behind (its lock file stays, unlocked, and the next run
takes it over). The holder writes its pid, host, start time and command into the file for the refusal
message. Readers (`grpokit eval`, `plot`, `report`) never take the lock.

The file is deleted on release, so a finished run leaves no trace. Deleting a lock file is safe only
because `acquire` checks, once locked, that the path still names the file it locked: a process that
opened the file just before the holder deleted it would otherwise lock an orphan and run beside the
next one.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from grpokit.train.run_dir import OutputDirError


def sibling_lock(folder: Path) -> Path:
    """The lock file of a folder that a command replaces whole (`grpokit sft --out`, `grpokit rm train
    --out`): `.<name>.lock` beside it, since a lock file inside would be swapped out with the folder."""
    return folder.parent / f".{folder.name}.lock"


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as a user would type it (`python -m grpokit ...` reads `grpokit ...`)."""
    args = list(sys.argv if argv is None else argv)
    if args and (Path(args[0]).name in ("grpokit", "__main__.py")):
        args[0] = "grpokit"
    return " ".join(args)


class RunInUseError(OutputDirError):
    """Another live process holds the folder's lock: the message names it."""


class FolderLock:
    """An exclusive, non-blocking `flock` on `path` (created with its parent folders when missing).

    Folders that `acquire` had to create are removed again by `release` when they are left empty, so a
    run refused before writing anything leaves the file system as it found it.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = Path(path), what     # what: the folder as the user names it, for messages
        self._fd: int | None = None
        self._created: list[Path] = []

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise RunInUseError naming the process that holds it."""
        while self._fd is None:
            self._make_parents()
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:      # a releasing holder removed the folder it had created: again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise RunInUseError(f"{self.what} is in use by another run ({holder}): wait for it to end "
                                    f"or stop it, or choose another folder") from None
            if _same_file(fd, self.path):
                self._fd = fd
            else:                          # the holder deleted the file between our open and our lock
                os.close(fd)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command_line(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(self._fd, 0)
        os.write(self._fd, (json.dumps(info) + "\n").encode())

    def release(self) -> None:
        """Delete the lock file and drop the lock; remove folders that `acquire` created, when empty."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)      # while still locked: nobody can hold a lock on this file
        os.close(self._fd)
        self._fd = None
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError:                    # not empty: the run wrote into it, or another run did
                break
        self._created = []

    def _make_parents(self) -> None:
        missing = [p for p in [self.path.parent, *self.path.parent.parents] if not p.exists()]
        for folder in reversed(missing):
            try:
                folder.mkdir()
                self._created.append(folder)
            except FileExistsError:
                pass


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _holder(fd: int) -> str:
    """'pid 123 on host h, started ...: command' from the holder's lock file (it writes it right after
    locking: a refusal in that instant waits a moment for it)."""
    for _ in range(20):
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 1 << 16).decode("utf-8", "replace")
        try:
            info = json.loads(text)
            return (f"pid {info['pid']} on host {info['host']}, started {info['started']}: "
                    f"{info['command']}")
        except (ValueError, KeyError, TypeError):
            time.sleep(0.05)
    return "a process that wrote no details"
