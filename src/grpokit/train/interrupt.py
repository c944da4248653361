"""SIGINT and SIGTERM during a run: finish the step in progress, or stop at once on a second signal.

    with Interrupts() as signals:          # handlers installed here, the previous ones restored on exit
        with signals.step():               # a first signal in here is only recorded ...
            train_step(...)
        if signals.signum is not None:     # ... and acted on once the step is done
            raise RunInterrupted(signals.signum, during_step=False)

Outside `step()` (loading, evaluation, the final save) a signal raises `RunInterrupted` at once: there
is no step to finish. Inside, the first signal is recorded and the run stops after the step; a second
one raises at once. A repeat within REPEAT_S of the first counts as the same interrupt: a terminal's
Ctrl-C reaches torchrun and its workers, and torchrun then forwards it to them again.

`RunInterrupted` subclasses KeyboardInterrupt, so no `except Exception` on its way swallows it; the
command boundary (`grpokit.errors.run_command`) prints its one line and exits 128 + the signal number
(130 for SIGINT, 143 for SIGTERM), the shell's convention for a process ended by a signal.

Handlers are installed only from the main thread (Python allows no other); elsewhere the run keeps
the process's handlers.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
REPEAT_S = 1.0


class RunInterrupted(KeyboardInterrupt):
    """A command stopped by SIGINT or SIGTERM; str() is the one line the user sees.

    Attributes:
        signum: the (first) signal; exit_code: 128 + signum.
        during_step: True when it stopped inside a step (a second signal), False when between steps.
        where, note, restart: parts of the line, filled in by whoever knows them ('after step 7 of 100',
            'last checkpoint: runs/x/checkpoint-6', 'resume with: grpokit train ... --resume').
        verb, restart_flag: 'resume' or 'start over', and with what: (command-line flag, config setting).
        quiet: True on torchrun ranks other than 0 (rank 0 alone speaks).
    """

    def __init__(self, signum: int, during_step: bool = True) -> None:
        super().__init__()
        self.signum, self.during_step = int(signum), during_step
        self.exit_code = 128 + self.signum
        self.where = self.note = self.restart = self.verb = ""
        self.restart_flag: tuple[str, str] = ("", "")
        self.quiet = False

    def __str__(self) -> str:
        head = f"stopped by {signal.Signals(self.signum).name} {self.where}".strip()
        return "; ".join(part for part in (head, self.note, self.restart) if part)


class Interrupts:
    """SIGINT / SIGTERM handlers for the length of a `with` block (see the module docstring)."""

    def __init__(self) -> None:
        self.signum: int | None = None   # the first signal received, if any
        self.holding = False             # True: record signals, never raise (while cleaning up)
        self._at = 0.0
        self._in_step = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():   # None: set outside Python; the default is closest
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """A first signal inside is recorded, not raised: the step in progress finishes."""
        self._in_step = True
        try:
            yield
        finally:
            self._in_step = False

    def _handle(self, signum: int, frame: object) -> None:
        now = time.monotonic()
        if self.signum is not None and now - self._at < REPEAT_S:
            return                               # the same interrupt, delivered twice
        first = self.signum is None
        if first:
            self.signum, self._at = signum, now
        if self.holding or (first and self._in_step):
            return
        raise RunInterrupted(self.signum, during_step=self._in_step)
