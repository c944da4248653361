"""Regenerate the generated parts of the docs from their sources (tests/cli/test_readme.py checks both):

    docs/configuration.md   the config reference, from the typed config
    docs/agents.md          the agents demonstrations' tables, from benchmarks/results/agents_*
    docs/demo.md            the demo's seeds and seed 0's output, from benchmarks/results/demo_seeds.jsonl
    docs/performance.md     grpokit against TRL at equal work, from bench_smollm2_equal_micro_batches.jsonl
    docs/memory.md          the peak-memory table and its ratios, from benchmarks/results/memory_table.jsonl
    docs/real_model.md      SmolLM2's GSM8K baseline, from benchmarks/results/gsm8k_smollm2_baseline.jsonl
    docs/async.md           async against sync, from benchmarks/results/async_*.jsonl (scripts/docs_async.py)
    docs/search.md          tree and MCTS against flat GRPO, from benchmarks/results/tree_*.jsonl and
                            mcts_*.jsonl (docs_tree.py)
    README.md               the demo's output (seed 0's raw rows), the headline table and the agents
                            results, each figure computed from the raw rows under benchmarks/results/
                            that the table names

    docs/*.md measured blocks  every table scripts/docs_blocks.py collects, from its raw files

    python scripts/update_readme.py
"""

import json
import re
import statistics
import sys
import textwrap
from pathlib import Path

from grpokit.cli.membench import compare as memory_ratios
from grpokit.cli.membench import format_table as memory_format
from grpokit.config.schema import config_reference
from grpokit.observe.demo import format_before_after

sys.path.insert(0, str(Path(__file__).resolve().parent))
# scripts/docs_async.py; ASYNC_START: for the tests
from docs_agents import AGENTS_END, AGENTS_START, agents_rows, render_agents  # noqa: E402, F401
from docs_async import ASYNC_START, async_row, async_server_row, render_async  # noqa: E402, F401
from docs_blocks import ALL as MEASURED_BLOCKS  # noqa: E402  (scripts/docs_blocks.py: every block)
from docs_measured import pct as _pct  # noqa: E402
from docs_measured import render as render_measured  # noqa: E402
from docs_measured import rows as _rows  # noqa: E402
from docs_race_band import seeds as race_seeds  # noqa: E402
from docs_reliability import conformance_row  # noqa: E402
from docs_tree import (  # noqa: E402, F401  (scripts/docs_tree.py)
    TREE_START,
    gsm8k_rows,
    render_tree,
    search_row,
    tree_rows,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
HEAD_START, HEAD_END = "<!-- headline:start -->", "<!-- headline:end -->"
DEMO_START, DEMO_END = "<!-- demo-output:start -->", "<!-- demo-output:end -->"
SEEDS_START, SEEDS_END = "<!-- demo-seeds:start -->", "<!-- demo-seeds:end -->"
BENCH_START, BENCH_END = "<!-- bench-equal:start -->", "<!-- bench-equal:end -->"
MEMORY_START, MEMORY_END = "<!-- memory-table:start -->", "<!-- memory-table:end -->"
GSM8K_START, GSM8K_END = "<!-- gsm8k-baseline:start -->", "<!-- gsm8k-baseline:end -->"


def render(text: str) -> str:
    """`text` with its config-reference block regenerated."""
    block = f"{START}\n{config_reference()}\n{END}"
    return re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)


def demo_row() -> str:
    rows = sorted(_rows("demo_seeds.jsonl"), key=lambda r: r["seed"])
    before = {_pct(r["before"]) for r in rows}
    after = " / ".join(f"{100 * r['after']:.1f}" for r in rows)
    seeds = " / ".join(str(r["seed"]) for r in rows)
    gain = statistics.mean(r["after"] - r["before"] for r in rows)
    what = (f"the demo: `grpokit train` (0.8M-parameter char model, 2-digit sums, {rows[0]['steps']} steps, "
            f"{rows[0]['problems']} held-out problems)")
    result = f"{'/'.join(sorted(before))} -> {after}% greedy, seeds {seeds} (mean {100 * gain:+.1f} pt)"
    return f"| {what} | {result} | [demo](docs/demo.md), `benchmarks/results/demo_seeds.jsonl` |"


