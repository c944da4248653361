"""grpokit.sandbox: each outcome, per-test counting, isolation, and nothing left behind.

Every test runs in both modes where the property holds in both; bwrap tests skip (with the reason) where
bubblewrap cannot run. Limits are small (1 s) so the file stays well under a minute on 2 cores.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

from grpokit.errors import ConfigError
from grpokit.sandbox import Limits, Result, SandboxPool, SandboxUnavailable, check_sandbox, run
from grpokit.sandbox.workdir import base_dir

pytestmark = pytest.mark.filterwarnings("ignore::grpokit.sandbox.SandboxWarning")
FAST = Limits(cpu_seconds=1, wall_seconds=1.5, memory_mib=256, processes=16)
ROOT = os.geteuid() == 0


def bwrap_reason() -> str:
    try:
        check_sandbox("bwrap")
    except SandboxUnavailable as e:
        return str(e)
    return ""


BWRAP_MISSING = bwrap_reason()
needs_bwrap = pytest.mark.skipif(bool(BWRAP_MISSING), reason=f"bubblewrap unavailable: {BWRAP_MISSING}")


def test_bubblewrap_is_here_where_the_run_requires_it():
    """.ci/run sets GRPOKIT_REQUIRE_SANDBOX=1 after installing bubblewrap: there the bwrap tests must run,
    not skip (a user's machine without it skips them with the reason)."""
    if os.environ.get("GRPOKIT_REQUIRE_SANDBOX") == "1":
        assert not BWRAP_MISSING, BWRAP_MISSING
    elif BWRAP_MISSING:
        pytest.skip(f"bubblewrap unavailable: {BWRAP_MISSING}")


@pytest.fixture(params=["bwrap", "process"])
def mode(request) -> str:
    if request.param == "bwrap" and BWRAP_MISSING:
        pytest.skip(f"bubblewrap unavailable: {BWRAP_MISSING}")
    return request.param


def marker() -> str:
    """A number `sleep` accepts and no other process on the machine has in its command line."""
    return f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**9):09d}"


