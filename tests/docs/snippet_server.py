"""A fork server for the docs' snippets: imports torch, transformers, TRL and grpokit once, then runs each
request in a fresh child process forked from that warm interpreter.

Each snippet gets a process of its own (its own cwd, environment, globals, torch state, exit code), as it
would from a shell, without paying the ~5 s of imports forty times over. One JSON request per stdin line:

    {"kind": "grpokit", "argv": [...], "cwd": ..., "env": {...}, "log": ..., "timeout": s}  # grpokit ARGS
    {"kind": "script", "argv": ["benchmarks/x.py", ...], ...}                                 # python FILE
    {"kind": "python", "code": ..., "filename": "README.md", "line": 88, ...}                 # a python block

and one JSON reply line per request: {"rc": exit status (-9: killed at the timeout)}. The child's stdout
and stderr go to the request's "log" file.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pkgutil
import runpy
import signal
import sys
import time
import traceback

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no tokenizer thread pool to fork across

import datasets  # noqa: E402,F401  (imported once here, for every child)
import matplotlib  # noqa: E402
import torch  # noqa: E402,F401
import transformers  # noqa: E402,F401

import grpokit  # noqa: E402
import trl  # noqa: E402,F401
from grpokit.cli import bench  # noqa: E402
from grpokit.cli import main as grpokit_main  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def warm_up() -> None:
    """Import what the commands import lazily (every grpokit module, the model classes transformers loads
    on first use) and draw one figure (matplotlib's fonts): ~6 s a command otherwise."""
    for mod in pkgutil.walk_packages(grpokit.__path__, "grpokit."):
        if "vllm" not in mod.name and not mod.name.endswith("__main__"):
            importlib.import_module(mod.name)
    for name in ("qwen2", "llama"):
        importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="warm")
    ax.legend()
    fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)


def _run(request: dict) -> int:
    """The request's exit status, in the child."""
    kind = request["kind"]
    if kind == "grpokit":
        sys.argv = ["grpokit", *request["argv"]]
        return grpokit_main.main(request["argv"])
    if kind == "parse":   # `grpokit bench ...`: its arguments parsed and its training state built
        bench.bench_state(bench.parse_args(request["argv"][1:]))
        return 0
    if kind == "script":
        sys.argv = list(request["argv"])
        sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
        runpy.run_path(sys.argv[0], run_name="__main__")
        return 0
    # a python block: compiled under its page's name, so a traceback names the page's own line
    sys.argv = ["-c"]
    sys.path.insert(0, os.getcwd())
    code = "\n" * (request["line"] - 2) + request["code"]   # its prelude line sits just above the block
    exec(compile(code, request["filename"], "exec"), {"__name__": "__main__"})
    return 0


def _child(request: dict) -> None:
    os.chdir(request["cwd"])
    os.environ.update(request.get("env", {}))
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        rc = _run(request)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # the snippet failed: its traceback is the test's message
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(rc or 0) & 0xFF)


def _serve_one(request: dict) -> int:
    pid = os.fork()
    if pid == 0:
        _child(request)
    deadline = time.monotonic() + request["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.02)


def main() -> None:
    warm_up()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps({"rc": _serve_one(json.loads(line))}), flush=True)


if __name__ == "__main__":
    main()
