"""Soak test of crash and resume: a long CPU run of the demo config, SIGKILLed at random moments.

Two runs of the same config and seed, side by side, each in its own process with one CPU thread:

    reference : `grpokit train` start to finish, never interrupted
    crashed   : `grpokit train ... run.resume=auto`, SIGKILLed --kills times at random steps (plus a
                random delay, so a kill lands anywhere: mid-step, mid-save, during start-up),
                restarted each time with the same command, until it finishes

Then it checks that both final models are bit-identical, that metrics.jsonl of the crashed run
holds every step exactly once, and that the crashed run's per-step rewards and losses equal the
reference's (the same samples, the same updates). It prints steps completed, kills survived, bytes
written (file-system output of every attempt, from the kernel's rusage) and the checkpoint size.

    python benchmarks/soak_resume.py                       # 500 steps, checkpoints every 20, 5 kills
    python benchmarks/soak_resume.py --steps 60 --kills 2  # a quick look

With --record FILE the result is appended to FILE as one JSON row with the command, commit, CPU model
and date (docs/reliability.md's soak block is generated from benchmarks/results/soak_resume.jsonl).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path


def digit_share(prompts: list, completions: list, **kwargs) -> list[float]:
    """Share of completion characters that are digits: a dense shaping reward, so every group has
    different rewards and every step changes the weights (the random-init demo model never earns the
    rule reward, which would leave the weights untouched and make bit-identity trivial)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def pin_config(path: Path, args: argparse.Namespace) -> Path:
    """The demo config plus the digit-share reward, every key written out: both runs (and every restart)
    read this file, so a change to grpokit's defaults during the soak cannot change the run."""
    import yaml

    from grpokit.cli.main import DEMO
    from grpokit.config.schema import build_config

    reward = {"rule": 1.0, f"{Path(__file__).resolve()}:digit_share": 0.2}
    cfg = build_config({**DEMO, "reward.funcs": reward, "run.max_steps": args.steps,
                        "run.save_steps": args.save_steps, "run.eval_limit": 0, "run.progress": False,
                        "run.logging_steps": args.steps, "run.seed": args.seed})
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return path


def command(config: Path, out: Path, resume: bool) -> list[str]:
    """`grpokit train <pinned config>` into `out`."""
    cmd = [sys.executable, "-m", "grpokit", "train", str(config), f"run.output_dir={out}"]
    return cmd + (["run.resume=auto"] if resume else ["--overwrite"])


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1"}


def steps_logged(out: Path) -> int:
    """The last step in metrics.jsonl (0 when there is none yet)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    last = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            last = int(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return last


def reap(proc: subprocess.Popen, block: bool = True) -> tuple[int, int] | None:
    """(exit status, bytes it wrote to the file system per the kernel's rusage), or None while it runs."""
    pid, status, usage = os.wait4(proc.pid, 0 if block else os.WNOHANG)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_oublock * 512


def crashed_run(config: Path, out: Path, args: argparse.Namespace, log_file) -> dict:
    """Run with resume=auto, SIGKILL at --kills random steps, restart after each kill, finish."""
    rng = random.Random(args.seed + 1)
    targets = sorted(rng.sample(range(2, args.steps - 2), args.kills))
    kills, written, attempts, in_save = [], 0, 0, 0
    while True:
        attempts += 1
        proc = subprocess.Popen(command(config, out, resume=True), env=env(), stdout=log_file,
                                stderr=log_file)
        target = targets[len(kills)] if len(kills) < len(targets) else None
        done = None
        while target is not None and done is None and steps_logged(out) < target:
            time.sleep(0.05)
            done = reap(proc, block=False)
        if target is not None and done is None:
            time.sleep(rng.uniform(0.0, 1.0))  # anywhere inside the next step (or its save)
            os.kill(proc.pid, signal.SIGKILL)
            rc, nbytes = reap(proc)
            during_save = any(out.glob(".tmp-checkpoint-*"))
            in_save += during_save
            kills.append({"after_step": steps_logged(out), "during_save": during_save, "rc": rc})
            written += nbytes
            continue
        rc, nbytes = done or reap(proc)
        written += nbytes
        if rc != 0:
            raise SystemExit(f"the crashed run exited with {rc}: see {out.parent}/crashed.log")
        return {"kills": kills, "attempts": attempts, "bytes_written": written, "kills_during_save": in_save}


def compare(reference: Path, crashed: Path, steps: int) -> dict:
    """Bit-identity of the final weights; each step logged once; per-step rewards and losses equal."""
    from safetensors.torch import load_file

    from grpokit.observe.metrics import read_metrics

    a, b = (load_file(reference / "final" / "model.safetensors"),
            load_file(crashed / "final" / "model.safetensors"))
    identical = a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].equal(b[k]) for k in a)
    rows_a, rows_b = read_metrics(reference), read_metrics(crashed)
    logged = [r["step"] for r in rows_b]
    same_rows = len(rows_a) == len(rows_b) and all(
        (x["reward_mean"], x.get("loss")) == (y["reward_mean"], y.get("loss"))
        for x, y in zip(rows_a, rows_b))
    moved = sum(1 for r in rows_b if r.get("grad_norm", 0.0) > 0)
    return {"weights_bit_identical": identical, "steps_logged_once": logged == list(range(1, steps + 1)),
            "steps_with_nonzero_grad": moved,
            "rows": len(rows_b), "per_step_reward_and_loss_equal": same_rows}


