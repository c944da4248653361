"""From what the harness reported and how the sandbox ended to one `Result`.

The harness writes `<nonce> <kind> <index> <detail>` lines on its results pipe (grpokit/sandbox/harness.py);
lines without the run's nonce are ignored, and the first line for a test is the one that counts. The
outcome is the first that applies, in this order:

    output_too_large   stdout or stderr passed Limits.output_bytes (the runner stopped the sandbox)
    timeout            the wall-clock limit (runner), or the CPU limit (SIGXCPU, or SIGKILL with the
                       CPU time at the limit)
    memory             a MemoryError in the program or a test (the address-space limit)
    crash              the program raised at top level (syntax errors too), called sys.exit(non-zero),
                       died by a signal, or exited before the harness said `done` (os._exit)
    failed / passed    the harness said `done`: passed when every test passed
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

from grpokit.sandbox.limits import Limits, Result, SandboxUnavailable


@dataclass
class Report:
    """What the harness said on its results pipe."""

    started: bool = False                 # the harness ran (settings read, limits set)
    program: str = ""                     # '', 'ok', 'crash' or 'memory'
    program_detail: str = ""
    tests: dict[int, tuple[str, str]] = field(default_factory=dict)   # index -> (pass|fail|memory, detail)
    done: bool = False


@dataclass(frozen=True)
class Ending:
    """How the sandbox ended: why the runner stopped (`stopped`: exited, done, wall, output) and the wait
    status of its first process (bwrap, or the harness in process mode)."""

    stopped: str
    status: int
    cpu_seconds: float
    mode: str
    stream: str = ""                      # which stream passed the cap, when stopped == 'output'


def parse(raw: bytes, nonce: str, total: int) -> Report:
    report, prefix = Report(), nonce + " "
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith(prefix):
            continue
        kind, _, rest = line[len(prefix):].partition(" ")
        number, _, detail = rest.partition(" ")
        try:
            index = int(number)
        except ValueError:
            continue
        if kind == "start":
            report.started = True
        elif kind in ("prog_ok", "prog_crash", "prog_memory") and not report.program:
            report.program, report.program_detail = kind[5:], detail
        elif kind in ("pass", "fail", "memory") and isinstance(index, int) and 0 <= index < total:
            report.tests.setdefault(index, (kind, detail))
        elif kind == "done":
            report.done = True
    return report


def death_signal(ending: Ending) -> int:
    """The signal that ended the sandboxed process (0: none). bwrap reports a signal as exit 128 + n."""
    if os.WIFSIGNALED(ending.status):
        return os.WTERMSIG(ending.status)
    code = os.WEXITSTATUS(ending.status) if os.WIFEXITED(ending.status) else 0
    return code - 128 if ending.mode == "bwrap" and 128 < code < 128 + 65 else 0


def _where(report: Report, total: int) -> str:
    if report.program != "ok":
        return "while the program ran"
    i = len(report.tests)
    return f"during test {i}" if i < total else "after the last test"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify(report: Report, ending: Ending, *, limits: Limits, total: int, seconds: float,
             stdout: str, stderr: str) -> Result:
    """The Result of one run (the order in the module docstring)."""
    passed = sum(kind == "pass" for kind, _ in report.tests.values())

    def result(outcome: str, detail: str) -> Result:
        return Result(outcome=outcome, passed=passed, total=total, seconds=seconds, stdout=stdout,
                      stderr=stderr, detail=detail)

    sig = 0 if report.done else death_signal(ending)
    if ending.stopped == "output":
        return result("output_too_large", f"{ending.stream} passed {limits.output_bytes} bytes "
                                          f"{_where(report, total)}: the run was stopped")
    if ending.stopped == "wall":
        return result("timeout", f"wall-clock limit of {limits.wall_seconds:g} s reached "
                                 f"{_where(report, total)}")
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and ending.cpu_seconds >= limits.cpu_seconds):
        return result("timeout", f"CPU limit of {limits.cpu_seconds:g} s reached {_where(report, total)}")
    memory = [d for kind, d in report.tests.values() if kind == "memory"]
    if report.program == "memory" or memory:
        return result("memory", report.program_detail if report.program == "memory" else memory[0])
    if report.program == "crash":
        return result("crash", f"program: {report.program_detail}")
    if not report.started:
        lines = [line for line in stderr.splitlines() if line.strip()]
        raise SandboxUnavailable("the sandbox did not start: "
                                 f"{lines[-1].strip() if lines else f'exit status {ending.status}'}")
    if sig:
        return result("crash", f"killed by {_signal_name(sig)} {_where(report, total)}")
    if not report.done:
        code = os.WEXITSTATUS(ending.status) if os.WIFEXITED(ending.status) else ending.status
        return result("crash", f"the process exited (status {code}) {_where(report, total)}")
    if passed == total:
        return result("passed", "")
    first = next(i for i in range(total) if report.tests.get(i, ("",))[0] != "pass")
    return result("failed", report.tests.get(first, ("", f"test {first} reported nothing"))[1])