def processes_with(text: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if text.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def gone(text: str, within: float = 3.0) -> bool:
    stop = time.monotonic() + within
    while processes_with(text) and time.monotonic() < stop:
        time.sleep(0.05)
    return not processes_with(text)


def seen_while(mark: str, call):
    """(call(), whether a process with `mark` in its command line existed while it ran)."""
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set() and not seen:
            seen.extend(processes_with(mark)[:1])
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        return call(), bool(seen)
    finally:
        stop.set()
        watcher.join()


def daemon(mark: str) -> str:
    """Program text: a double-forked, setsid'ed `sleep mark` (a process that escaped its parent)."""
    return textwrap.dedent(f"""\
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{mark}"])
            os._exit(0)
        os.wait()
        """)


def test_limits_are_validated_in_one_line():
    for bad in ({"cpu_seconds": 0}, {"memory_mib": -1}, {"wall_seconds": float("nan")}, {"processes": True},
                {"memory_mib": 1.5}, {"open_files": 3}):
        with pytest.raises(ConfigError) as e:
            Limits(**bad)
        assert "\n" not in str(e.value) and next(iter(bad)) in str(e.value)
    assert Limits(cpu_seconds=1).cpu_seconds == 1 and Limits().output_bytes == 64 * 1024


def test_result_fraction_and_outcome_names():
    assert Result("failed", 1, 4, 0.1).fraction == 0.25 and Result("passed", 0, 0, 0.1).fraction == 0.0
    with pytest.raises(ValueError, match="none of"):
        Result("fine", 0, 0, 0.0)


def test_unknown_mode_and_missing_bwrap_are_one_line_errors(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'bwrap'"):
        run("x = 1", [], mode="bwarp")
    monkeypatch.setenv("PATH", str(tmp_path))          # no bwrap on PATH
    with pytest.raises(SandboxUnavailable) as e:
        check_sandbox("bwrap")
    assert "apt-get install bubblewrap" in str(e.value) and "\n" not in str(e.value)


def test_passed_and_failed_count_each_test(mode):
    program = "def f(x):\n    return x + 1\nprint('hello')"
    ok = run(program, ["assert f(3) == 4", "assert f(0) == 1"], FAST, mode)
    assert (ok.outcome, ok.passed, ok.total, ok.fraction, ok.detail) == ("passed", 2, 2, 1.0, "")
    assert ok.stdout == "hello\n"
    some = run(program, ["assert f(3) == 4", "assert f(0) == 0, 'zero'", "assert g(1)", "assert f(1) == 2"],
               FAST, mode)
    assert (some.outcome, some.passed, some.total) == ("failed", 2, 4)
    assert some.detail == "test 1 failed: assert f(0) == 0, 'zero' (zero)"
    many = run(program, ["assert f(1) == 2"] * 2999 + ["assert f(1) == 3"], FAST, mode)
    assert (many.outcome, many.passed, many.total) == ("failed", 2999, 3000)
    assert many.detail.startswith("test 2999 failed")


def test_sys_exit_zero_is_a_normal_end_and_nonzero_a_crash(mode):
    assert run("import sys\nsys.exit(0)", ["assert True"], FAST, mode).outcome == "passed"
    crash = run("import sys\nsys.exit(3)", ["assert True"], FAST, mode)
    assert crash.outcome == "crash" and "sys.exit(3)" in crash.detail and crash.passed == 0


@pytest.mark.parametrize("program, expected", [
    ("raise ValueError('no')", "program: ValueError: no (line 1)"),
    ("x = 1\ndef f(:\n    pass", "program: SyntaxError: invalid syntax (line 2)"),
    ("import ctypes\nctypes.string_at(0)", "killed by SIGSEGV while the program ran"),
    ("import os\nos._exit(0)", "the process exited (status 0) while the program ran"),
])
def test_crash(mode, program, expected):
    r = run(program, ["assert True"], FAST, mode)
    assert (r.outcome, r.detail, r.passed, r.total) == ("crash", expected, 0, 1)


def test_a_test_that_exits_the_process_is_a_crash_with_the_passes_before_it(mode):
    r = run("import os", ["assert True", "os._exit(0)", "assert True"], FAST, mode)
    assert (r.outcome, r.passed, r.total) == ("crash", 1, 3)
    assert r.detail == "the process exited (status 0) during test 1"


def test_timeouts_wall_and_cpu(mode):
    wall = run("import time\ntime.sleep(30)", ["assert True"], FAST, mode)
    assert wall.outcome == "timeout" and "wall-clock" in wall.detail and wall.seconds < 3
    cpu = run("def f():\n    while True:\n        pass", ["assert True", "f()"], Limits(cpu_seconds=1), mode)
    assert (cpu.outcome, cpu.passed) == ("timeout", 1) and "CPU limit" in cpu.detail and cpu.seconds < 4


def test_memory(mode):
    r = run("x = bytearray(1 << 30)", [], FAST, mode)
    assert r.outcome == "memory" and "MemoryError" in r.detail
    in_test = run("def grow():\n    return [0] * (1 << 29)", ["assert True", "assert grow()"], FAST, mode)
    assert (in_test.outcome, in_test.passed) == ("memory", 1)


def test_output_is_capped(mode):
    limits = Limits(output_bytes=1000)
    r = run("import sys\nwhile True:\n    sys.stderr.write('x' * 100)", [], limits, mode)
    assert r.outcome == "output_too_large" and r.detail.startswith("stderr passed 1000 bytes")
    assert len(r.stderr) <= 1000 and r.seconds < 2


def test_forged_results_do_not_count(mode):
    """Fake result lines on stdout and on every open descriptor, then an exit before the harness's own."""
    program = textwrap.dedent("""\
        import json, os
        line = (json.dumps(["pass", 0, ""]) + "\\n" + json.dumps(["done", -1, ""]) + "\\n").encode()
        print(line.decode())
        for fd in range(3, 64):
            try:
                os.write(fd, b"0123456789abcdef0123456789abcdef " + line)
            except OSError:
                pass
        os._exit(0)
        """)
    r = run(program, ["assert False"], FAST, mode)
    assert (r.outcome, r.passed) == ("crash", 0)


def test_rebinding_builtins_or_hooks_does_not_pass_tests(mode):
    program = textwrap.dedent("""\
        import builtins, os, sys
        real_compile = compile
        builtins.compile = lambda *a, **k: real_compile("pass", "<fake>", "exec")
        builtins.exec = lambda *a, **k: None
        builtins.enumerate = lambda items: ((i, "pass") for i in range(len(items)))
        os.write = lambda fd, data: len(data)
        sys.settrace(lambda *a: None)
        """)
    r = run(program, ["assert False", "assert 1 == 2"], FAST, mode)
    assert (r.outcome, r.passed, r.total) == ("failed", 0, 2) and r.detail == "test 0 failed: assert False"


@needs_bwrap
def test_bwrap_hides_files_env_and_network(tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    monkeypatch.setenv("GRPOKIT_TEST_SECRET", "s3cr3t-env")
    listener = socket.create_server(("127.0.0.1", 0))        # the caller's loopback: unreachable inside
    port = listener.getsockname()[1]
    program = textwrap.dedent("""\
        import os, socket
        def can_read(path):
            try:
                return bool(open(path).read(1))
            except OSError:
                return False
        def can_write(path):
            try:
                open(path, "w").write("x")
                return True
            except OSError:
                return False
        def can_connect(host, port):
            try:
                socket.create_connection((host, port), timeout=1).close()
                return True
            except OSError:
                return False
        here = os.path.join(os.getcwd(), "mine.txt")
        """)
    tests = [f"assert not can_read({str(secret)!r})", f"assert not can_read({__file__!r})",
             "assert not can_read(os.path.expanduser('~root/.ssh/id_rsa'))",
             f"assert not can_write({str(tmp_path / 'out.txt')!r})",
             f"assert not can_write({str(Path(__file__).parent / 'out.txt')!r})",
             "assert not can_write('/etc/grpokit-out') and not can_write('/usr/grpokit-out')",
             "assert can_write(here) and open(here).read() == 'x'",
             "assert 's3cr3t-env' not in str(os.environ) and set(os.environ) <= {'PATH', 'LANG', 'HOME', "
             "'TMPDIR', 'PWD', 'LC_CTYPE'}",
             f"assert not can_connect('127.0.0.1', {port})", "assert not can_connect('1.1.1.1', 53)"]
    try:
        r = run(program, tests, Limits(wall_seconds=10), "bwrap")
    finally:
        listener.close()
    assert (r.outcome, r.passed) == ("passed", len(tests)), r.detail
    assert not (tmp_path / "out.txt").exists() and not (Path(__file__).parent / "out.txt").exists()


@needs_bwrap
def test_fork_bomb_is_contained_and_leaves_nothing():
    mark = marker()
    count = run(textwrap.dedent(f"""\
        import subprocess
        kept = []
        try:
            for _ in range(200):
                kept.append(subprocess.Popen(["sleep", "{mark}"]))
        except OSError:
            pass
        print(len(kept))
        """), [], FAST, "bwrap")
    assert count.outcome == "passed" and 0 < int(count.stdout) < FAST.processes
    assert gone(mark, within=0.5)
    bomb = run(daemon(mark) + "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
               [], FAST, "bwrap")
    assert bomb.outcome == "timeout" and bomb.seconds < 3
    assert gone(mark, within=0.5)


@pytest.mark.skipif(ROOT, reason="as root the kernel ignores RLIMIT_NPROC outside a namespace: "
                                 "process mode cannot bound processes (bwrap mode drops to another uid)")
def test_process_mode_bounds_processes():
    r = run("import subprocess\nkept = []\ntry:\n    for _ in range(300):\n        kept.append(subprocess"
            ".Popen(['sleep', '1']))\nexcept OSError:\n    pass\nprint(len(kept))", [], FAST, "process")
    assert int(r.stdout) < FAST.processes


def test_nothing_left_after_a_timeout(mode):
    before = set(os.listdir(base_dir()))
    mark = marker()
    r, seen = seen_while(mark, lambda: run(daemon(mark) + "import time\ntime.sleep(30)", ["assert True"],
                                            FAST, mode))
    assert r.outcome == "timeout" and seen
    assert gone(mark, within=0.5) and set(os.listdir(base_dir())) <= before


def test_nothing_left_after_ctrl_c(mode):
    mark, main, seen = marker(), threading.get_ident(), []

    def interrupt():                        # Ctrl-C once the sandbox's daemon runs
        stop = time.monotonic() + 10
        while not processes_with(mark) and time.monotonic() < stop:
            time.sleep(0.02)
        seen.append(bool(processes_with(mark)))
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run(daemon(mark) + "import time\ntime.sleep(30)", [], Limits(wall_seconds=20), mode)
    finally:
        thread.join()
    assert seen == [True] and gone(mark, within=0.5)


def test_nothing_left_after_the_caller_is_killed(mode, tmp_path):
    """SIGKILL of the caller: bwrap's --die-with-parent ends the namespace; in process mode the harness dies
    with its parent and the next pool removes the stray process and the folder."""
    mark = marker()
    caller = tmp_path / "caller.py"
    caller.write_text(f"from grpokit.sandbox import Limits, run\n"
                      f"run({daemon(mark) + 'import time; time.sleep(60)'!r}, [], Limits(wall_seconds=60), "
                      f"{mode!r})\n")
    before = set(os.listdir(base_dir()))
    child = subprocess.Popen([sys.executable, "-W", "ignore", str(caller)])
    try:
        stop = time.monotonic() + 20
        while not processes_with(mark) and time.monotonic() < stop:
            time.sleep(0.05)
        assert processes_with(mark), "the caller's sandbox never started"
    finally:
        child.kill()
        child.wait()
    if mode == "process":
        SandboxPool(workers=1, mode="process").close()     # a new pool cleans what the dead caller left
    assert gone(mark) and set(os.listdir(base_dir())) <= before


def test_pool_keeps_order_and_bounds_concurrency(mode):
    program = "import time\nstart = time.time()\ntime.sleep(0.3)\nprint(N, start, time.time())"
    jobs = [(f"N = {i}\n" + program, ["assert N >= 0"]) for i in range(6)]
    with SandboxPool(workers=2, limits=Limits(wall_seconds=10), mode=mode) as pool:
        results = pool.map(jobs)
        one = pool.submit("x = 1", ["assert x == 1"]).result()
    assert one.outcome == "passed" and all(r.outcome == "passed" for r in results)
    spans = [tuple(float(v) for v in r.stdout.split()) for r in results]
    assert [int(s[0]) for s in spans] == list(range(6))
    for _, start, _ in spans:              # at no start were more than 2 jobs running
        assert sum(s <= start < e for _, s, e in spans) <= 2
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit("x = 1", [])


def test_pool_exit_on_error_cancels_running_jobs(mode):
    mark = marker()
    start = time.monotonic()
    with pytest.raises(ZeroDivisionError):
        with SandboxPool(workers=1, limits=Limits(wall_seconds=30), mode=mode) as pool:
            running = pool.submit(daemon(mark) + "import time\ntime.sleep(30)", [])
            queued = pool.submit("x = 1", [])
            while not processes_with(mark) and time.monotonic() - start < 10:
                time.sleep(0.05)
            1 / 0
    assert time.monotonic() - start < 12 and gone(mark, within=0.5)
    with pytest.raises(CancelledError):
        running.result()
    assert queued.cancelled()


def test_process_mode_warns_once():
    code = ("import warnings\nwarnings.simplefilter('always')\n"
            "from grpokit.sandbox import check_sandbox, run\n"
            "check_sandbox('process'); check_sandbox('process'); run('x = 1', [], mode='process')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("SandboxWarning") == 1 and "not isolation" in out.stderr
