"""docs/memory.md's long-completions block: grpokit's update and TRL 1.16's on SmolLM2 batches of 4 x 8
completions of one fixed length, per length, and the fitted bytes per completion token
(benchmarks/ragged_update.py --fixed-length --lengths; benchmarks/results/long_update.jsonl)."""

from __future__ import annotations

import statistics

from .raw import newest_group, rows
from .render import Block, Column, Table

LONG = "long_update.jsonl"


def _group() -> list[dict]:
    found = rows(LONG)
    return newest_group(found, ("commit",))


def _runs(side: str, length: int) -> list[dict]:
    """The side's rows at `length`: each run's row follows its length's sample row."""
    out, current = [], None
    for r in _group():
        if r.get("what") == "sample":
            current = r["max_length"]
        elif r.get("side") == side and current == length and "summary" not in r:
            out.append(r)
    return out


def _lengths() -> list[int]:
    return sorted({r["max_length"] for r in _group() if r.get("what") == "sample"})


def _cell(runs: list[dict], key: str, fmt: str) -> str:
    done = [r[key] for r in runs if key in r]
    if not done:
        return next((r["failed"] for r in runs if "failed" in r), "not run")
    each = ", ".join(format(x, fmt) for x in done)
    return f"{format(statistics.median(done), fmt)} ({each})"


def _rows() -> list[dict]:
    out = []
    for length in _lengths():
        mine, trl = _runs("padded", length), _runs("trl", length)
        row = {"length": length, "tokens": f"{32 * length:,}", "time": _cell(mine, "train_s", ".1f"),
               "peak": _cell(mine, "step_peak_mib", ".0f"), "trl_time": _cell(trl, "train_s", ".1f"),
               "trl_peak": _cell(trl, "step_peak_mib", ".0f"), "time_ratio": "-", "peak_ratio": "-"}
        if any("train_s" in r for r in trl) and mine:
            t = statistics.median(r["train_s"] for r in trl if "train_s" in r)
            p = statistics.median(r["step_peak_mib"] for r in trl if "step_peak_mib" in r)
            row["time_ratio"] = f"{t / statistics.median(r['train_s'] for r in mine):.2f}x"
            row["peak_ratio"] = f"{statistics.median(r['step_peak_mib'] for r in mine) / p:.2f}"
        out.append(row)
    return out


def _figures(_rows: list[dict]) -> dict:
    group = _group()
    fits = [r for r in group if r.get("what") == "fit" and "padded" in r["fit"]
            and len(r["fit"]["padded"]["tokens"]) >= 2]
    fit = fits[-1]["fit"]["padded"]
    sample = next(r for r in group if r.get("what") == "sample")
    commands = sorted({r["command"].split(" --record")[0] for r in group if r.get("what") == "fit"})
    return {"bytes_per_token": fit["bytes_per_token"], "intercept": fit["intercept_mib"],
            "residual": fit["max_residual_mib"],
            "fit_lengths": ", ".join(str(t // 32) for t in fit["tokens"]),
            "commands": "; ".join(f"`{c}`" for c in commands), "commit": group[-1]["commit"],
            "cpu": group[-1]["cpu"], "date": group[-1]["date"], "prompt": sample["prompt_tokens_mean"]}


TABLE = Table(
    rows=_rows,
    columns=(Column("completion tokens each", "{length}"), Column("batch completion tokens", "{tokens}"),
             Column("grpokit train s/step (runs)", "{time}"), Column("grpokit step peak RSS, MiB", "{peak}"),
             Column("TRL 1.16 train s/step", "{trl_time}"), Column("TRL step peak RSS, MiB", "{trl_peak}"),
             Column("TRL time over grpokit's", "{time_ratio}"),
             Column("grpokit peak over TRL's", "{peak_ratio}")),
    note="{commands}, at commit {commit} ({cpu}, 2 cores, {date}). Every row of the batch is one of the "
         "recipe's 4 GSM8K two-shot chat prompts ({prompt:.0f} tokens on average; "
         "`configs/smollm2_gsm8k_cpu.yaml`) followed by exactly that many random non-special token ids "
         "(no sampling: this measures the update), rewards random, advantages by group. "
         "SmolLM2-135M-Instruct in bf16 mixed precision, beta 0.04, micro-batches of 8 rows on both sides, "
         "2 steps per run in its own process (the first left out), TRL through a `rollout_func` returning "
         "the same tokens. Train s: "
         "the reference pass, the policy's forward and backward and AdamW. Step peak: the resident peak "
         "from the first step on (VmHWM reset after loading). grpokit's peak over the batch's completion "
         "tokens, least squares over {fit_lengths} tokens per row: **{bytes_per_token:,.0f} bytes per "
         "completion token** above {intercept:.0f} MiB (largest residual {residual:.0f} MiB). Raw rows: "
         "`benchmarks/results/long_update.jsonl`.",
    figures=_figures,
)

BLOCKS = [Block("docs/memory.md", "long-completions", (TABLE,))]
