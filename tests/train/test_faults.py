"""Faults around a run as a user meets them (docs/reliability.md, "Faults"): replacing a run with
--overwrite, a second run into a live folder, SIGINT / SIGTERM (once, or twice), SIGKILL, the same under
torchrun (2 gloo ranks), in the iterative mode, and for `grpokit sft` / `grpokit rm train`.

Runs are real `grpokit train` processes forked from one helper (tests/live_runs.py). Each is compared
with one uninterrupted run of the same command: final weights bit-identical, every step logged once.
The reward sleeps $REWARD_SLEEP seconds per call, so a test can catch a run in the middle of a step
without changing what the run learns.
"""

import json
import os
import shlex
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from grpokit.cli import main as cli
from grpokit.config.schema import build_config
from grpokit.observe.metrics import read_metrics
from grpokit.train.guard import first_save_bytes
from grpokit.train.interrupt import REPEAT_S, Interrupts, RunInterrupted
from grpokit.train.loop import train_grpo
from grpokit.train.run_dir import OutputDirError, prepare_output_dir
from grpokit.train.run_lock import FolderLock, sibling_lock
from live_runs import ForkServer, logged, snapshot, tiny_train_argv, wait_for

STEPS, SAVE = 12, 3
REWARDS = Path(__file__).resolve().parents[1] / "easy_rewards.py"
PACED, BROKEN = f"{REWARDS}:paced_dense", f"{REWARDS}:broken"
TRACEBACK = "Traceback (most recent call last)"
GUESS_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "agents_guess_number.yaml"


@pytest.fixture(scope="module")
def server():
    s = ForkServer()
    yield s
    s.close()


def train(out: Path, *extra: str) -> list[str]:
    return tiny_train_argv(out, PACED, *extra, steps=STEPS, save=SAVE)


def start(server: ForkServer, out: Path, *extra: str, sleep: float = 0.0) -> int:
    """`grpokit train` into out (its output in out.log), each reward call sleeping `sleep` seconds."""
    return server.run(train(out, *extra), f"{out}.log", {"REWARD_SLEEP": str(sleep)})


def output(out: Path) -> str:
    return Path(f"{out}.log").read_text()


def stop_line(out: Path) -> str:
    """The one line an interrupted run printed, after checking it printed exactly one and no traceback."""
    text = output(out)
    assert TRACEBACK not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "stopped by" in line]
    assert len(lines) == 1, text[-3000:]
    return lines[0]


def run_printed_command(server: ForkServer, out: Path, line: str, verb: str, last: str) -> None:
    """Run the command a stopped run printed after '<verb> with: ' (checking that it ends in `last`)."""
    command = shlex.split(line.split(f"{verb} with: ")[1])
    assert command[:2] == ["grpokit", "train"] and command[-1] == last, command
    assert server.wait(server.run(command[1:], f"{out}.log")) == 0, output(out)[-3000:]


