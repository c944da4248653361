"""The command line that starts the harness, in each mode, and the settings it reads from stdin.

bwrap mode builds a fresh root from tmpfs and read-only binds, so only these are visible:

    /usr, /bin, /sbin, /lib* and /etc      read-only (the system's programs and libraries)
    the Python prefix(es) of sys.executable read-only (a venv: the venv and its base Python)
    /tmp (HOME and cwd), /dev/shm           fresh tmpfs of Limits.disk_mib each, the only writable places
    /proc, /dev                             the sandbox's own (its PID namespace, minimal devices)

Nothing else of the machine exists there: not /work, /home, /root, the caller's /tmp, ~/.ssh. Every
namespace is new (no network but a loopback nobody listens on, own PIDs, IPC, hostname), the environment
is cleared (PATH, LANG, HOME only) and bwrap kills the sandbox when its parent dies (--die-with-parent);
the writable folders are tmpfs inside the sandbox, so they vanish with it, even after a SIGKILL.

As root, bwrap runs without a user namespace and the harness drops to a random unprivileged uid before the
program runs: the kernel never applies RLIMIT_NPROC to uid 0, capabilities or not, so a fork bomb would not
stop otherwise. Without root, bwrap creates a user namespace (the kernel must allow unprivileged ones).

process mode runs the same harness with the same limits in a fresh folder, as the caller's user and with
the caller's view of the machine: resource limits, not isolation.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from functools import cache, lru_cache
from pathlib import Path

from grpokit.sandbox.limits import Limits

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
INSIDE_HOME = "/tmp"                      # the program's cwd, HOME and only writable folder in bwrap mode
PATH = "/usr/local/bin:/usr/bin:/bin"
UID_RANGE = (1 << 30, 1 << 31)            # as root: the sandbox's uid, random, far from real accounts'
MARKER_ENV = "GRPOKIT_SANDBOX_RUN"        # process mode: marks the run's processes for the final sweep
MIB = 1 << 20


@cache
def harness_source() -> str:
    """The text of grpokit/sandbox/harness.py, given to `python -I -c`."""
    return (Path(__file__).parent / "harness.py").read_text(encoding="utf-8")


def interpreter() -> list[str]:
    """The caller's interpreter, isolated (-I: no PYTHON* variables, no user site, no cwd on sys.path)."""
    return [sys.executable, "-I", "-c", harness_source()]


def python_dirs() -> list[str]:
    """The folders the interpreter needs beyond SYSTEM_DIRS: its prefixes (never sys.path, which may hold
    the project's own source through an editable install)."""
    exe = Path(sys.executable)
    found = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, exe.resolve().parent.parent,
                                           exe.parent.parent)}
    covered = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    kept: list[str] = []
    for d in sorted(found, key=len):
        inside = [c for c in covered + kept if d == c or d.startswith(c.rstrip("/") + "/")]
        if os.path.isdir(d) and d != "/" and not inside:
            kept.append(d)
    return kept


def _mounts(limits: Limits) -> list[str]:
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--dev", "/dev", "--proc", "/proc"]
    size = str(limits.disk_mib * MIB)
    args += ["--size", size, "--tmpfs", INSIDE_HOME, "--size", size, "--tmpfs", "/dev/shm"]
    made: set[str] = set()
    for d in python_dirs():
        parts = Path(d).parts
        for i in range(2, len(parts)):        # bwrap would create the parents 0700: unreadable once not root
            parent = str(Path(*parts[:i]))
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", d, d]
    return args


def bwrap_argv(limits: Limits, as_root: bool) -> list[str]:
    """bwrap's arguments up to the interpreter, ending with '--'; as root, no user namespace (the harness
    drops to an unprivileged uid instead)."""
    return [bwrap_path(), *_bwrap_argv(limits, as_root)]


@lru_cache(maxsize=32)
def _bwrap_argv(limits: Limits, as_root: bool) -> tuple[str, ...]:
    if as_root:
        unshare = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        unshare = ["--unshare-all"]            # a user namespace too; bwrap leaves no capability
    env = [a for k, v in inside_env(INSIDE_HOME).items() for a in ("--setenv", k, v)]
    return (*_mounts(limits), *unshare, "--die-with-parent", "--new-session", "--clearenv",
            *env, "--chdir", INSIDE_HOME, "--")


def bwrap_path() -> str:
    return shutil.which("bwrap") or "bwrap"


def inside_env(home: str) -> dict[str, str]:
    """All the environment the program gets: no tokens, no caller's HOME."""
    bin_dir = str(Path(sys.executable).parent)
    return {"PATH": f"{bin_dir}:{PATH}", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}


def settings(*, program: str, tests: list[str], limits: Limits, fd: int, nonce: str, mode: str,
             as_root: bool) -> dict:
    """What the harness reads from stdin (grpokit/sandbox/harness.py's `main`)."""
    uid = None
    if mode == "bwrap" and as_root:
        uid = UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0])
    nproc = limits.processes + (1 if mode == "bwrap" and not as_root else 0)   # + bwrap's init there
    if mode == "process" and not as_root:
        nproc += tasks_of_user(os.getuid())   # RLIMIT_NPROC counts the user's every task on the machine
    if mode == "process" and as_root:
        nproc = 0                              # the kernel never applies it to uid 0: not set
    return {"program": program, "tests": list(tests), "fd": fd, "nonce": nonce, "uid": uid,
            "owned": [INSIDE_HOME, "/dev/shm"] if uid is not None else [],
            "parent_death": mode == "process", "parent": os.getpid(),
            "limits": {"cpu": max(1, int(-(-limits.cpu_seconds // 1))), "as": limits.memory_mib * MIB,
                       "fsize": limits.file_size_mib * MIB, "nofile": limits.open_files, "nproc": nproc}}


def tasks_of_user(uid: int) -> int:
    """Threads of every process of `uid` now (what RLIMIT_NPROC counts)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total
