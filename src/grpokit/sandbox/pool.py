"""SandboxPool: many programs through the sandbox at once, at most `workers` at a time, results in order.

    with SandboxPool(workers=4) as pool:
        results = pool.map([(program, tests), ...])      # list[Result], in the jobs' order
        future = pool.submit(program, tests)             # concurrent.futures.Future[Result]

Each job is one `grpokit.sandbox.run` on one of `workers` threads (a run waits on its sandbox, so threads
suffice: the work is in the sandboxes' processes). Leaving the `with` block on an exception (Ctrl-C
included) cancels the queued jobs and stops the running sandboxes; `close()` waits for them instead.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from grpokit.errors import ConfigError
from grpokit.sandbox.check import check_sandbox
from grpokit.sandbox.limits import Limits, Result, check_mode
from grpokit.sandbox.runner import run
from grpokit.sandbox.workdir import clean_stale


class SandboxPool:
    """Runs (program, tests) jobs in sandboxes, at most `workers` at once.

    Args:
        workers: sandboxes running at the same time (each one process tree; about one CPU core each).
        limits: the Limits of every run.
        mode: 'bwrap' or 'process' (grpokit.sandbox.run). Checked here: SandboxUnavailable before any job.
    """

    def __init__(self, workers: int = 2, limits: Limits = Limits(), mode: str = "bwrap") -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"SandboxPool workers={workers!r}: give a whole number of at least 1")
        self.workers, self.limits, self.mode = workers, limits, check_mode(mode)
        check_sandbox(mode)
        if mode == "process":
            clean_stale()                  # folders and processes of callers killed before they cleaned up
        self._cancel = threading.Event()
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpokit-sandbox")

    def submit(self, program: str, tests: list[str]) -> Future[Result]:
        """Queue one job; its Future gives the Result (or raises what run raised)."""
        if self._closed:
            raise RuntimeError("this SandboxPool is closed: make a new one")
        return self._executor.submit(run, program, list(tests), self.limits, self.mode, cancel=self._cancel)

    def map(self, jobs: list[tuple[str, list[str]]]) -> list[Result]:
        """Run every (program, tests) job; the Results in the jobs' order. An exception (a Ctrl-C) cancels
        the jobs of this call that have not started, then propagates."""
        futures = [self.submit(program, tests) for program, tests in jobs]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def close(self, cancel: bool = False) -> None:
        """No more jobs; wait for the running ones (cancel=True: drop the queued ones, stop the running)."""
        self._closed = True
        if cancel:
            self._cancel.set()
        self._executor.shutdown(wait=True, cancel_futures=cancel)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close(cancel=exc_type is not None)
