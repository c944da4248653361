"""run(): one program and its tests in a sandbox, start to finish, nothing left behind.

    result = run("def f(x):\\n    return x + 1", ["assert f(3) == 4", "assert f(0) == 0"])
    result.outcome, result.passed, result.total, result.fraction   # 'failed', 1, 2, 0.5

The runner starts the sandbox in its own session (bwrap, or the harness in process mode), sends the
settings on stdin, and reads stdout, stderr and the results pipe together, each capped, until the harness
says `done`, the sandbox exits, the wall-clock limit passes, a stream passes its cap, or the caller
cancels. Then it ends everything (`_end`): in bwrap mode the PID namespace's init first (the kernel empties
the namespace before that init exits), then the whole process group with SIGKILL before reaping its
leader (so the group id cannot have been reused); in process mode it also kills the run's marked
processes and removes its folder.
A KeyboardInterrupt in the caller goes through the same end, then propagates.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import signal
import subprocess
import threading
import time
from concurrent.futures import CancelledError
from functools import cache

from grpokit.errors import ConfigError
from grpokit.sandbox.check import check_sandbox
from grpokit.sandbox.command import MARKER_ENV, bwrap_argv, inside_env, interpreter, settings
from grpokit.sandbox.limits import Limits, Result
from grpokit.sandbox.outcome import Ending, classify, parse
from grpokit.sandbox.workdir import clean_stale, kill_marked, owner_id, run_dir

RESULTS_BYTES = 1 << 20      # bytes kept from the results pipe, at least (a report line is at most ~400)
POLL_S = 0.05                # how often the runner looks at the clock and the sandbox's exit
STREAMS = ("stdout", "stderr", "results")


def run(program: str, tests: list[str], limits: Limits = Limits(), mode: str = "bwrap", *,
        cancel: threading.Event | None = None) -> Result:
    """Run `program`, then each of `tests` (Python statements, e.g. "assert f(3) == 4"), in a sandbox.

    Args:
        program: Python source, run as __main__.
        tests: statements run one by one after the program, in its namespace; each counts once.
        limits: what the run may use (grpokit.sandbox.Limits).
        mode: 'bwrap' (isolated: grpokit.sandbox.command) or 'process' (limits only).
        cancel: set it to stop the run (SandboxPool.close): the run then raises CancelledError.

    Returns:
        Result: outcome, passed / total, seconds, capped stdout and stderr, a one-line detail.
    """
    check_sandbox(mode)
    if not isinstance(limits, Limits):
        raise ConfigError(f"sandbox run: limits must be grpokit.sandbox.Limits, not {type(limits).__name__}")
    if not isinstance(program, str) or isinstance(tests, str) or not all(isinstance(t, str) for t in tests):
        raise ConfigError("sandbox run: give the program as a str and the tests as a list of str")
    if mode == "process":
        _clean_stale_once()
    as_root, nonce, start = os.geteuid() == 0, secrets.token_hex(16), time.monotonic()
    buffers = {name: bytearray() for name in STREAMS}
    with contextlib.ExitStack() as stack:
        workdir = stack.enter_context(run_dir()) if mode == "process" else None
        marker = f"{owner_id()}:{secrets.token_hex(8)}" if mode == "process" else ""
        read_fd, write_fd = os.pipe()
        stack.callback(os.close, read_fd)
        try:
            proc, inner = _spawn(mode, limits, workdir, write_fd, marker, as_root)
        finally:
            os.close(write_fd)
        try:
            _send(proc, settings(program=program, tests=tests, limits=limits, fd=write_fd, nonce=nonce,
                                 mode=mode, as_root=as_root))
            caps = {"stdout": limits.output_bytes, "stderr": limits.output_bytes,
                    "results": max(RESULTS_BYTES, 512 * (len(tests) + 8))}
            stopped, stream = _collect(proc, read_fd, buffers, caps=caps, nonce=nonce,
                                       deadline=start + limits.wall_seconds, cancel=cancel)
        finally:
            status, cpu = _end(proc, marker, inner)
    if stopped == "cancelled":
        raise CancelledError("the sandbox run was cancelled")
    cap = limits.output_bytes
    return classify(parse(bytes(buffers["results"]), nonce, len(tests)),
                    Ending(stopped=stopped, status=status, cpu_seconds=cpu, mode=mode, stream=stream),
                    limits=limits, total=len(tests), seconds=time.monotonic() - start,
                    stdout=buffers["stdout"][:cap].decode("utf-8", "replace"),
                    stderr=buffers["stderr"][:cap].decode("utf-8", "replace"))


@cache
def _clean_stale_once() -> int:
    return clean_stale()


def _spawn(mode: str, limits: Limits, workdir: str | None, write_fd: int, marker: str,
           as_root: bool) -> tuple[subprocess.Popen, int]:
    """Start the sandbox; (its first process, the pid of its PID namespace's init in bwrap mode, else 0)."""
    if mode == "process":
        env = {**inside_env(str(workdir)), MARKER_ENV: marker}
        return subprocess.Popen(interpreter(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(write_fd,), cwd=workdir, env=env,
                                start_new_session=True), 0
    info_read, info_write = os.pipe()       # bwrap writes {"child-pid": ...} there, then closes it
    try:
        argv = bwrap_argv(limits, as_root)
        argv = [*argv[:-1], "--info-fd", str(info_write), "--", *interpreter()]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(write_fd, info_write), cwd="/", env=inside_env("/"),
                                start_new_session=True)
        os.close(info_write)
        info_write = -1
        try:
            with os.fdopen(info_read, "rb", closefd=False) as f:
                text = f.read()
        except BaseException:               # a Ctrl-C right after the start: stop the sandbox first
            _end(proc, "", 0)
            raise
    finally:
        os.close(info_read)
        if info_write >= 0:
            os.close(info_write)
    try:
        return proc, int(json.loads(text)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return proc, 0                      # bwrap failed before its child: its status and stderr say why


def _send(proc: subprocess.Popen, cfg: dict) -> None:
    try:
        proc.stdin.write(json.dumps(cfg).encode())
        proc.stdin.close()
    except BrokenPipeError:                # the sandbox ended before reading: its status says why
        pass


def _collect(proc: subprocess.Popen, read_fd: int, buffers: dict[str, bytearray], *, caps: dict[str, int],
             nonce: str, deadline: float, cancel: threading.Event | None) -> tuple[str, str]:
    """Read the three pipes until the run is over; (why it stopped, the stream that passed its cap)."""
    done_line = f"{nonce} done ".encode()
    selector = selectors.DefaultSelector()
    for name, fd in zip(STREAMS, (proc.stdout.fileno(), proc.stderr.fileno(), read_fd)):
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ, name)
    try:
        while True:
            if cancel is not None and cancel.is_set():
                return "cancelled", ""
            left = deadline - time.monotonic()
            if left <= 0:
                return "wall", ""
            exited = _exited(proc.pid)              # before reading: all its output is in the pipes then
            over = _read_ready(selector, buffers, min(left, POLL_S), caps)
            if not over and (exited or done_line in buffers["results"]):
                over = _read_ready(selector, buffers, 0, caps, drain=True)
                if not over:
                    return ("done" if done_line in buffers["results"] else "exited"), ""
            if over:
                return "output", over
    finally:
        selector.close()


def _read_ready(selector: selectors.BaseSelector, buffers: dict[str, bytearray], timeout: float,
                caps: dict[str, int], drain: bool = False) -> str:
    """Read what is ready within `timeout` (drain: until nothing is left); the stream over its cap, or ''."""
    if not selector.get_map():              # every pipe at end of file: wait for the exit
        time.sleep(0 if drain else timeout)
        return ""
    while ready := selector.select(timeout):
        for key, _ in ready:
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                selector.unregister(key.fd)
                continue
            buf, cap = buffers[key.data], caps[key.data]
            buf += chunk[: max(0, cap + 1 - len(buf))]       # one byte past the cap tells it was passed
            if key.data != "results" and len(buf) > cap:     # past the results' cap: the rest is dropped
                return key.data
        if not drain or not selector.get_map():
            break
        timeout = 0
    return ""


def _exited(pid: int) -> bool:
    """Whether the leader has exited, without reaping it (WNOWAIT keeps its id reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _end(proc: subprocess.Popen, marker: str, inner: int) -> tuple[int, float]:
    """Stop the sandbox and everything in it, reap its first process; (wait status, CPU seconds).

    bwrap mode kills the namespace's init first: the kernel kills every process of the namespace before
    that init exits, and bwrap exits once it has reaped it, so when bwrap is reaped nothing is left. Its id
    is still the init's while bwrap runs (bwrap reaps it and exits at once, so the window is microseconds).
    """
    if inner and not _exited(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(inner, signal.SIGKILL)
        stop = time.monotonic() + 2.0
        while not _exited(proc.pid) and time.monotonic() < stop:
            time.sleep(0.002)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)   # the leader is unreaped: the group id is still its own
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            stream.close()
    if marker:
        kill_marked(lambda found: found == marker)
    return status, usage.ru_utime + usage.ru_stime
