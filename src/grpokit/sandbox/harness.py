"""What runs inside the sandbox: `python -I -c <this file's text>`, its settings as JSON on stdin.

It imports nothing of grpokit (the project is not visible in the sandbox). In order:
1. read the settings from stdin, then point stdin at /dev/null (the program reads nothing from us);
2. as root in bwrap mode: make the writable folders its own, drop to an unprivileged uid (RLIMIT_NPROC does
   not bind uid 0); as root in process mode: drop every capability, so no limit can be raised again;
3. set the rlimits (CPU, address space, processes, file size, open files, no core files);
4. run the program as `__main__`, then each test in the same namespace, each in its own try/except;
5. report on the results pipe, one line per event: `<nonce> <kind> <test index> <detail>`.

The results pipe and the nonce make forging harder, not impossible. The functions the harness calls after
the program (exec, compile, enumerate, os.write) are bound before it runs, so replacing builtins or
os.write changes nothing, and no json is involved in a report; a trace or profile hook the program set is
removed before each test. But the program shares this interpreter: one that walks its frames (or gc) can
find the nonce, and a value whose __eq__ always says True passes an `assert f(x) == y`. The sandbox bounds
what a program can do to the machine, not what it may claim about its own tests. The runner counts a test
as passed only on a `pass` line with the nonce, and a run whose `done` never came (os._exit, a signal) as
a crash.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import traceback
import types

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 1, 38, 24
DETAIL_CHARS = 300


def one_line(text, limit=DETAIL_CHARS):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(e, filename):
    """'ValueError: bad (line 3)': the exception and the last line of `filename` it went through."""
    line = next((f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if f.filename == filename),
                getattr(e, "lineno", None) if isinstance(e, SyntaxError) else None)
    message = str(e.msg if isinstance(e, SyntaxError) else e)
    text = f"{type(e).__name__}: {message}" if message else type(e).__name__
    return one_line(f"{text} (line {line})" if line else text)


def drop_user(uid, owned):
    """Become `uid` (and its own gid), with no supplementary groups and so no capabilities left."""
    for path in owned:
        os.chown(path, uid, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def drop_capabilities(libc):
    """Root without namespaces: keep uid 0 but give up every capability (rlimits then hold)."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)     # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()                    # effective, permitted, inheritable: all empty
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def set_limits(limits):
    """The run's rlimits, each at most what this process may already have (a lower hard limit stays)."""
    wanted = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, limits["cpu"]),
              (resource.RLIMIT_AS, limits["as"]), (resource.RLIMIT_FSIZE, limits["fsize"]),
              (resource.RLIMIT_NOFILE, limits["nofile"])]
    if limits["nproc"]:
        wanted.append((resource.RLIMIT_NPROC, limits["nproc"]))
    for which, value in wanted:
        hard = value + 1 if which == resource.RLIMIT_CPU else value   # soft: SIGXCPU; hard: SIGKILL
        ceiling = resource.getrlimit(which)[1]
        if ceiling != resource.RLIM_INFINITY:
            value, hard = min(value, ceiling), min(hard, ceiling)
        resource.setrlimit(which, (value, hard))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # a too-large write raises OSError, no silent death


def prepare(cfg):
    """Everything before the program: die with the runner, give up privileges, set the limits."""
    if cfg["parent_death"]:                           # process mode: die with the runner
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != cfg["parent"]:
            os._exit(1)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if os.geteuid() == 0:
            drop_capabilities(libc)
    if cfg["uid"] is not None:
        drop_user(cfg["uid"], cfg["owned"])
    set_limits(cfg["limits"])


def run_program(module, program, emit):
    """Run the program; True when it ended normally (sys.exit(0) counts as normal)."""
    try:
        exec(compile(program, "<program>", "exec"), module.__dict__)
    except MemoryError as e:
        emit("prog_memory", -1, describe(e, "<program>"))
        return False
    except SystemExit as e:
        if e.code in (None, 0):
            return True
        emit("prog_crash", -1, one_line(f"the program called sys.exit({e.code!r})"))
        return False
    except BaseException as e:                         # noqa: BLE001  (the program's exception, reported)
        emit("prog_crash", -1, describe(e, "<program>"))
        return False
    return True


def run_tests(module, tests, emit, number=enumerate, run=exec, build=compile,
              unhook=(sys.settrace, sys.setprofile)):
    """Each test in the program's namespace; the defaults are bound here, before the program can rebind
    the builtins."""
    for i, test in number(tests):
        name = f"<test {i}>"
        for remove in unhook:
            remove(None)
        try:
            run(build(test, name, "exec"), module.__dict__)
        except AssertionError as e:
            said = one_line(e, 120)
            emit("fail", i, one_line(f"test {i} failed: {test}" + (f" ({said})" if said else "")))
        except MemoryError as e:
            emit("memory", i, one_line(f"test {i}: {test}: {describe(e, name)}"))
        except BaseException as e:                     # noqa: BLE001  (a test that raised is a failed test)
            emit("fail", i, one_line(f"test {i} raised: {test}: {describe(e, name)}"))
        else:
            emit("pass", i, "")


def main(leave=os._exit):
    cfg = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    fd, prefix = cfg.pop("fd"), cfg.pop("nonce") + " "

    def emit(kind, index, detail, write=os.write):
        write(fd, f"{prefix}{kind} {index} {detail}\n".encode())

    prepare(cfg)
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module                   # the program is __main__, this file is not
    sys.argv = ["program"]
    emit("start", -1, "")
    if run_program(module, cfg["program"], emit):
        emit("prog_ok", -1, "")
        run_tests(module, cfg["tests"], emit)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:                              # noqa: BLE001  (the program may have closed it)
            pass
    emit("done", -1, "")
    leave(0)                                           # the program's threads and atexit hooks: not waited


if __name__ == "__main__":
    main()
