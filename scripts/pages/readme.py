"""The front pages' blocks: README.md's demo output and headline table, the same headline table on
docs/index.md, and docs/demo.md's seeds; the demo's figures from the newest set of seeds in
benchmarks/results/demo_seeds.jsonl (one date and commit), each other headline row from its page's module."""

from __future__ import annotations

import re
import statistics

from grpokit.observe.demo import format_before_after

from . import agents, asynchronous, code, experiments, performance, race, reliability, reward_models, search
from .raw import RESULTS, newest_group, rows
from .render import Block, Column, Table, Text, headline_row


def demo_runs() -> list[dict]:
    """The newest set of the demo's seeds (the rows of the last row's date and commit), by seed."""
    return sorted(newest_group(rows("demo_seeds.jsonl")), key=lambda r: r["seed"])


def threads_text(threads: str) -> str:
    """A row's thread count as a phrase: '1' -> '1 thread', 'default (2)' -> 'the default 2 threads'."""
    default = re.fullmatch(r"default \((\d+)\)", str(threads))
    if default:
        return f"the default {default.group(1)} threads"
    return f"{threads} thread{'' if str(threads) == '1' else 's'}"


def demo_figures() -> dict:
    """seed 0's row (the README's first command) and the spread of its set of seeds."""
    runs = demo_runs()
    seed0 = runs[0]
    return {
        **seed0, "threads": threads_text(seed0["threads"]), "n": int(seed0["eval_before"]["num_problems"]),
        "accuracy0": seed0["eval_before"]["accuracy"], "seeds": [r["seed"] for r in runs],
        "afters": [r["after"] for r in runs], "gain": statistics.mean(r["after"] - r["before"] for r in runs),
        "befores": "/".join(sorted({f"{100 * r['before']:.1f}%" for r in runs})),
        "printed": format_before_after(seed0["eval_before"], seed0["eval_after"]),
    }


DEMO_INTRO = (
    "`grpokit train` starts from the shipped 0.8 M-parameter char-level model ({accuracy0:percent} greedy "
    "accuracy on {n} held-out 2-digit additions), runs {steps} GRPO steps with the paper's objective and "
    "prints (seed {seed}, {wall_s:seconds} on {machine}, {threads}, commit {commit}; another thread count "
    "or kernel changes the float rounding and moves a {steps}-step run by several points: seeds {seeds} of "
    "that commit end at {afters:pct}%, mean {gain:points}):"
)
DEMO_OUTPUT = Block(
    "README.md", "demo-output",
    (
        Text(DEMO_INTRO, demo_figures, wrap=105),
        Text("```\n{printed}\nplot: runs/demo/demo_plot.png\n```", demo_figures),
        Text("Details, the plot and the SmolLM2-135M run: [docs/demo.md](docs/demo.md)."),
        Text("![demo plot](docs/demo_plot.png)"),
    ),
)


def demo_row() -> list[dict]:
    f = demo_figures()
    return [
        headline_row(
            "the demo: `grpokit train` (0.8M-parameter char model, 2-digit sums, {steps} steps, {problems} "
            "held-out problems)",
            "{befores} -> {afters:pct}% greedy, seeds {seeds} (mean {gain:points}); seed {seed}: "
            "{wall_s:seconds} on {machine}, {threads}", "demo", "demo.md", "demo_seeds.jsonl", **f,
        )
    ]


FAULTS = headline_row(
    "faults: a replaced, interrupted or doubled run", "nothing lost: each fault, what happens, its test",
    "reliability", "reliability.md",
)
HEADLINE_ROWS = (
    demo_row, race.headline, performance.headline, agents.headline, code.headline, search.headline,
    asynchronous.headline, reward_models.headline, experiments.headline, reliability.headline,
    lambda: [FAULTS],
)
HEADLINE = Table(
    rows=lambda: [r for make in HEADLINE_ROWS for r in make()],
    columns=(
        Column("what", "{what}"), Column("result", "{result}"),
        Column("page, raw rows", "[{page}]({docs}{file}){raw}"),
    ),
)


def demo_table_rows() -> list[dict]:
    """Every set of seeds in the file, oldest first, each by seed."""
    found = rows("demo_seeds.jsonl")
    groups = list(dict.fromkeys((r["date"], r["commit"]) for r in found))
    found = sorted(found, key=lambda r: (groups.index((r["date"], r["commit"])), r["seed"]))
    return [{**r, "change": r["after"] - r["before"]} for r in found]


DEMO_SEEDS = Table(
    rows=demo_table_rows,
    columns=(
        Column("seed", "{seed}"), Column("held-out problems", "{problems}"),
        Column("before", "{before:percent}"), Column("after", "{after:percent}"),
        Column("change", "{change:points}"), Column("steps", "{steps}"), Column("wall s", "{wall_s:.0f}"),
        Column("threads", "{threads}"), Column("machine", "{machine}"), Column("commit", "{commit}"),
        Column("date", "{date}"),
    ),
    note="Mean change {gain:signed} points{which}. Seed {seed} prints:\n\n```\n{printed}\n```",
    figures=lambda found: {**demo_figures(), "which": _which(found)},
)


def _which(found: list[dict]) -> str:
    """'' when the file holds one set of seeds; else which set the mean and the printout are of."""
    if len({(r["date"], r["commit"]) for r in found}) == 1:
        return ""
    new = demo_runs()[0]
    return f" (the newest seeds: {new['date']}, commit {new['commit']}, {threads_text(new['threads'])})"


def _provenance() -> dict:
    """How many raw files record the commit they were measured at, and how many a dirty tree's."""
    files = [f for f in RESULTS.rglob("*") if f.is_file() and f.suffix in (".json", ".jsonl", ".md", ".txt")]
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    return {"files": len(files), "with_commit": sum('"commit"' in t for t in texts),
            "dirty": sum("+dirty" in t for t in texts)}


PROVENANCE = Block("README.md", "provenance", (Text(
    "Each row is measured by the command in its doc page; the figures come from the raw files named, under "
    "benchmarks/results/, on a 2-core CPU machine (the machine of each run is in its file or its page). "
    "{with_commit} of those {files} files record the commit they were measured at; the others (the "
    "reward-model and experiment files among them) do not: for those, the commit that added the file is "
    "all git can say. {dirty} were measured on a tree with uncommitted changes (`+dirty` in the row).",
    _provenance, wrap=105),))

BLOCKS = [
    PROVENANCE, DEMO_OUTPUT, Block("README.md", "headline", (HEADLINE,), context={"docs": "docs/"}),
    Block("docs/index.md", "headline", (HEADLINE,), context={"docs": ""}),
    Block("docs/demo.md", "demo-seeds", (DEMO_SEEDS,)),
]