def race_row() -> str:
    def end(side: str, seed: int) -> tuple[float, float, int]:
        ev = _rows(f"arith_{side}_race_1thread_60min_seed{seed}_eval.jsonl")
        steps = len(_rows(f"arith_{side}_race_1thread_60min_seed{seed}_metrics.jsonl"))
        return ev[0]["accuracy"], ev[-1]["accuracy"], steps
    seeds = race_seeds("smollm2")
    g, t = [end("smollm2", s) for s in seeds], [end("trl", s) for s in seeds]
    per_step = [gs[2] / ts[2] for gs, ts in zip(g, t)]
    ends = {side: " / ".join(_pct(x[1]) for x in xs) for side, xs in (("g", g), ("t", t))}
    return (f"| SmolLM2-135M-Instruct, arithmetic, the same hour as TRL 1.16 (one core each, seeds "
            f"{' / '.join(map(str, seeds))}) | grpokit {_pct(g[0][0])} -> {ends['g']}; "
            f"TRL {ends['t']}; {min(per_step):.1f}-{max(per_step):.1f}x the steps | "
            "[real model](docs/real_model.md), `benchmarks/results/arith_*_race_1thread_60min_seed*` |")


def bench_row() -> str:
    rows = _rows("bench_smollm2_equal_micro_batches.jsonl")
    out = []
    for mb in sorted({r["micro_batch_size"] for r in rows if "compare" in r}, reverse=True):
        c = next(r for r in rows if "compare" in r and r["micro_batch_size"] == mb)["compare"]
        setting = f"micro-batches of {mb}" if mb else "whole batches"
        speed, memory = c["ratio_trl_over_grpokit_s_per_step"], c["rss_grpokit_mib"] / c["rss_trl_mib"]
        out.append(f"{setting}: {speed:.2f}x faster, peak RSS {memory:.2f} of TRL's")
    return ("| one step against TRL 1.16 at equal work (SmolLM2 bf16, 4 x 8 x 64 tokens, the same "
            f"micro-batches on both sides, one thread) | {'; '.join(out)} | "
            "[performance](docs/performance.md), "
            "`benchmarks/results/bench_smollm2_equal_micro_batches.jsonl` |")


def _json(name: str):
    return json.loads((RESULTS / name).read_text())




def rm_row() -> str:
    start = statistics.mean(r["before"] for r in _rows("demo_seeds.jsonl"))
    frozen = [r["eval/accuracy"] for r in _json("rm/rm_supervision_results.json")
              if r["variant"] == "outcome_rm"]
    cont = [r["eval/accuracy"] for r in _json("rm/rm_iterative_results.json")
            if r["variant"] == "continual"]
    return ("| learned reward models and Algorithm 1 (demo, 400 steps, beta 0.04) | frozen outcome RM: "
            f"{100 * (statistics.mean(frozen) - start):+.1f} pt ({len(frozen)} seeds, exploited); with "
            f"continual training and 10% replay: {100 * (statistics.mean(cont) - start):+.1f} pt "
            f"({len(cont)} seeds) | "
            "[reward models](docs/reward_models.md), `benchmarks/results/rm/` |")


def ppo_row() -> str:
    rows = _json("experiments/grpo_vs_ppo.json")["rows"]
    side = {a: [r for r in rows if r["loss.algorithm"] == a] for a in ("grpo", "ppo")}
    acc = {a: statistics.mean(r["eval/accuracy"] for r in rs) for a, rs in side.items()}
    wall = {a: statistics.mean(r["wall_s"] for r in rs) for a, rs in side.items()}
    steps = rows[0]["steps"]
    return ("| the chapter's claims (k = 8, graduation, std scaling, all-wrong groups, GRPO vs PPO) | "
            f"4 hold, the length drift does not here; at {steps} steps GRPO {_pct(acc['grpo'])}, "
            f"PPO {_pct(acc['ppo'])} "
            f"(3 seeds), GRPO {wall['ppo'] / wall['grpo']:.1f}x faster | "
            "[experiments](docs/experiments.md), `benchmarks/results/experiments/` |")


