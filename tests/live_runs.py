"""Helpers for tests that run real `grpokit` processes (tests/train/test_resume_crash.py, test_faults.py).

`ForkServer`: a helper process imports torch / transformers / grpokit once (one CPU thread, nothing
computed before the fork) and forks one child per command, so each starts in well under a second. A
child runs `grpokit.cli.main.main(argv)` with its stdout and stderr in a log file; signals sent to it
(SIGKILL, SIGINT, SIGTERM) reach a real process with grpokit's own handlers, and its exit status is the
command's (a Python exception that escapes prints its traceback to the log and exits 1).
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from grpokit.observe.metrics import read_metrics

SERVER = r"""
import json, os, sys, time
import torch, transformers, safetensors.torch, tqdm
import grpokit.cli.main, grpokit.train.loop, grpokit.train.checkpoint, grpokit.tasks, grpokit.rewards.scoring
from transformers import Qwen2ForCausalLM, PreTrainedTokenizerFast
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "wait":
        end = time.monotonic() + (float("inf") if req["timeout"] is None else req["timeout"])
        while True:
            pid, status = os.waitpid(req["pid"], os.WNOHANG)
            if pid or time.monotonic() > end:
                break
            time.sleep(0.01)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status) if pid else None}), flush=True)
        continue
    pid = os.fork()
    if pid == 0:
        os.environ.update(req["env"])
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            rc = grpokit.cli.main.main(req["argv"])
        except BaseException:
            import traceback
            traceback.print_exc()
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    print(json.dumps({"pid": pid}), flush=True)
"""


class ForkServer:
    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout.readline().strip() == "ready"

    def _ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def run(self, argv: list[str], log: str, env: dict | None = None) -> int:
        """Start `grpokit argv` (output appended to log); returns its pid."""
        return self._ask({"op": "run", "argv": argv, "env": env or {}, "log": str(log)})["pid"]

    def wait(self, pid: int, timeout: float | None = None) -> int | None:
        """The child's exit code (-N: killed by signal N), or None if it still runs after timeout seconds."""
        return self._ask({"op": "wait", "pid": pid, "timeout": timeout})["rc"]

    def kill(self, pid: int) -> int:
        os.kill(pid, signal.SIGKILL)
        return self.wait(pid)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def logged(out: Path) -> int:
    """Steps in a run folder's metrics.jsonl (0 before it exists)."""
    return len(read_metrics(out)) if (Path(out) / "metrics.jsonl").exists() else 0


def wait_for(cond, what: str, timeout: float = 120.0) -> None:
    end = time.time() + timeout
    while not cond():
        assert time.time() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def tiny_train_argv(out: Path, reward: str, *extra: str, steps: int = 12, save: int = 3) -> list[str]:
    """`grpokit train` on the tiny random model: 2 prompts x 4 completions of 8 tokens a step."""
    return ["train", "model.name_or_path=builtin:tiny-random", "task.num_train=64", "task.num_eval=8",
            f"reward.funcs={{{reward}: 1.0}}", "rollout.prompts_per_step=2", "rollout.num_generations=4",
            "rollout.max_completion_length=8", "optim.learning_rate=3e-3", "run.eval_limit=0",
            "run.progress=false", f"run.max_steps={steps}", f"run.save_steps={save}", f"run.output_dir={out}",
            *extra]


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root: a file's sha256, or '<dir>'."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "<dir>"
            for p in sorted(Path(root).rglob("*"))}


def final_weights(out: Path) -> dict:
    """A finished run's final model weights (out/final/model.safetensors)."""
    return load_file(out / "final" / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    """Two state dicts hold the same tensors, bit for bit."""
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
