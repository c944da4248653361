"""What a run holds while it writes: its folder's lock, an --overwrite in progress, SIGINT / SIGTERM.

    with RunGuard(cfg, dist) as guard:        # rank 0 locks run.output_dir, then checks it
        state = build_state(...)
        guard.prepare_output_dir(state)       # --overwrite: the old run moved aside (run_dir)
        while ...:
            with guard.step():                # a signal now ends the run after this step
                ...
            guard.after_step(state)           # commit the replacement / stop on a signal

Leaving the block: a replacement is committed once the new run has a checkpoint or its final model, and
put back otherwise (the run failed or was interrupted before); a `RunInterrupted` gets its one line
(where it stopped, the last checkpoint, what to run next); the lock is released and the signal handlers
restored. Under torchrun rank 0 takes the lock and every decision that can stop the run (the folder is
in use, the folder is refused, a signal reached any rank) is shared, so every rank stops together.

`owned_folder` is the same for commands that replace one output folder whole (`grpokit sft`,
`grpokit rm train`): a lock beside the folder and the signals as one line.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

from grpokit.train import run_dir
from grpokit.train.interrupt import Interrupts, RunInterrupted
from grpokit.train.run_dir import LOCK_FILE, OutputDirError
from grpokit.train.run_lock import FolderLock, sibling_lock

log = logging.getLogger("grpokit")

RESUME = ("--resume", "run.resume=true")
START_OVER = ("run.resume=auto", "run.resume=auto")
REPLACE_AGAIN = ("--overwrite", "run.overwrite=true")


class RunGuard:
    """The lock, the --overwrite transaction and the signal handlers of one `train_grpo` call."""

    def __init__(self, cfg, dist) -> None:
        self.cfg, self.dist, self.out = cfg, dist, Path(cfg.run.output_dir)
        self.lock = FolderLock(self.out / LOCK_FILE, f"run.output_dir '{self.out}'")
        self.signals = Interrupts()
        self.signals.coordinated = dist.world_size > 1   # a signal to one rank: every rank stops together
        self.state = None            # set by prepare_output_dir: the step count for the message
        self.replacing = False       # a previous run waits in .previous-run for this one's first save
        self.restored = False        # ... and was put back
        self.prepared = False        # the folder may hold this run's files (prepare_output_dir ran)
        self._current = 0            # the step in progress (inside `step()`)

    def __enter__(self) -> "RunGuard":
        self.signals.__enter__()
        try:
            self._on_rank0(self._claim)
        except BaseException as e:
            self.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    def _claim(self) -> None:
        run_dir.check_output_path(self.out)      # first: no lock file in an unusable place
        self.lock.acquire()
        run_dir.finish_replacement(self.out)     # an --overwrite a killed run left half done: completed
        run_dir.check_output_dir(self.cfg)       # under the lock: the folder as no other run will change it

    def prepare_output_dir(self, state) -> None:
        """Everything loaded: create the folder, or move the previous run aside under --overwrite."""
        self.state = state

        def prepare() -> None:
            self.replacing = run_dir.prepare_output_dir(self.cfg, need_bytes=first_save_bytes(state))
        with self.signals.step():                # a signal while the old run moves aside waits for the move
            self._on_rank0(prepare)
        self.prepared = True
        if self.signals.step_done() is not None:
            raise RunInterrupted(self.signals.signum, during_step=False)

    def step(self) -> contextlib.AbstractContextManager:
        """The step in progress: a first SIGINT / SIGTERM from here on is acted on in `after_step`."""
        self._current = (self.state.step if self.state is not None else 0) + 1
        return self.signals.step()

    def after_step(self, state) -> None:
        """Commit a replacement once a checkpoint exists; on a signal at any rank, every rank stops here
        (with a checkpoint first when run.save_on_interrupt), raising RunInterrupted."""
        self._commit_if_saved()
        if self.dist.all_true(self.signals.step_done() is None):
            return
        run = self.cfg.run
        saved = run.save_steps and state.step % run.save_steps == 0   # the step's periodic checkpoint
        if run.save_on_interrupt and not saved and state.bad_steps < run.max_bad_steps:
            state.dist.save_checkpoint(state, self.out)
            self._commit_if_saved()
        stop = RunInterrupted(self.signals.signum or signal.SIGTERM, during_step=False)
        stop.ranks_agree = True                      # all_true above: every rank is here, after this step
        raise stop

    def __exit__(self, exc_type, exc, tb) -> None:
        self.signals.holding = True              # a signal during the clean-up is only recorded
        try:
            if self.dist.is_main and self.replacing:
                if run_dir.replacement_done(self.out):
                    run_dir.commit_replacement(self.out)
                else:
                    self.restored = run_dir.roll_back_replacement(self.out)
                    if not isinstance(exc, RunInterrupted):   # an interrupt's one line says it
                        log.warning("the new run stopped before its first checkpoint: the previous run is "
                                    "back in %s", self.out)
            if isinstance(exc, RunInterrupted):
                self._describe(exc)
        finally:
            self.lock.release()
            self.signals.__exit__()

    def _commit_if_saved(self) -> None:
        if self.replacing and self.dist.is_main and run_dir.replacement_done(self.out):
            run_dir.commit_replacement(self.out)
            self.replacing = False

    def _on_rank0(self, fn: Callable[[], None]) -> None:
        """Run fn on rank 0; when it fails (the folder refused, in use, unwritable), every rank raises: rank 0
        its error, the others an OutputDirError with its message that prints nothing (`quiet`)."""
        problem = None
        if self.dist.is_main:
            try:
                fn()
            except Exception as e:
                problem = e
        if self.dist.enabled:
            first = self.dist.gather_object(None if problem is None else str(problem))[0]
            if first is not None and problem is None:
                problem = OutputDirError(first)
                problem.quiet = True
        if problem is not None:
            raise problem

    def _describe(self, e: RunInterrupted) -> None:
        """Where it stopped, the last checkpoint, and what continues the run (rank 0 speaks)."""
        state, run = self.state, self.cfg.run
        e.quiet, e.state = not self.dist.is_main, state
        if e.during_step and self._current:
            e.where = f"during step {self._current} of {run.max_steps}"
        elif state is not None and state.step:
            e.where = f"after step {state.step} of {run.max_steps}"
        else:
            e.where = "before the first step"
        latest = self.out / "latest"
        if not self.prepared:
            e.note = f"nothing in {self.out} was changed"
            e.restart = "run the same command again"
            return
        if self.restored:
            e.note = f"the new run had no checkpoint yet: the previous run is back in {self.out}"
            e.restart_flag = REPLACE_AGAIN
        elif self.cfg.loss.algorithm == "ppo":   # its value model is not checkpointed: no resume
            e.note = "loss.algorithm=ppo runs cannot resume"
            e.restart_flag = REPLACE_AGAIN
        elif latest.is_file():
            e.note = f"last checkpoint: {self.out / latest.read_text().strip()}"
            e.restart_flag = RESUME
        else:
            e.note = f"no checkpoint yet (run.save_steps={run.save_steps})"
            e.restart_flag = START_OVER
        e.verb = "resume" if e.restart_flag is RESUME else "start over"
        e.restart = f"{e.verb} with {e.restart_flag[1]}"


def first_save_bytes(state) -> int:
    """About what the new run writes before an --overwrite may delete the old one: its first checkpoint
    (weights, reference, AdamW's two moments), or its final weights when it saves no checkpoint."""
    run, policy = state.cfg.run, list(state.model.parameters())
    if not (run.save_steps and run.save_steps <= run.max_steps):
        return sum(p.numel() * p.element_size() for p in policy)
    # the reference may share tensors with the policy (LoRA: the base with adapters off): count them once
    params = {id(p): p for m in (state.model, state.ref_model) if m is not None for p in m.parameters()}
    moments = 2 * sum(p.numel() * p.element_size() for p in policy if p.requires_grad)
    return sum(p.numel() * p.element_size() for p in params.values()) + moments


@contextlib.contextmanager
def owned_folder(out: Path, flag: str) -> Iterator[None]:
    """For a command that writes `out` aside and swaps it in at the end (`grpokit sft`, `grpokit rm
    train`): one writer at a time (a lock file beside `out`), SIGINT / SIGTERM as one line."""
    lock = FolderLock(sibling_lock(out), f"{flag} '{out}'")
    lock.acquire()
    try:
        with Interrupts():
            yield
    except RunInterrupted as e:
        e.where = f"before {flag} was written"
        e.note = f"'{out}' is as it was"
        e.restart = "run the same command again to start over"
        raise
    finally:
        lock.release()