@pytest.fixture(scope="module")
def reference(server, tmp_path_factory) -> Path:
    """One uninterrupted run: what every interrupted, refused or restarted run must end equal to."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert server.wait(start(server, out)) == 0, output(out)[-3000:]
    return out


def assert_same_run(ref: Path, out: Path) -> None:
    a, b = load_file(ref / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows, ref_rows = read_metrics(out), read_metrics(ref)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [(r["reward_mean"], r["loss"]) for r in rows] == [(r["reward_mean"], r["loss"]) for r in ref_rows]
    assert not (out / ".grpokit.lock").exists()


def previous_run(reference: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    return run, snapshot(run)


# --- replacing a run: --overwrite is a transaction -------------------------------------------------------

def test_a_failed_overwrite_puts_the_previous_run_back_byte_identical(server, reference, tmp_path):
    run, before = previous_run(reference, tmp_path)
    pid = server.run(tiny_train_argv(run, BROKEN, "--overwrite", steps=STEPS, save=SAVE), f"{run}.log")
    assert server.wait(pid) == 2
    errors = [line for line in output(run).splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "broken" in errors[0] and TRACEBACK not in output(run)
    assert snapshot(run) == before     # every file of the old run, byte for byte; nothing of the new one


def test_an_overwrite_interrupted_before_its_first_checkpoint_puts_the_previous_run_back(server, reference,
                                                                                       tmp_path):
    run, before = previous_run(reference, tmp_path)
    pid = start(server, run, "--overwrite", sleep=0.5)
    wait_for(lambda: (run / ".previous-run").is_dir() and logged(run) >= 1, "the new run's first step")
    os.kill(pid, signal.SIGTERM)
    assert server.wait(pid, timeout=10) == 143
    line = stop_line(run)
    assert f"no checkpoint yet: the previous run is back in {run}; start over with: grpokit train" in line
    assert line.endswith(" --overwrite")
    assert snapshot(run) == before


def test_an_overwrite_killed_before_its_first_checkpoint_is_undone_by_the_next_start(server, reference,
                                                                                    tmp_path):
    run, before = previous_run(reference, tmp_path)
    pid = server.run(train(run, "--overwrite"), f"{run}.log", {"GRPOKIT_TEST_PAUSE_IN_SAVE": f"60@{SAVE}"})
    wait_for(lambda: (run / f".tmp-checkpoint-{SAVE}" / "manifest.json").exists(), "the first save")
    assert snapshot(run / ".previous-run") == before   # the old run waits aside, whole
    assert server.kill(pid) == -signal.SIGKILL
    # the next start into the folder (here the same command without --overwrite) first puts it back
    assert server.wait(server.run(train(run), f"{run}.log")) == 2
    assert "already holds a run" in output(run).splitlines()[-1]
    assert snapshot(run) == before


def test_an_overwrite_without_room_for_both_runs_is_refused_touching_nothing(reference, tmp_path, tiny_model):
    run, before = previous_run(reference, tmp_path)
    cfg = build_config({"run.output_dir": str(run), "run.overwrite": True})
    room = r"^--overwrite keeps the previous run .* needs about 4194304\.0 MiB, but only [\d.]+ MiB is free"
    with pytest.raises(OutputDirError, match=room):
        prepare_output_dir(cfg, need_bytes=2**42)
    assert snapshot(run) == before
    # what the new run needs: fp32 weights, plus AdamW's two moments when it writes a checkpoint
    n = sum(p.numel() for p in tiny_model.parameters())
    state = type("State", (), {"model": tiny_model, "ref_model": None})()
    state.cfg = build_config({"run.save_steps": 3, "run.max_steps": 12})
    assert first_save_bytes(state) == 4 * n * 3
    state.cfg = build_config({"run.save_steps": 0})
    assert first_save_bytes(state) == 4 * n


# --- one writer per folder ---------------------------------------------------------------------------------

def test_a_second_run_into_a_live_folder_is_refused_and_the_first_ends_unharmed(server, reference, tmp_path):
    out = tmp_path / "run"
    first = start(server, out, sleep=0.5)
    wait_for(lambda: logged(out) >= 2, "the first run's second step")
    began = time.monotonic()
    second = server.run(train(out, "run.resume=auto"), tmp_path / "second.log")
    assert server.wait(second, timeout=30) == 2 and time.monotonic() - began < 10
    text = (tmp_path / "second.log").read_text()
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and TRACEBACK not in text
    assert errors[0].startswith(f"error: run.output_dir '{out}' is in use by another run (pid {first} on ")
    # readers of the live run take no lock
    assert server.wait(first, timeout=0) is None     # still running
    readers = [server.run(argv, tmp_path / "readers.log") for argv in (
        ["plot", str(out), "--out", str(tmp_path / "plots")],
        ["report", str(out), "--out", str(tmp_path / "report.html")])]
    assert [server.wait(pid) for pid in readers] == [0, 0], (tmp_path / "readers.log").read_text()[-3000:]
    assert server.wait(first) == 0
    assert_same_run(reference, out)


def test_a_sigkilled_runs_lock_does_not_block_resume_auto(server, reference, tmp_path):
    out = tmp_path / "run"
    pid = start(server, out, sleep=0.3)
    wait_for(lambda: logged(out) >= SAVE + 1, f"step {SAVE + 1}")
    assert server.kill(pid) == -signal.SIGKILL
    assert json.loads((out / ".grpokit.lock").read_text())["pid"] == pid   # the file stays; its lock died
    assert server.wait(server.run(train(out, "run.resume=auto"), f"{out}.log")) == 0, output(out)[-3000:]
    assert f"resumed from {out}/checkpoint-" in output(out)
    assert_same_run(reference, out)


def guess_train(out: Path) -> list[str]:
    """`grpokit train` of the guess-the-number demo (builtin:guess-demo, the built-in GuessNumber environment,
    multi-turn), cut down to 6 steps of 2 episodes x 4 rollouts, a checkpoint every step; the paced reward
    beside the environment's makes every step move the weights."""
    return ["train", str(GUESS_CONFIG), "rollout.num_generations=4", "rollout.prompts_per_step=2",
            "rollout.max_tool_calling_iterations=3", "rollout.max_completion_length=240",
            f"reward.funcs={{{PACED}: 1.0}}", "run.max_steps=6", "run.save_steps=1", "run.eval_limit=0",
            "run.max_minutes=0", "run.progress=false", f"run.output_dir={out}"]


