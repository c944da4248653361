"""The agents demonstrations of docs/agents.md: run them, keep their raw rows, draw their figures.

    python benchmarks/agents_demo.py run calculator --seeds 0 1 2           # with the tool (~13 min each)
    python benchmarks/agents_demo.py run calculator --seeds 0 1 2 --no-tool # the same model, no tool
    python benchmarks/agents_demo.py run guess_number --seeds 0 1 2
    python benchmarks/agents_demo.py run calculator_smollm2                 # SmolLM2-135M, 60 min (~80 min)
    python benchmarks/agents_demo.py report                                 # tables + docs/agents_*.png

Each run is `grpokit train configs/agents_<name>.yaml run.seed=S` pinned to one core
(`OMP_NUM_THREADS=1 taskset -c 1`), training for its config's budget (the calculator 10 minutes, SmolLM2's
60, guess-the-number 600 steps with the learning rate decayed to 0),
evaluations off the clock; its eval.jsonl and metrics.jsonl are copied to
benchmarks/results/agents_<name>[_notool]_seed<S>_*.jsonl with the run's wall time, command, commit, CPU
and date (_wall.json), and `report` reads only those files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from pages.agents import agents_table  # noqa: E402  (scripts/pages/agents.py: the docs' tables)

RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"


def _tag(name: str, tool: bool, seed: int, variant: str = "") -> str:
    return f"agents_{name}{'' if tool else '_notool'}{f'_{variant}' if variant else ''}_seed{seed}"


def run(name: str, seed: int, tool: bool, core: int, overrides: list[str], variant: str) -> None:
    """One seed's run; `overrides` (KEY=VALUE) change the config, and their rows carry `variant`'s tag."""
    tag = _tag(name, tool, seed, variant)
    out = ROOT / "runs" / "agents" / tag
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "grpokit", "train",
           f"configs/agents_{name}.yaml", f"run.seed={seed}", f"run.output_dir={out}", "run.progress=false",
           "run.overwrite=true", *overrides]
    if not tool:
        cmd.append("rollout.environment=null")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    wall = time.perf_counter() - start
    for kind in ("eval", "metrics"):
        shutil.copy(out / f"{kind}.jsonl", RESULTS / f"{tag}_{kind}.jsonl")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    shown = ["python" if c == sys.executable else c.replace(f"{ROOT}/", "") for c in cmd]
    wall_row = {"wall_seconds": round(wall, 1), "core": core,
                "command": "OMP_NUM_THREADS=1 " + " ".join(shown), "commit": commit.strip(),
                "cpu": _cpu_model(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    (RESULTS / f"{tag}_wall.json").write_text(json.dumps(wall_row) + "\n")


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _runs(name: str, tool: bool) -> list[tuple[int, list[dict], list[dict], float]]:
    out = []
    for f in sorted(RESULTS.glob(f"{_tag(name, tool, 0)[:-1]}*_eval.jsonl")):
        tag = f.name[:-len("_eval.jsonl")]
        seed = int(tag.rsplit("seed", 1)[1])
        wall = json.loads((RESULTS / f"{tag}_wall.json").read_text())["wall_seconds"]
        out.append((seed, _rows(f), _rows(RESULTS / f"{tag}_metrics.jsonl"), wall))
    return out


def figure(name: str, key: str, label: str, budget: str) -> Path:
    """The key of every evaluation against the training step, one line per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for tool, style in ((True, "-"), (False, "--")):
        for seed, evals, _, _ in _runs(name, tool):
            ax.plot([r["step"] for r in evals], [100 * r[key] for r in evals], style, marker="o", ms=3,
                    label=f"{'tool' if tool else 'no tool'}, seed {seed}")
    ax.set_xlabel(f"GRPO step ({budget}, one core)")
    ax.set_ylabel(f"held-out {label} (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = DOCS / f"agents_{name}.png"
    fig.savefig(path, dpi=120)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("name", choices=["calculator", "guess_number", "calculator_smollm2"])
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--no-tool", action="store_true", help="the same config without the environment")
    r.add_argument("--core", type=int, default=1)
    r.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. optim.lr_scheduler_type=linear run.max_steps=300")
    r.add_argument("--variant", default="", help="a tag for runs with --set: agents_<name>_<variant>_seed<S>")
    sub.add_parser("report")
    args = p.parse_args()
    if args.what == "run":
        if args.overrides and not args.variant:
            p.error("--set changes the config: name the variant with --variant NAME (its rows keep that tag)")
        for seed in args.seeds:
            run(args.name, seed, not args.no_tool, args.core, args.overrides, args.variant)
        return 0
    for name, key, label, budget in (("calculator", "accuracy", "accuracy", "10 minutes of training"),
                                     ("guess_number", "rewards/GuessNumber", "success",
                                      "600 steps, learning rate decayed linearly to 0"),
                                     ("calculator_smollm2", "accuracy", "accuracy", "60 minutes")):
        if _runs(name, True):
            path = figure(name, key, label, budget)
            print(f"## {name}\n\n{agents_table(name, key, label)}\n\nfigure: {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
