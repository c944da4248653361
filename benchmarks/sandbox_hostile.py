"""Hostile programs through grpokit.sandbox.run, in both modes: what each got, and what it changed.

    python benchmarks/sandbox_hostile.py [--modes bwrap process] [--only fork_bomb,kill_parent]
        [--record benchmarks/results/sandbox_hostile.jsonl]

For each program of benchmarks/sandbox_programs.py and each mode, a fresh caller process runs it (so a
program that kills its parent kills only that caller, and the row says so) with the default Limits, and
the benchmark records: outcome, reward (Result.fraction), seconds; whether the watched folders changed
(a sample project with a .env, a run folder with metrics, a fake home with .ssh/id_rsa, all made here and
digested before and after); whether it wrote files into the machine's /tmp or /dev/shm (removed after);
whether a planted secret (an env variable of the caller, the key, the .env, the run's token, a loopback
listener's banner) showed up in its output; and which of its processes were left (a `sleep $mark`, or a
process with the bwrap-as-root sandbox uid), which are then killed. The programs print only what carries
the planted tag, and no program output is recorded.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "scripts"))
from bench_record import machine  # noqa: E402
from sandbox_programs import TESTS, hostile  # noqa: E402

from grpokit.sandbox.command import UID_RANGE  # noqa: E402

CALLER = """
import json, sys, warnings
warnings.simplefilter("ignore")
from grpokit.sandbox import run
job = json.loads(sys.stdin.read())
r = run(job["program"], job["tests"], mode=job["mode"])
print(json.dumps({"outcome": r.outcome, "passed": r.passed, "total": r.total, "seconds": r.seconds,
                  "detail": r.detail, "output": r.stdout + r.stderr}))
"""


def plant(root: Path, tag: str) -> dict[str, Path]:
    """The watched folders, each with a secret that carries `tag`."""
    folders = {"project": root / "project", "run": root / "run", "home": root / "home"}
    for d in folders.values():
        shutil.rmtree(d, ignore_errors=True)
    (folders["project"] / "src").mkdir(parents=True)
    (folders["project"] / "src" / "train.py").write_text("print('training')\n")
    (folders["project"] / ".env").write_text(f"WANDB_API_KEY={tag}-project-env\n")
    folders["run"].mkdir()
    (folders["run"] / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    (folders["run"] / "token").write_text(f"{tag}-run-token\n")
    (folders["home"] / ".ssh").mkdir(parents=True, mode=0o700)
    (folders["home"] / ".ssh" / "id_rsa").write_text(f"-----BEGIN KEY----- {tag}-ssh-key\n")
    (folders["home"] / ".bashrc").write_text("export PS1='$ '\n")
    return folders


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode())
        info = path.lstat()
        h.update(f"{info.st_mode:o}".encode())
        if path.is_file() and not path.is_symlink():
            h.update(path.read_bytes())
    return h.hexdigest()


def listener(tag: str) -> tuple[socket.socket, int]:
    """A loopback server that hands every connection a secret (what a local service might leak)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(f"{tag}-loopback-banner\n".encode())

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def left_behind(mark: str) -> list[str]:
    """Processes a program left: a `sleep <mark>` (or anything with mark in its command line), or one run by
    a uid of the bwrap-as-root range."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            uid = int(Path(entry.path, "status").read_text().split("\nUid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
        if mark.encode() in cmdline or UID_RANGE[0] <= uid < UID_RANGE[1]:
            words = cmdline[:60].replace(b"\0", b" ").decode("utf-8", "replace")
            found.append(f"{entry.name} uid {uid}: {words}")
    return found


def one(name: str, source: str, mode: str, *, folders: dict[str, Path], tag: str, port: int) -> dict:
    mark = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**9):09d}"
    program = string.Template(source).safe_substitute(mark=mark, port=port, tag=tag,
                                                      **{k: str(v) for k, v in folders.items()})
    root = folders["project"].parent
    before = digest(root)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folders["home"]),   # no real secret
           "GRPOKIT_SERVE_TOKEN": f"{tag}-env-token", "AWS_SECRET_ACCESS_KEY": f"{tag}-env-aws"}
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", CALLER], input=json.dumps(
            {"program": program, "tests": TESTS, "mode": mode}), capture_output=True, text=True, env=env,
            timeout=120)
        got = json.loads(done.stdout) if done.returncode == 0 else None
    except subprocess.TimeoutExpired:
        done, got = None, None
    seconds = time.monotonic() - start
    time.sleep(0.2)                                   # a detached process has had time to show up
    left = left_behind(mark)
    for pid in left:
        kill(int(pid.split()[0]))
    host_tmp = [*Path("/tmp").glob(f"{mark}-*"), *Path("/dev/shm").glob(f"{mark}-*")]
    for p in host_tmp:
        p.unlink(missing_ok=True)
    changed = digest(root) != before
    row = {"program": name, "mode": mode, "as_root": os.geteuid() == 0, "watched_changed": changed,
           "wrote_host_tmp": bool(host_tmp), "left_processes": len(left), "left": left}
    if got is None:
        code = done.returncode if done is not None else "timeout"
        row.update(outcome="caller_killed" if done is not None and done.returncode < 0 else "caller_failed",
                   reward=0.0, seconds=seconds, detail=f"the caller process ended with {code}",
                   leaked=False)
    else:
        row.update(outcome=got["outcome"], reward=got["passed"] / got["total"], seconds=got["seconds"],
                   detail=got["detail"], leaked=tag in got["output"] or tag in got["detail"])
    return row


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def meta() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True,
                            text=True).stdout.strip()
    return {"bench": "sandbox_hostile", "commit": commit, "machine": machine(),
            "platform": platform.platform(), "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def table(rows: list[dict]) -> str:
    head = f"{'program':22s} {'mode':8s} {'outcome':16s} {'reward':>6s} {'secs':>5s} changed tmp leak left"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['program']:22s} {r['mode']:8s} {r['outcome']:16s} {r['reward']:6.2f} "
                     f"{r['seconds']:5.2f} {str(r['watched_changed']):7s} {str(r['wrote_host_tmp'])[0]:3s} "
                     f"{str(r['leaked'])[0]:4s} {r['left_processes']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", default=["bwrap", "process"], choices=["bwrap", "process"])
    p.add_argument("--only", default="", help="comma-separated program names (default: all)")
    p.add_argument("--record", default=str(HERE / "results" / "sandbox_hostile.jsonl"))
    args = p.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    tag = f"HOSTILE-SECRET-{secrets.token_hex(6)}"
    outside_tmp = "/var/tmp" if os.path.isdir("/var/tmp") else None    # not under the sandbox's own /tmp
    root = Path(tempfile.mkdtemp(prefix="sandbox-hostile-", dir=outside_tmp))
    server, port = listener(tag)
    rows, info = [], meta()
    try:
        for mode in args.modes:
            for name, source, process_mode in hostile():
                if only and name not in only:
                    continue
                if mode == "process" and process_mode is not True:
                    when, why = process_mode
                    if when == "always" or os.geteuid() == 0:
                        rows.append({**info, "program": name, "mode": mode, "outcome": "skipped",
                                     "reward": 0.0, "seconds": 0.0, "detail": why, "watched_changed": False,
                                     "wrote_host_tmp": False, "leaked": False, "left_processes": 0,
                                     "as_root": os.geteuid() == 0})
                        continue
                folders = plant(root, tag)
                rows.append({**info, **one(name, source, mode, folders=folders, tag=tag, port=port)})
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)
    print(table(rows))
    with open(args.record, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{len(rows)} rows -> {args.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
