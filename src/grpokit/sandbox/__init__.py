"""A sandbox for untrusted, model-written Python programs: the rewards of code tasks.

    from grpokit.sandbox import Limits, SandboxPool, run

    result = run("def f(x):\n    return x + 1", ["assert f(3) == 4", "assert f(0) == 1"])
    result.outcome, result.fraction                   # 'passed', 1.0
    with SandboxPool(workers=4, limits=Limits(wall_seconds=10)) as pool:
        results = pool.map([(program, tests) for program, tests in jobs])   # in the jobs' order

Each run is a fresh interpreter (the caller's sys.executable) in a bubblewrap sandbox (mode='bwrap', the
default): no network, no view of the machine's files beyond the system and Python's (read-only), its own
tmpfs as the only writable place, a cleared environment, and rlimits on CPU time, memory, processes, file
size and open files, plus a wall-clock limit and capped output. The program runs first, then each test in
its namespace; each test counts once (Result.passed out of Result.total).

mode='process' keeps the limits but not the isolation (it warns once): for machines without bubblewrap,
and programs you would run yourself anyway. What each module holds:

    limits.py    Limits, Result, OUTCOMES, SandboxUnavailable: the contract
    command.py   bwrap's command line: what the sandbox sees
    harness.py   what runs inside: settings from stdin, limits, program, tests, the results pipe
    runner.py    run(): start, read, stop, clean up
    outcome.py   the harness's report and the sandbox's end -> Result
    workdir.py   process mode's folders and leftover processes
    pool.py      SandboxPool: bounded concurrency, order kept
    check.py     check_sandbox(mode): is this mode available here
    remote.py    `grpokit sandbox-serve` and its client RemoteSandbox (the same interface over HTTP)
"""

from grpokit.sandbox.check import SandboxWarning, check_sandbox
from grpokit.sandbox.limits import MODES, OUTCOMES, Limits, Result, SandboxUnavailable
from grpokit.sandbox.pool import SandboxPool
from grpokit.sandbox.runner import run

__all__ = ["MODES", "OUTCOMES", "Limits", "Result", "SandboxPool", "SandboxUnavailable", "SandboxWarning",
           "check_sandbox", "run"]