STATIC_ROWS = [
    "| faults: a replaced, interrupted or doubled run | nothing lost: each fault, what happens, its test | "
    "[reliability](docs/reliability.md) |",
]


def headline() -> str:
    """The README's headline table, its measured rows computed from the raw files."""
    rows = [demo_row(), race_row(), bench_row(), *agents_rows(), search_row(), *gsm8k_rows(), *tree_rows(),
            async_row(), async_server_row(), rm_row(),
            ppo_row(), conformance_row(), *STATIC_ROWS]
    return "\n".join(["| what | result | page, raw rows |", "|---|---|---|", *rows])


def demo_output() -> str:
    """What `grpokit train` prints at the end, from seed 0's raw rows."""
    seed0 = min(_rows("demo_seeds.jsonl"), key=lambda r: r["seed"])
    b = seed0["eval_before"]
    threads = f"{seed0['threads']} thread{'' if str(seed0['threads']) == '1' else 's'}"
    intro = textwrap.fill(
        "`grpokit train` starts from the shipped 0.8 M-parameter char-level model "
        f"({_pct(b['accuracy'])} greedy accuracy on {int(b['num_problems'])} held-out 2-digit additions), "
        "runs "
        f"{seed0['steps']} GRPO steps with the paper's objective and prints (seed {seed0['seed']}, "
        f"{seed0['wall_s']:.0f} s on {seed0['machine']}, {threads}, commit {seed0['commit']}; another thread "
        "count or kernel changes the float rounding and moves a 400-step run by several points, so read the "
        "seeds' spread below):", width=105)
    return (f"{intro}\n\n```\n{format_before_after(b, seed0['eval_after'])}\n"
            "plot: runs/demo/demo_plot.png\n```\n\n"
            "Details, the plot and the SmolLM2-135M run: [docs/demo.md](docs/demo.md).\n\n"
            "![demo plot](docs/demo_plot.png)")


def _block(text: str, start: str, end: str, body: str) -> str:
    return re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{body}\n{end}", text,
                  flags=re.S)


def render_readme(text: str) -> str:
    text = _block(text, DEMO_START, DEMO_END, demo_output())
    return _block(text, HEAD_START, HEAD_END, headline())


def demo_seeds() -> str:
    """docs/demo.md's table of seeds, seed 0's printed output and how they were run."""
    rows = sorted(_rows("demo_seeds.jsonl"), key=lambda r: r["seed"])
    lines = ["| seed | held-out problems | before | after | change | steps | wall s | threads | machine | "
             "commit | date |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['problems']} | {_pct(r['before'])} | {_pct(r['after'])} | "
              f"{100 * (r['after'] - r['before']):+.1f} pt | {r['steps']} | {r['wall_s']:.0f} | "
              f"{r['threads']} | {r['machine']} | {r['commit']} | {r['date']} |" for r in rows]
    gain = statistics.mean(r["after"] - r["before"] for r in rows)
    return ("\n".join(lines) + f"\n\nMean change {100 * gain:+.1f} points. Seed {rows[0]['seed']} "
            "prints:\n\n"
            f"```\n{format_before_after(rows[0]['eval_before'], rows[0]['eval_after'])}\n```")