def test_a_sigkilled_run_with_an_environment_resumes_bit_identically(server, tmp_path):
    """SIGKILL in the middle of a multi-turn step, then run.resume=auto: the same weights and metrics as a
    run never stopped (the environments' state, the tool loop and the sampler's RNG all resume)."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert server.wait(server.run(guess_train(ref), f"{ref}.log")) == 0, output(ref)[-3000:]
    pid = server.run(guess_train(out), f"{out}.log", {"REWARD_SLEEP": "0.3"})
    wait_for(lambda: (out / "checkpoint-3").is_dir(), "the step-3 checkpoint")
    assert server.kill(pid) == -signal.SIGKILL
    assert logged(out) < 6
    resumed = server.run(guess_train(out) + ["run.resume=auto"], f"{out}.log")
    assert server.wait(resumed) == 0, output(out)[-3000:]
    assert f"resumed from {out}/checkpoint-" in output(out)
    a, b = load_file(ref / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    keys = ("step", "reward_mean", "loss", "grad_norm", "turns/mean", "tools/call_frequency")
    rows, ref_rows = read_metrics(out), read_metrics(ref)
    assert [[r[k] for k in keys] for r in rows] == [[r[k] for k in keys] for r in ref_rows]
    assert max(r["turns/mean"] for r in ref_rows) > 1 and ref_rows[0]["grad_norm"] > 0   # it did call tools


@pytest.mark.parametrize("argv", [["sft", "--steps", "1", "--eval-limit", "0"],
                                  ["rm", "train", "--data", "x.jsonl", "--init", "builtin:tiny-random"]],
                         ids=["sft", "rm-train"])
def test_sft_and_rm_train_refuse_a_second_writer_of_their_out_folder(argv, tmp_path, capsys):
    out = tmp_path / "out"
    lock = FolderLock(sibling_lock(out), "test")
    lock.acquire()
    try:
        before = snapshot(tmp_path)
        assert cli.main([*argv, "--out", str(out)]) == 2
        assert f"error: --out '{out}' is in use by another run (pid {os.getpid()} " in capsys.readouterr().err
        assert snapshot(tmp_path) == before
    finally:
        lock.release()


# --- SIGINT and SIGTERM ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sig, extra", [(signal.SIGINT, ()), (signal.SIGTERM, ()),
                                        (signal.SIGTERM, ("run.save_on_interrupt=true",))],
                         ids=["sigint", "sigterm", "sigterm-save_on_interrupt"])
def test_a_signal_ends_the_run_after_its_step_and_the_printed_command_resumes_it(server, reference, tmp_path,
                                                                                 sig, extra):
    out = tmp_path / "run"
    pid = start(server, out, *extra, sleep=0.3)
    wait_for(lambda: logged(out) >= SAVE + 1, f"step {SAVE + 1}")
    sent = time.monotonic()
    os.kill(pid, sig)
    assert server.wait(pid, timeout=10) == 128 + sig and time.monotonic() - sent < 10
    step = logged(out)                                   # the step in progress was finished and logged
    saved = step if extra else step // SAVE * SAVE       # run.save_on_interrupt: a checkpoint of that step
    line = stop_line(out)
    assert line.startswith(f"grpokit: stopped by {signal.Signals(sig).name} after step {step} of {STEPS}; "
                           f"last checkpoint: {out}/checkpoint-{saved}; resume with: grpokit train "), line
    run_printed_command(server, out, line, "resume", "--resume")
    assert_same_run(reference, out)


def test_a_second_signal_ends_the_step_in_progress_at_once(server, reference, tmp_path):
    out = tmp_path / "run"
    pid = start(server, out, sleep=2.5)                  # a step of about 2.5 s
    wait_for(lambda: logged(out) >= 1, "step 1")
    time.sleep(0.3)                                      # into step 2 (between steps a signal stops at once)
    os.kill(pid, signal.SIGINT)                          # step 2 will finish first ...
    time.sleep(REPEAT_S + 0.2)
    os.kill(pid, signal.SIGINT)                          # ... unless a second signal comes
    assert server.wait(pid, timeout=10) == 130
    assert logged(out) == 1                              # step 2 was cut short, never logged
    line = stop_line(out)
    assert line.startswith(f"grpokit: stopped by SIGINT during step 2 of {STEPS}; no checkpoint yet "
                           f"(run.save_steps={SAVE}); start over with: grpokit train "), line
    run_printed_command(server, out, line, "start over", "run.resume=auto")
    assert_same_run(reference, out)


def test_a_signal_in_the_iterative_mode_resumes_to_the_same_policy_and_reward_model(server, tmp_path):
    """Algorithm 1 (3 iterations x 4 steps): SIGINT inside an iteration with run.save_on_interrupt, so the
    checkpoint carries the iteration's samples and the reward model's optimizer mid-iteration."""
    from grpokit.rewards.rm_train import init_reward_model, save_reward_model

    rm_dir = tmp_path / "rm"
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    save_reward_model(model, tok, rm_dir, kind="outcome", step_separator="\n", init="builtin:tiny-random",
                      report={})
    extra = (f"reward.funcs={{rm:{rm_dir}: 1.0, {PACED}: 0.0}}", "run.iterations=3",
             "run.steps_per_iteration=4", "rm.learning_rate=1e-2", "rm.train_batch_size=4",
             "run.save_on_interrupt=true")
    ref, out = tmp_path / "reference", tmp_path / "run"
    assert server.wait(start(server, ref, *extra)) == 0, output(ref)[-3000:]
    pid = start(server, out, *extra, sleep=0.3)
    wait_for(lambda: logged(out) >= 5, "step 5")
    os.kill(pid, signal.SIGINT)
    assert server.wait(pid, timeout=10) == 130
    step = logged(out)
    assert f"after step {step} of {STEPS}; last checkpoint: {out}/checkpoint-{step}; resume" in stop_line(out)
    assert server.wait(server.run(train(out, *extra, "--resume"), f"{out}.log")) == 0, output(out)[-3000:]
    for name in ("final/model.safetensors", "checkpoint-12/reward_model.safetensors"):
        a, b = load_file(ref / name), load_file(out / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert (out / "iterations.jsonl").read_text() == (ref / "iterations.jsonl").read_text()


def test_sft_stopped_by_sigterm_says_so_in_one_line_and_leaves_out_as_it_was(server, tmp_path):
    out, log = tmp_path / "sft", tmp_path / "sft.log"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the previous warm-up")
    before = snapshot(out)
    pid = server.run(["sft", "--out", str(out), "--steps", "5000", "--stop-at", "5000", "--batch-size", "8",
                      "--eval-limit", "0", "--threads", "1"], log)
    wait_for(lambda: log.exists() and "sft: " in log.read_text(), "the warm-up to start")
    os.kill(pid, signal.SIGTERM)
    assert server.wait(pid, timeout=10) == 143
    text = log.read_text()
    assert TRACEBACK not in text and text.splitlines()[-1] == (
        f"grpokit: stopped by SIGTERM before --out was written; '{out}' is as it was; "
        "run the same command again to start over")
    assert snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["sft", "sft.log"]


def test_signal_handlers_are_installed_only_while_a_run_runs(tmp_path):
    signals = (signal.SIGINT, signal.SIGTERM)
    before, during = [signal.getsignal(s) for s in signals], []
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "task.num_train": 8, "task.num_eval": 2,
                        "rollout.prompts_per_step": 2, "rollout.num_generations": 2,
                        "rollout.max_completion_length": 4, "run.max_steps": 1, "run.progress": False,
                        "run.output_dir": str(tmp_path / "run")})
    train_grpo(cfg, hooks={"after_step": lambda state, row: during.extend(map(signal.getsignal, signals))})
    assert during and all(h not in before for h in during)
    assert [signal.getsignal(s) for s in signals] == before
    assert not (tmp_path / "run" / ".grpokit.lock").exists()


def test_a_repeat_within_a_second_is_the_same_interrupt_and_outside_a_step_a_signal_stops_at_once():
    with Interrupts() as signals:
        with signals.step():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)         # torchrun forwarding the Ctrl-C its workers also got
        assert signals.step_done() == signal.SIGTERM
        time.sleep(REPEAT_S)
        with pytest.raises(RunInterrupted) as caught, signals.step():
            os.kill(os.getpid(), signal.SIGINT)          # a second signal, later: at once
            time.sleep(5)
    assert caught.value.during_step and caught.value.exit_code == 143     # the first signal names the stop
    with pytest.raises(RunInterrupted) as caught, Interrupts():
        os.kill(os.getpid(), signal.SIGINT)              # no step in progress: at once
        time.sleep(5)
    assert not caught.value.during_step and caught.value.exit_code == 130


def test_a_signal_that_lands_in_a_finalizer_is_delivered_again_outside_it():
    class Finalized:
        def __del__(self):                                # Python drops an exception raised in here
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))

    with pytest.raises(RunInterrupted) as caught, Interrupts():
        Finalized()                                       # collected at once: the signal lands in __del__
        time.sleep(5)
    assert caught.value.exit_code == 143


# --- torchrun ----------------------------------------------------------------------------------------------

def _rank(rank: int, port: int, out: str, go: str) -> None:
    """One torchrun rank (WORLD_SIZE=2 in its environment): a first run while the test holds the folder's
    lock, then, once `go` exists, a long run that the test stops with SIGTERM to rank 0."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HF_HUB_OFFLINE="1", REWARD_SLEEP="0.3")
    torch.set_num_threads(1)
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "task.num_train": 64, "task.num_eval": 8,
                        "reward.funcs": {PACED: 1.0}, "rollout.prompts_per_step": 2,
                        "rollout.num_generations": 4, "rollout.max_completion_length": 8,
                        "run.max_steps": 200, "run.save_steps": 3, "run.progress": False,
                        "run.output_dir": out})
    results = []
    for attempt in ("busy folder", "stopped"):
        if attempt == "stopped":
            wait_for(lambda: Path(go).exists(), "the test's go")
        try:
            train_grpo(cfg)
            results.append({"kind": "finished"})
        except (OutputDirError, RunInterrupted) as e:
            results.append({"kind": type(e).__name__, "line": str(e), "quiet": getattr(e, "quiet", False),
                            "code": getattr(e, "exit_code", 2)})
        Path(f"{out}.{rank}.json").write_text(json.dumps(results))
    torch.distributed.barrier()  # no rank tears gloo down while its peer still uses it (exit SIGABRT)
    torch.distributed.destroy_process_group()


