"""The sandbox's contract: what a run may use (`Limits`), what it reports (`Result`), and its one error.

    Limits(cpu_seconds=2.0, wall_seconds=5.0, memory_mib=512)   # the rest keep their defaults
    Result(outcome="failed", passed=2, total=3, ...).fraction   # 0.666..., the reward of a code task

Every limit is checked when the object is built: a value that is not a positive number raises
`grpokit.errors.ConfigError` with one line naming the field.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, fields

from grpokit.config.choices import SandboxMode
from grpokit.errors import ConfigError, suggest

# how a run ended, most severe reason first when several apply (`grpokit.sandbox.outcome.classify`)
OUTCOMES = ("passed", "failed", "timeout", "memory", "crash", "output_too_large")
MODES = typing.get_args(SandboxMode)   # bwrap: namespaces + limits; process: limits only, no isolation


class SandboxUnavailable(ConfigError):
    """The sandbox cannot run here (bubblewrap missing or refused, Python unable to start in it): one line
    saying what to install or change."""


@dataclass(frozen=True)
class Limits:
    """What one run of a program and its tests may use; every field must be positive.

    cpu_seconds: CPU time of the interpreter (RLIMIT_CPU, whole seconds, rounded up); reaching it: timeout.
    wall_seconds: wall-clock time from start to the last test; reaching it: timeout (the whole sandbox
        is killed).
    memory_mib: address space of each process (RLIMIT_AS); exceeding it: MemoryError -> outcome memory.
    processes: processes and threads the sandbox's user may hold at once (RLIMIT_NPROC), the
        interpreter included; a fork bomb stops there.
    file_size_mib: largest file the program may write (RLIMIT_FSIZE).
    open_files: open file descriptors per process (RLIMIT_NOFILE).
    output_bytes: what each of stdout and stderr may carry; more: outcome output_too_large, killed.
    disk_mib: size of the program's writable folder in bwrap mode (a tmpfs; process mode cannot bound it).
    """

    cpu_seconds: float = 2.0
    wall_seconds: float = 5.0
    memory_mib: int = 512
    processes: int = 32
    file_size_mib: int = 16
    open_files: int = 64
    output_bytes: int = 64 * 1024
    disk_mib: int = 64

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"sandbox limit {f.name}={value!r}: give a positive number")
            if f.type in ("int", int):
                if value != int(value):
                    raise ConfigError(f"sandbox limit {f.name}={value!r}: give a whole number")
                object.__setattr__(self, f.name, int(value))   # 512.0 -> 512: rlimits take integers
        if self.open_files < 8:
            raise ConfigError(f"sandbox limit open_files={self.open_files}: give at least 8 "
                              "(the interpreter needs its standard streams and a few files)")


@dataclass(frozen=True)
class Result:
    """How one program did on its tests.

    outcome: one of OUTCOMES. passed: tests that passed, out of total (a test is one statement run after
    the program, e.g. "assert f(3) == 4"). seconds: wall-clock time of the run, sandbox start included.
    stdout, stderr: what the program printed, each cut at Limits.output_bytes. detail: one line, the
    first failing assert, the exception, the signal, or the limit that was reached ('' when passed).
    """

    outcome: str
    passed: int
    total: int
    seconds: float
    stdout: str = ""
    stderr: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"Result outcome '{self.outcome}' is none of {', '.join(OUTCOMES)}")

    @property
    def fraction(self) -> float:
        """passed / total, the reward of a code task; 0.0 when there are no tests."""
        return self.passed / self.total if self.total else 0.0


def check_mode(mode: str) -> str:
    """mode itself when it is one of MODES, else ConfigError naming the choices."""
    if mode not in MODES:
        raise ConfigError(f"sandbox mode '{mode}' is unknown{suggest(str(mode), MODES)}: "
                          f"use one of {', '.join(MODES)}")
    return mode