def bench_table() -> str:
    """docs/performance.md's equal-work table: each round's s/step and peak RSS per side, and the ratios."""
    rows = _rows("bench_smollm2_equal_micro_batches.jsonl")
    lines = ["| micro-batches (both sides) | round | grpokit s/step | TRL s/step | TRL / grpokit | "
             "grpokit peak RSS MiB | TRL peak RSS MiB | machine | commit | date |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for mb in sorted({r["micro_batch_size"] for r in rows if "compare" in r}, reverse=True):
        sides = [r for r in rows if "side" in r and r.get("micro_batch_size") == mb]
        for k in sorted({r["round"] for r in sides}):
            g = next(r for r in sides if r["round"] == k and r["side"] == "grpokit")
            t = next(r for r in sides if r["round"] == k and r["side"] == "trl")
            lines.append(f"| {mb or 'whole batch'} | {k} | {g['s_per_step']:.2f} | {t['s_per_step']:.2f} | "
                         f"{t['s_per_step'] / g['s_per_step']:.2f} | "
                         f"{g['peak_rss_mib']:.0f} | {t['peak_rss_mib']:.0f} | {g['machine']} | "
                         f"{g['commit']} | {g['date']} |")
    summary = []
    for mb in sorted({r["micro_batch_size"] for r in rows if "compare" in r}, reverse=True):
        c = next(r for r in rows if "compare" in r and r["micro_batch_size"] == mb)["compare"]
        summary.append(f"{'micro-batches of ' + str(mb) if mb else 'whole batches'}: TRL / grpokit s/step "
                       f"{c['ratio_trl_over_grpokit_s_per_step']:.2f} (median of rounds), peak RSS grpokit / "
                       f"TRL {c['rss_grpokit_mib'] / c['rss_trl_mib']:.2f}")
    return "\n".join(lines) + "\n\n" + "; ".join(summary) + "."


def memory_table() -> str:
    """docs/memory.md's table (one row per side, MiB) and the ratios the page quotes."""
    rows = _rows("memory_table.jsonl")
    sides = {r["side"]: r for r in rows}
    r = memory_ratios(sides)
    first = rows[0]
    return (f"{memory_format(sides)}\n\nRatios: grpokit GRPO's peak is {r['grpo_over_trl']:.2f} of TRL's "
            f"whole-batch peak and {r['grpo_over_trl_micro']:.2f} of TRL's micro-batched peak (equal work); "
            f"GRPO saves {100 * r['grpo_saving_vs_ppo']:.1f}% of PPO's peak "
            f"({100 * r['grpo_saving_vs_ppo_over_baseline']:.1f}% above the process baseline). Measured "
            f"{first['date']} on {first['machine']}, commit {first['commit']}: `{first['command']}`.")


def render_memory(text: str) -> str:
    return _block(text, MEMORY_START, MEMORY_END, memory_table()) if MEMORY_START in text else text


def gsm8k_baseline() -> str:
    """docs/real_model.md's GSM8K starting point, from its one raw row."""
    r = _rows("gsm8k_smollm2_baseline.jsonl")[-1]
    return textwrap.fill(
        f"The starting model on the first {int(r['num_problems'])} GSM8K test problems, greedy, "
        f"re-measured {r['date']} into benchmarks/results/gsm8k_smollm2_baseline.jsonl "
        f"(`{r['command']}`, {r['machine']}, {r['threads']} thread, commit {r['commit']}): accuracy "
        f"{_pct(r['accuracy'])}, format rate {_pct(r['format_rate'])}. The runs' own 'before' figures in "
        "the table differ from it and from each other: each run evaluated its start on the code and thread "
        "count of its day, and which change moved them was not separated; read each run's after against "
        "its own before.", width=105)


def render_real_model(text: str) -> str:
    return _block(text, GSM8K_START, GSM8K_END, gsm8k_baseline()) if GSM8K_START in text else text


def render_performance(text: str) -> str:
    return _block(text, BENCH_START, BENCH_END, bench_table())


def render_demo_page(text: str) -> str:
    return _block(text, SEEDS_START, SEEDS_END, demo_seeds())


if __name__ == "__main__":
    page = ROOT / "docs" / "configuration.md"
    page.write_text(render(page.read_text(encoding="utf-8")), encoding="utf-8")
    for name, fn in (("agents.md", render_agents), ("demo.md", render_demo_page),
                     ("performance.md", render_performance), ("memory.md", render_memory),
                     ("real_model.md", render_real_model), ("async.md", render_async),
                     ("search.md", render_tree)):
        doc = ROOT / "docs" / name
        doc.write_text(fn(doc.read_text(encoding="utf-8")), encoding="utf-8")
    for blocks in MEASURED_BLOCKS:
        for name in blocks:
            doc = ROOT / "docs" / name
            doc.write_text(render_measured(name, doc.read_text(encoding="utf-8"), blocks), encoding="utf-8")
    readme = ROOT / "README.md"
    readme.write_text(render_readme(readme.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"updated {page} and {readme}")