def test_under_torchrun_rank0_holds_the_one_lock_and_a_signal_to_it_stops_every_rank(tmp_path):
    out, go = tmp_path / "run", tmp_path / "go"
    lock = FolderLock(out / ".grpokit.lock", "the test")   # the folder is busy: both ranks must refuse it
    lock.acquire()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(_rank, (port, str(out), str(go)), nprocs=2, join=False, start_method="spawn")
    results = [Path(f"{out}.{r}.json") for r in range(2)]
    wait_for(lambda: all(p.exists() for p in results), "both ranks to refuse the busy folder")
    lock.release()
    go.touch()
    wait_for(lambda: logged(out) >= 2, "step 2 of the two-rank run")
    assert json.loads((out / ".grpokit.lock").read_text())["pid"] == ctx.processes[0].pid   # rank 0's lock
    sent = time.monotonic()
    os.kill(ctx.processes[0].pid, signal.SIGTERM)        # rank 0 alone: rank 1 must stop as well
    while not ctx.join(timeout=30):
        pass
    assert time.monotonic() - sent < 10
    (busy0, stop0), (busy1, stop1) = [json.loads(p.read_text()) for p in results]
    assert (busy0["kind"], busy1["kind"]) == ("RunInUseError", "OutputDirError")   # rank 1: rank 0's message
    assert "is in use by another run" in busy0["line"] and (busy0["quiet"], busy1["quiet"]) == (False, True)
    step = logged(out)
    assert stop0["kind"] == stop1["kind"] == "RunInterrupted"
    assert (stop0["quiet"], stop1["quiet"]) == (False, True)
    assert stop0["code"] == 143 and stop0["line"].startswith(f"stopped by SIGTERM after step {step} of 200; ")
    assert f"after step {step} of 200" in stop1["line"]    # the same step on both ranks
    assert not (out / ".grpokit.lock").exists()
