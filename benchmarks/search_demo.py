"""The search-at-inference measurement of docs/search.md: run it, keep the raw rows, print the table.

    python benchmarks/search_demo.py run --limit 200 --rm runs/search/rm --prm runs/search/prm
    python benchmarks/search_demo.py run ... --only mcts   # only the rows whose label holds 'mcts'
    python benchmarks/search_demo.py run --model runs/tree/flat-0/final --limit 200   # a GRPO-trained policy
    python benchmarks/search_demo.py table          # the markdown table, read from the raw file only
    python benchmarks/search_demo.py plot           # docs/search_demo.png: accuracy against tokens/problem
    python benchmarks/search_demo.py run --config configs/smollm2_gsm8k_cpu.yaml --limit 200 \
        --raw benchmarks/results/search_gsm8k.jsonl --step-separator '\n' --rm RM --prm PRM   # SmolLM2, GSM8K
    python benchmarks/search_demo.py plot --raw benchmarks/results/search_gsm8k.jsonl \
        --png docs/search_gsm8k.png --task 'GSM8K test'

Each row is one `grpokit eval --search ...` on the demo (builtin:arith-demo, the default config's
held-out problems, the first --limit; or --config's task and policy) pinned to one core
(`OMP_NUM_THREADS=1 taskset -c CORE`); its report's figures are appended to --raw (default
benchmarks/results/search_demo.jsonl) with the command, commit, CPU model, thread count and date;
majority and best-of-n rows also keep `oracle_accuracy` (a right answer among the N samples: pass@N).
The reward models are folders `grpokit rm train` wrote (docs/search.md says how).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from pages.search import policy_of, search_table  # noqa: E402  (scripts/pages/search.py: the docs' table)

RAW = ROOT / "benchmarks" / "results" / "search_demo.jsonl"
SEP = ". "       # the demo's equation end: '37+58=95. \\boxed{95}' has two steps


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":!benchmarks/results"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def settings(rm: str | None, prm: str | None, budget: int, sep: str = SEP) -> list[tuple[str, list[str]]]:
    """(label, grpokit eval arguments) of each row; `sep` ends a step for the step verifier."""
    b = str(budget)
    rows = [("greedy", ["--search", "greedy"]),
            (f"majority@{b}", ["--search", "majority", "--budget", b]),
            (f"majority@{b}, T=0.5", ["--search", "majority", "--budget", b, "rollout.temperature=0.5"]),
            (f"best-of-{b}, step verifier (min)", ["--search", "best-of-n", "--budget", b, "--prm", "steps",
                                                   "--step-separator", sep])]
    if rm:
        rows.append((f"best-of-{b}, outcome RM", ["--search", "best-of-n", "--budget", b, "--rm", rm]))
    if prm:
        rows.append((f"best-of-{b}, PRM (min)", ["--search", "best-of-n", "--budget", b, "--prm", prm]))
    rows.append(("beam 4x2, step verifier (min)", ["--search", "beam", "--budget", "4", "--expand", "2",
                                                   "--prm", "steps", "--step-separator", sep]))
    if prm:
        rows.append(("beam 4x2, PRM (min)", ["--search", "beam", "--budget", "4", "--expand", "2",
                                             "--prm", prm]))
    rows.append((f"mcts {b} sims, step verifier (min)", ["--search", "mcts", "--budget", b, "--expand", "2",
                                                         "--prm", "steps", "--step-separator", sep]))
    if prm:
        rows.append((f"mcts {b} sims, PRM (min, sigmoid)", ["--search", "mcts", "--budget", b, "--expand",
                                                            "2", "--prm", prm, "rm.transform=sigmoid"]))
    return rows


def by_problem(report: dict) -> dict:
    """Per problem, in order: 1/0 for the chosen answer (and for any right sample, where candidates are
    kept), so rows run on fewer problems can be read against the others on the same first N."""
    rows = report["problems"]
    out = {"correct_by_problem": [r["correct"] for r in rows]}
    if rows and all("candidates" in r for r in rows):
        out["oracle_by_problem"] = [float(any(c["correct"] == 1.0 for c in r["candidates"])) for r in rows]
    return out


def run(args) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    Path(args.raw).parent.mkdir(parents=True, exist_ok=True)
    raw = Path(args.raw)
    rows = settings(args.rm, args.prm, args.budget, args.step_separator)
    exact = {w for w in args.only or () if w in {label for label, _ in rows}}
    for label, extra in rows:      # --only: a word equal to a label picks that row alone, else any it is in
        if args.only and label not in exact and not any(w in label for w in args.only if w not in exact):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "report.json"
            policy = [f"model.name_or_path={args.model}"] if args.model else []
            config = [args.config] if args.config else []
            cmd = ["taskset", "-c", str(args.core), sys.executable, "-m", "grpokit", "eval", *config,
                   "--limit", str(args.limit), "run.progress=false", "--seed", str(args.seed),
                   "--out", str(out), *policy, *args.set, *extra]
            start = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            report = json.loads(out.read_text())
        shown = ["grpokit", *cmd[cmd.index("eval"):]]
        shown[shown.index("--out") + 1] = "report.json"
        row = {"label": label, "policy": args.policy_name,
               "command": f"OMP_NUM_THREADS=1 taskset -c {args.core} " + shlex.join(shown),
               "commit": commit(), "cpu": cpu_model(), "threads": 1,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               **{k: report[k] for k in ("model", "search", "budget", "rm", "prm", "prm_agg",
                                         "step_separator", "expand", "seed", "num_problems", "accuracy",
                                         "tokens_per_problem", "seconds", "seconds_per_problem")},
               **({"oracle_accuracy": report["oracle_accuracy"]} if "oracle_accuracy" in report else {}),
               **by_problem(report),
               "command_wall_seconds": round(wall, 1)}
        with raw.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{label:<36} accuracy {row['accuracy']:.3f}  tokens/problem {row['tokens_per_problem']:.1f}  "
              f"{row['seconds']:.1f}s", flush=True)


def table(args) -> None:
    print(search_table(Path(args.raw)))


def read_on(row: dict, n: int) -> tuple[float, float | None]:
    """A row's accuracy (and pass@N of its samples) on the first n problems: its own figures when it ran
    exactly n, else read from its per-problem records."""
    if int(row["num_problems"]) == n:
        return row["accuracy"], row.get("oracle_accuracy")
    oracle = row.get("oracle_by_problem")
    return sum(row["correct_by_problem"][:n]) / n, (sum(oracle[:n]) / n if oracle else None)


def panel(ax, rows: list[dict], n: int, policies: list[str], methods: list[str]) -> None:
    """One plot panel: every row that covers the first n problems, read on those n."""
    markers = "osD^vP*Xhp<>"
    ceiling = None
    for r in rows:
        acc, oracle = read_on(r, n)
        ax.scatter(r["tokens_per_problem"], acc, s=45, color=f"C{policies.index(policy_of(r))}",
                   marker=markers[methods.index(r["label"]) % len(markers)])
        if oracle is not None and (ceiling is None or r["budget"] > ceiling[0]):
            ceiling = (r["budget"], oracle, policy_of(r))
    if ceiling is not None:      # pass@N: the best any choice of one of the N samples can do
        ax.axhline(ceiling[1], color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(f"pass@{ceiling[0]} of {ceiling[2]}", (0, ceiling[1]), fontsize=7, color="grey",
                    xytext=(4, 3), textcoords="offset points")
    ax.set_xlim(0, 1.1 * max(r["tokens_per_problem"] for r in rows))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("generated tokens per problem")
    ax.set_title(f"first {n} problems" + ("" if all(int(r["num_problems"]) == n for r in rows)
                                          else " (longer runs read on these)"), fontsize=9)
    ax.grid(alpha=0.3)


def plot(args) -> None:
    """Accuracy against generated tokens per problem, one point per row of the raw file; where rows ran
    on different numbers of problems, one panel per number, each row read on that panel's first N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = [json.loads(line) for line in Path(args.raw).read_text().splitlines() if line.strip()]
    sizes = sorted({int(r["num_problems"]) for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(sizes), figsize=(10 if len(sizes) == 1 else 14, 5), squeeze=False)
    policies = list(dict.fromkeys(policy_of(r) for r in rows))      # colour: the policy
    methods = list(dict.fromkeys(r["label"] for r in rows))         # marker: the search
    for ax, n in zip(axes[0], sizes):
        panel(ax, [r for r in rows if int(r["num_problems"]) >= n], n, policies, methods)
    axes[0][0].set_ylabel("accuracy (one answer per problem)")
    markers = "osD^vP*Xhp<>"
    by_policy = [Line2D([], [], color=f"C{i}", marker="o", linestyle="", label=name)
                 for i, name in enumerate(policies)]
    by_method = [Line2D([], [], color="grey", marker=markers[i % len(markers)], linestyle="", label=name)
                 for i, name in enumerate(methods)]
    last = axes[0][-1]
    first = last.legend(handles=by_policy, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                        title="policy (colour)", title_fontsize=8)
    last.add_artist(first)
    last.legend(handles=by_method, fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 0.0),
                title="search (marker)", title_fontsize=8)
    fig.suptitle(f"Search at inference on {args.task}, held-out problems", fontsize=10)
    fig.tight_layout()
    out = ROOT / args.png
    fig.savefig(out, dpi=120, bbox_inches="tight")
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--limit", type=int, default=200)
    r.add_argument("--budget", type=int, default=8)
    r.add_argument("--rm", default=None, help="an outcome RM folder (grpokit rm train)")
    r.add_argument("--prm", default=None, help="a process RM folder (grpokit rm train --kind process)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--core", type=int, default=0)
    r.add_argument("--model", default=None, help="the policy (default: the config's, builtin:arith-demo)")
    r.add_argument("--policy-name", default="starting model (builtin:arith-demo)",
                   help="the policy's name in the table and the plot")
    r.add_argument("--only", nargs="*", default=None,
                   help="run only the rows whose label holds one of these (equal to a label: that row only)")
    r.add_argument("--config", default=None, help="a YAML config (default: the demo)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every row, e.g. rm.precision=bf16 (repeat for more)")
    r.add_argument("--step-separator", default=SEP, help="the step verifier's step end (demo: '. ')")
    t = sub.add_parser("table")
    pl = sub.add_parser("plot")
    pl.add_argument("--png", default="docs/search_demo.png", help="the plot's path under the repository")
    pl.add_argument("--task", default="the demo", help="the task's name in the plot's title")
    for q in (r, t, pl):
        q.add_argument("--raw", default=str(RAW), help="the raw rows file")
    args = p.parse_args()
    {"run": run, "table": table, "plot": plot}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
