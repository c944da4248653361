"""`grpokit train` under a real `torchrun --nproc_per_node 2` (gloo on CPU): the command ends its own
process group on every rank, all ranks together, before it returns, instead of leaving it to
interpreter exit (where gloo may abort a rank after its work is done: exit SIGABRT)."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

from test_cli import TINY

# Each rank runs the grpokit command's own entry point, then records what it left behind.
RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as tdist
    from grpokit.cli.main import main
    with open(f"{sys.argv[1]}.{os.environ['RANK']}.pid", "w") as f:
        f.write(str(os.getpid()))
    rc = main(sys.argv[2:])
    with open(f"{sys.argv[1]}.{os.environ['RANK']}.json", "w") as f:
        json.dump({"rc": rc, "group_left_open": tdist.is_initialized()}, f)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path, *args: str) -> list[str]:
    """The torchrun command that runs `grpokit <args>` on 2 ranks through RANK_SCRIPT."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(_free_port())]
    return [*launcher, str(script), str(tmp_path / "rank"), *args]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
STEPS = [a for a in TINY if not a.startswith("run.max_steps")]


def test_grpokit_train_under_torchrun_closes_its_process_group_on_every_rank(tmp_path):
    out = tmp_path / "run"
    cmd = _torchrun(tmp_path, "train", *STEPS, "run.max_steps=2", f"run.output_dir={out}")
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank.{r}.json").read_text()) for r in range(2)]
    assert ranks == [{"rc": 0, "group_left_open": False}] * 2
    assert "distributed: rank 1 of 2" in proc.stderr or "distributed: rank 0 of 2" in proc.stderr
    assert "grpokit: distributed: process group closed" in proc.stderr     # rank 0's log line
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert (out / "final" / "config.json").is_file()


def test_a_signal_to_rank_0_under_torchrun_stops_both_ranks_with_their_group_closed(tmp_path):
    out = tmp_path / "run"
    cmd = _torchrun(tmp_path, "train", *STEPS, "run.max_steps=500", "run.save_steps=2",
                    f"run.output_dir={out}")
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        rows = out / "metrics.jsonl"
        while not rows.is_file() or rows.read_text().count("\n") < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "no step 2 from the two ranks"
            time.sleep(0.2)
        os.kill(int((tmp_path / "rank.0.pid").read_text()), signal.SIGTERM)   # rank 0 alone
        printed = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    ranks = [json.loads((tmp_path / f"rank.{r}.json").read_text()) for r in range(2)]
    assert ranks == [{"rc": 143, "group_left_open": False}] * 2, printed[-3000:]
    assert "grpokit: distributed: process group closed" in printed
    assert "stopped by SIGTERM after step" in printed
    assert "resume with: torchrun --nproc_per_node=2 -m grpokit train" in printed
