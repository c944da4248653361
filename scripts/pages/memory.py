"""docs/memory.md's blocks: the peak-memory table (`grpokit membench`'s own table of the raw rows) with its
ratios, and the chapter's memory claim against it; from benchmarks/results/memory_table.jsonl."""

from __future__ import annotations

from grpokit.cli.membench import compare, format_table

from .raw import rows
from .render import Block, Column, Table, Text


def _sides() -> dict[str, dict]:
    return {r["side"]: r for r in rows("memory_table.jsonl")}


def _table_figures() -> dict:
    sides = _sides()
    return {**compare(sides), **rows("memory_table.jsonl")[0], "table": format_table(sides)}


TABLE = Text(
    "{table}\n\nRatios: grpokit GRPO's peak is {grpo_over_trl:.2f} of TRL's whole-batch peak and "
    "{grpo_over_trl_micro:.2f} of TRL's micro-batched peak (equal work); GRPO saves "
    "{grpo_saving_vs_ppo:percent} of PPO's peak ({grpo_saving_vs_ppo_over_baseline:percent} above the "
    "process baseline). Measured {date} on {machine}, commit {commit}: `{command}`.", _table_figures,
)


def _claim_rows() -> list[dict]:
    grpo, ppo = _sides()["grpo"], _sides()["ppo"]
    base = grpo["baseline_mib"]
    saving = 1 - grpo["peak_mib"] / ppo["peak_mib"]
    above = 1 - (grpo["peak_mib"] - base) / (ppo["peak_mib"] - ppo["baseline_mib"])
    return [
        {"what": "PPO with critic, peak", "claimed": "100%", "here": f"{ppo['peak_mib']:.0f} MiB"},
        {
            "what": "GRPO, peak", "claimed": "60-70%",
            "here": f"{grpo['peak_mib']:.0f} MiB = {100 * grpo['peak_mib'] / ppo['peak_mib']:.1f}%",
        },
        {
            "what": "memory GRPO saves", "claimed": "30-40%",
            "here": f"**{100 * saving:.1f}%** of the peak ({100 * above:.1f}% of the peak above the "
            f"{base:.0f} MiB "
            "process baseline)",
        },
    ]


def _claim_figures(_: list[dict]) -> dict:
    grpo, ppo = _sides()["grpo"], _sides()["ppo"]
    return {**grpo, "extra": ppo["activations_and_rest_mib"] - grpo["activations_and_rest_mib"]}


CLAIMS = Table(
    rows=_claim_rows,
    columns=(
        Column("", "{what}"), Column("claimed (DeepSeekMath write-ups)", "{claimed}"),
        Column("measured here (CPU, fp32, this model and batch)", "{here}"),
    ),
    note="The critic's activations: {extra:.0f} MiB more in the last column of the table above ({date}, "
         "commit "
    "{commit}, `benchmarks/results/memory_table.jsonl`).", figures=_claim_figures,
)

BLOCKS = [
    Block("docs/memory.md", "memory-table", (TABLE,)), Block("docs/memory.md", "memory-claims", (CLAIMS,)),
]