def record(args: argparse.Namespace, result: dict) -> None:
    """Append `result` with how it was measured (command, commit, CPU, date) to args.record."""
    from search_demo import commit, cpu_model

    shown = ["python", "benchmarks/soak_resume.py"] + [
        f"--{k.replace('_', '-')} {v}" for k, v in (("steps", args.steps), ("save_steps", args.save_steps),
                                                   ("kills", args.kills), ("seed", args.seed))]
    row = {**result, "command": " ".join(shown), "commit": commit(), "cpu": cpu_model(), "threads": 1,
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    with open(args.record, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--save-steps", type=int, default=20)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/soak")
    p.add_argument("--record", default=None, help="append the result as one JSON row to this file")
    args = p.parse_args()
    root = Path(args.out)
    (root / "crashed").mkdir(parents=True, exist_ok=True)
    for stale in (root / "crashed").iterdir():  # a fresh soak each time
        subprocess.run(["rm", "-rf", str(stale)], check=True)
    start = time.time()
    config = pin_config(root / "soak_config.yaml", args)
    with open(root / "reference.log", "w") as ref_log, open(root / "crashed.log", "w") as crash_log:
        ref = subprocess.Popen(command(config, root / "reference", resume=False), env=env(), stdout=ref_log,
                               stderr=ref_log)
        crash = crashed_run(config, root / "crashed", args, crash_log)
        ref_rc, ref_bytes = reap(ref)
    if ref_rc != 0:
        raise SystemExit(f"the reference run exited with {ref_rc}: see {root}/reference.log")
    ckpt = sorted((root / "crashed").glob("checkpoint-*"))[-1]
    result = {"steps": args.steps, "save_steps": args.save_steps, **crash,
              "reference_bytes_written": ref_bytes,
              "checkpoint_bytes": sum(f.stat().st_size for f in ckpt.iterdir()),
              **compare(root / "reference", root / "crashed", args.steps),
              "wall_s": round(time.time() - start, 1)}
    (root / "soak.json").write_text(json.dumps(result, indent=2))
    if args.record:
        record(args, result)
    print(f"steps completed: {result['rows']}/{args.steps} (each logged once: {result['steps_logged_once']})")
    print(f"kills survived: {len(crash['kills'])} ({crash['kills_during_save']} during a checkpoint write), "
          f"attempts: {crash['attempts']}, killed after steps: {[k['after_step'] for k in crash['kills']]}")
    print(f"bytes written: crashed run {crash['bytes_written']:,}, uninterrupted run {ref_bytes:,}; "
          f"one checkpoint: {result['checkpoint_bytes']:,} bytes")
    print(f"steps with a non-zero gradient: {result['steps_with_nonzero_grad']}/{args.steps}")
    print(f"final weights bit-identical to the uninterrupted run: {result['weights_bit_identical']}; "
          f"per-step reward and loss equal: {result['per_step_reward_and_loss_equal']}")
    print(f"wall time: {result['wall_s']} s")
    ok = (result["weights_bit_identical"] and result["steps_logged_once"]
          and result["per_step_reward_and_loss_equal"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
