"""Crash and resume: `grpokit train` runs in child processes that are SIGKILLed at three different
moments (mid-training, inside a checkpoint write, during start-up / resume), restarted with
run.resume=auto each time, and must end with weights bit-identical to an uninterrupted run and
metrics.jsonl holding every step exactly once.

The children are forked from one helper process that imported torch / transformers / grpokit once
(tests/live_runs.py), so each run starts in well under a second instead of paying the import time
again; a SIGKILL to a child is a real kill of a real process.
"""

import random
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpokit.observe.metrics import read_metrics
from grpokit.train.checkpoint import list_checkpoints
from grpokit.train.resume import verify_checkpoint
from live_runs import ForkServer, logged, tiny_train_argv, wait_for  # tests/live_runs.py

STEPS, SAVE = 12, 3
DENSE = str(Path(__file__).with_name("test_guards.py").resolve()) + ":dense_reward"


class TrainServer(ForkServer):
    def start(self, out: Path, env: dict | None = None, extra: tuple[str, ...] = ()) -> int:
        argv = tiny_train_argv(out, DENSE, "run.save_total_limit=2", "run.resume=auto", *extra, steps=STEPS,
                               save=SAVE)
        out.parent.mkdir(parents=True, exist_ok=True)
        return self.run(argv, str(out) + ".log", env)


@pytest.fixture(scope="module")
def server():
    s = TrainServer()
    yield s
    s.close()


def assert_checkpoints_whole(out: Path) -> None:
    for ckpt in list_checkpoints(out):
        assert verify_checkpoint(ckpt) is None, ckpt


def test_sigkill_at_three_moments_then_resume_is_bit_identical(server, tmp_path):
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    ref_out, out = tmp_path / "reference", tmp_path / "crashed"
    ref = server.start(ref_out)  # the uninterrupted run, side by side

    # 1. mid-training, at a random step and a random point inside it
    pid = server.start(out)
    target = rng.randint(SAVE + 1, 5)  # step SAVE + 1 logged: checkpoint-3 is whole, so the last run resumes
    wait_for(lambda: logged(out) >= target, f"step {target}")
    time.sleep(rng.uniform(0.0, 0.1))
    assert server.kill(pid) == -signal.SIGKILL
    assert_checkpoints_whole(out)

    # 2. inside a checkpoint write: the test hook pauses the next save after its files are written (the
    #    save of step 9 unless the first kill came after it: at ~0.02 s a step, the random delay spans steps)
    done = max((int(c.name.split("-")[1]) for c in list_checkpoints(out)), default=0)
    at = done + SAVE
    pid = server.start(out, env={"GRPOKIT_TEST_PAUSE_IN_SAVE": f"60@{at}"})
    wait_for(lambda: (out / f".tmp-checkpoint-{at}" / "manifest.json").exists(), f"the save of step {at}")
    assert server.kill(pid) == -signal.SIGKILL
    assert not (out / f"checkpoint-{at}").exists()
    assert (out / "latest").read_text() == f"checkpoint-{done}" if done else not (out / "latest").exists()
    assert_checkpoints_whole(out)

    # 3. during start-up and resume, at a random moment
    pid = server.start(out)
    time.sleep(rng.uniform(0.0, 0.4))
    assert server.kill(pid) == -signal.SIGKILL
    assert_checkpoints_whole(out)

    # the last restart finishes the run, resuming the checkpoint of step 3 or later
    assert server.wait(server.start(out)) == 0, (out.parent / "crashed.log").read_text()[-3000:]
    assert server.wait(ref) == 0, (ref_out.parent / "reference.log").read_text()[-3000:]

    a, b = load_file(ref_out / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs (kill seed {seed})"
    rows, ref_rows = read_metrics(out), read_metrics(ref_out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), f"kill seed {seed}"
    assert [(r["reward_mean"], r["loss"]) for r in rows] == [(r["reward_mean"], r["loss"]) for r in ref_rows]
    assert sum(r["grad_norm"] > 0 for r in rows) == STEPS  # every step moved the weights
    assert "resumed from" in (out.parent / "crashed.log").read_text()


def test_sigkill_inside_iterative_mode_then_resume_is_bit_identical(server, tmp_path):
    """Algorithm 1 (3 iterations x 4 steps, checkpoints every 3 steps, so inside iterations): SIGKILL at a
    random step, then inside the next checkpoint write (step 3, 6 or 9: never an iteration's end); the
    restarted run ends with the policy, the reward model and iterations.jsonl of an uninterrupted run."""
    from grpokit.rewards.rm_train import init_reward_model, save_reward_model

    rm_dir = tmp_path / "rm"
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    save_reward_model(model, tok, rm_dir, kind="outcome", step_separator="\n",
                      init="builtin:tiny-random", report={})
    extra = (f"reward.funcs={{rm:{rm_dir}: 1.0}}", "run.iterations=3", "run.steps_per_iteration=4",
             "rm.learning_rate=1e-2", "rm.train_batch_size=4")
    seed = random.randrange(10**6)
    ref_out, out = tmp_path / "reference", tmp_path / "crashed"
    ref = server.start(ref_out, extra=extra)
    pid = server.start(out, extra=extra)
    target = random.Random(seed).randint(2, 5)
    wait_for(lambda: logged(out) >= target, f"step {target}")
    assert server.kill(pid) == -signal.SIGKILL
    # inside an iteration
    at = max((int(c.name.split("-")[1]) for c in list_checkpoints(out)), default=0) + SAVE
    pid = server.start(out, env={"GRPOKIT_TEST_PAUSE_IN_SAVE": f"60@{at}"}, extra=extra)
    wait_for(lambda: (out / f".tmp-checkpoint-{at}" / "manifest.json").exists(), f"the save of step {at}")
    assert server.kill(pid) == -signal.SIGKILL
    assert_checkpoints_whole(out)
    assert server.wait(server.start(out, extra=extra)) == 0, (out.parent / "crashed.log").read_text()[-3000:]
    assert server.wait(ref) == 0, (ref_out.parent / "reference.log").read_text()[-3000:]
    for name in ("final/model.safetensors", "checkpoint-12/reward_model.safetensors"):
        a, b = load_file(ref_out / name), load_file(out / name)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}: {k} differs (kill seed {seed})"
    assert (out / "iterations.jsonl").read_text() == (ref_out / "iterations.jsonl").read_text()
    assert len((out / "iterations.jsonl").read_text().splitlines()) == 3
    assert not torch.equal(load_file(rm_dir / "model.safetensors")["score.weight"],
                           load_file(out / "checkpoint-12" / "reward_model.safetensors")["score.weight"])
