"""SIGINT and SIGTERM during a run: finish the step in progress, or stop at once on a second signal.

    with Interrupts() as signals:          # handlers installed here, the previous ones restored on exit
        with signals.step():               # from here a first signal is only recorded ...
            train_step(...)
        if signals.step_done() is not None:   # ... and acted on once the step is done
            raise RunInterrupted(signals.signum, during_step=False)

Outside a step (loading, evaluation, the final save) a signal raises `RunInterrupted` at once: there
is no step to finish. From `step()` to `step_done()` the first signal is recorded and the run stops
after the step; a second one raises at once. A repeat within REPEAT_S of the first counts as the same
interrupt: a terminal's Ctrl-C reaches torchrun and its workers, and torchrun then forwards it to them
again.

`RunInterrupted` subclasses KeyboardInterrupt, so no `except Exception` on its way swallows it; the
command boundary (`grpokit.errors.run_command`) prints its one line and exits 128 + the signal number
(130 for SIGINT, 143 for SIGTERM), the shell's convention for a process ended by a signal.

Handlers are installed only from the main thread (Python allows no other); elsewhere the run keeps
the process's handlers. A signal that lands inside a `__del__` (run by the garbage collector at any
moment) is not raised there, where Python would print and drop the exception: it is sent again 50 ms
later, to land outside.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

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
        ranks_agree: every rank raised it after the same step (a stop agreed at a step's end);
            state: the run's TrainState, when it had one (for the command's clean-up).
    """

    def __init__(self, signum: int, during_step: bool = True) -> None:
        super().__init__()
        self.signum, self.during_step = int(signum), during_step
        self.exit_code = 128 + self.signum
        self.where = self.note = self.restart = self.verb = ""
        self.restart_flag: tuple[str, str] = ("", "")
        self.quiet = self.ranks_agree = False
        self.state = None

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
        self._again = False              # the next signal is one this object re-sent (`_deliver_again`)
        self._previous: dict[int, object] = {}
        # several ranks: a first signal outside a step is recorded too and acted on at the next step's end,
        # where every rank agrees (raised at once on one rank, the others would wait in a collective)
        self.coordinated = False

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
        """From here until `step_done()`, a first signal is recorded, not raised: the step in progress
        finishes (an exception out of the block ends the step there)."""
        self._in_step = True
        try:
            yield
        except BaseException:
            self._in_step = False
            raise

    def step_done(self) -> int | None:
        """The step is over: the signal recorded so far (None: none); from now on signals raise at once."""
        self._in_step = False
        return self.signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        again, self._again = self._again, False
        if self.signum is not None and now - self._at < REPEAT_S and not again:
            return                               # the same interrupt, delivered twice
        first = self.signum is None
        if first:
            self.signum, self._at = signum, now
        if self.holding or (first and (self._in_step or self.coordinated)):
            return
        if _in_finalizer(frame):                 # Python prints and drops an exception raised in __del__
            threading.Timer(0.05, self._deliver_again).start()
            return
        raise RunInterrupted(self.signum, during_step=self._in_step)

    def _deliver_again(self) -> None:
        if self._previous:                       # the handlers are still this block's
            self._again = True
            os.kill(os.getpid(), self.signum)


def _in_finalizer(frame: FrameType | None) -> bool:
    """True when the signal interrupted a `__del__` (the garbage collector can run one anywhere)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False
