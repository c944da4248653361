"""docs/real_model.md's blocks besides the race (race.py): SmolLM2-135M-Instruct on arithmetic and GSM8K,
each table from the runs' raw rows under benchmarks/results/ (eval and metrics files, `/usr/bin/time -v`)."""

from __future__ import annotations

import statistics

from .race import ARITH, RACE, median_phases, seeds
from .raw import load, max_rss_gib, rows
from .render import Block, Column, Table, Text

BASELINE = "gsm8k_smollm2_baseline.jsonl"
RACE_RUNS = [
    (
        f"arithmetic, seed {seed}, "
        + (
            "beside TRL (one core each, the same hour)"
            if side == "smollm2"
            else "TRL 1.16's GRPOTrainer on the same config, that hour"
        ),
        "60 min on 1 thread", RACE.format(side=side, seed=seed) + "_eval.jsonl",
        RACE.format(side=side, seed=seed) + "_metrics.jsonl",
    )
    for seed in seeds("smollm2")
    for side in ("smollm2", "trl")
]
# (recipe, training budget and threads, eval file, metrics file); GSM8K runs' "before" is the start
# re-measured once into gsm8k_smollm2_baseline.jsonl
SUMMARY = [
    (
        "arithmetic, 200 problems (the shipped config: temperature 1.0, lr 1e-5)", "60 min on 2 threads",
        f"{ARITH}_eval.jsonl", f"{ARITH}_metrics.jsonl",
    ),
    *RACE_RUNS,
    (
        "GSM8K, seed 1, prompt-aware micro-batches", "30 min on 2 threads",
        "gsm8k_smollm2_rule_seed1_30min_eval.json", "gsm8k_smollm2_rule_seed1_30min_metrics.jsonl",
    ),
    (
        "GSM8K, seed 2, beside TRL (one core each)", "30 min on 1 thread",
        "gsm8k_smollm2_rule_seed2_30min_1thread_eval.json",
        "gsm8k_smollm2_rule_seed2_30min_1thread_metrics.jsonl",
    ),
    (
        "GSM8K, seed 0 again, seed 2's protocol (one core each, 2026-12-03 late)", "30 min on 1 thread",
        "gsm8k_smollm2_pass8_500_seed0_30min_1thread_after.json",
        "gsm8k_smollm2_rule_seed0_30min_1thread_s30_metrics.jsonl",
    ),
    (
        "GSM8K, seed 1 again, seed 2's protocol", "30 min on 1 thread",
        "gsm8k_smollm2_pass8_500_seed1_30min_1thread_after.json",
        "gsm8k_smollm2_rule_seed1_30min_1thread_s30_metrics.jsonl",
    ),
    (
        "GSM8K, seed 2, TRL 1.16's GRPOTrainer on the same config", "30 min on 1 thread",
        "gsm8k_trl_seed2_30min_1thread_alone_eval.jsonl", "gsm8k_trl_seed2_30min_1thread_alone_metrics.jsonl",
    ),
    (
        "GSM8K, accuracy reward only (ablation)", "45 min on 2 threads",
        "gsm8k_smollm2_acc_only_seed0_eval.json", "gsm8k_smollm2_acc_only_seed0_metrics.jsonl",
    ),
]


def ends(name: str) -> tuple[dict, dict]:
    """(before, after) evaluations of a run: its own first and last rows, or, for a GSM8K run that kept only
    its final evaluation, the start re-measured into gsm8k_smollm2_baseline.jsonl."""
    evals = rows(name) if name.endswith(".jsonl") else [load(name)]
    if len(evals) > 1 and evals[0].get("tag") == "before":
        return evals[0], evals[-1]
    return rows(BASELINE)[-1], evals[-1]


def _summary_rows() -> list[dict]:
    out = []
    for recipe, budget, evals, metrics in SUMMARY:
        b, a = ends(evals)
        out.append(
            {"recipe": recipe, "budget": budget, "evals": evals, "steps": len(rows(metrics)), "b": b, "a": a}
        )
    return out


SUMMARY_TABLE = Table(
    rows=_summary_rows,
    columns=(
        Column("recipe (seed 0 unless named; greedy held-out)", "{recipe}"),
        Column("training", "{steps} steps, {budget}"),
        Column("accuracy before -> after", "{b[accuracy]:percent} -> {a[accuracy]:percent}"),
        Column("format rate before -> after", "{b[format_rate]:percent} -> {a[format_rate]:percent}"),
        Column("raw rows", "`{evals}`"),
    ),
)

GSM8K_BASELINE = Text(
    "The starting model on the first {num_problems:.0f} GSM8K test problems, greedy, re-measured {date} "
    "into benchmarks/results/gsm8k_smollm2_baseline.jsonl (`{command}`, {machine}, {threads} thread, commit "
    "{commit}): accuracy {accuracy:percent}, format rate {format_rate:percent}. The runs' own 'before' "
    "figures in the table differ from it and from each other: each run evaluated its start on the code and "
    "thread count of its day, and which change moved them was not separated; read each run's after against "
    "its own before.", lambda: rows(BASELINE)[-1], wrap=105,
)


def _curve_columns(found: list[dict]) -> list[Column]:
    evals = rows(f"{ARITH}_eval.jsonl")
    steps = [f"{e['step']}" + (" (the hour's end)" if e is evals[-1] else "") for e in evals]
    return [Column("step", "{label}"), *(Column(s, f"{{cells[{i}]}}") for i, s in enumerate(steps))]


def _curve_rows() -> list[dict]:
    seconds, total = [], 0.0
    for r in rows(f"{ARITH}_metrics.jsonl"):
        total += r.get("time/step", 0.0)
        seconds.append(total)
    evals = rows(f"{ARITH}_eval.jsonl")
    acc = [
        f"**{100 * e['accuracy']:.1f}%**" if e is evals[-1] else f"{100 * e['accuracy']:.1f}%" for e in evals
    ]
    secs = [f"{seconds[e['step'] - 1]:.0f}" if e["step"] else "0" for e in evals]
    return [{"label": "held-out accuracy", "cells": acc}, {"label": "training seconds", "cells": secs}]


ARITH_CURVE = Table(rows=_curve_rows, columns=_curve_columns)

GSM8K_SEEDS = Table(
    rows=lambda: [
        {"seed": seed, "training": training, "evals": evals, "steps": len(rows(metrics)), "a": ends(evals)[1]}
        for seed, training, evals, metrics in (
            (
                1, "30 min, 2 threads", "gsm8k_smollm2_rule_seed1_30min_eval.json",
                "gsm8k_smollm2_rule_seed1_30min_metrics.jsonl",
            ),
            (
                2, "30 min, 1 thread (beside TRL)", "gsm8k_smollm2_rule_seed2_30min_1thread_eval.json",
                "gsm8k_smollm2_rule_seed2_30min_1thread_metrics.jsonl",
            ),
        )
    ],
    columns=(
        Column("seed", "{seed}"), Column("training", "{training}"), Column("steps", "{steps}"),
        Column("accuracy after (500, greedy)", "{a[accuracy]:percent}"),
        Column("format rate after", "{a[format_rate]:percent}"),
        Column("mean length after", "{a[completion_length_mean]:.1f}"), Column("raw rows", "`{evals}`"),
    ),
)


def _vs_trl_rows() -> list[dict]:
    out = [
        {
            "label": "starting model (grpokit's evaluator, `gsm8k_trl_seed1_before_eval.jsonl`)",
            "steps": "-", "secs": "-", "e": rows("gsm8k_trl_seed1_before_eval.jsonl")[0], "rss": "-",
        }
    ]
    for label, tag, evals in (
        (
            "grpokit (the run above)", "gsm8k_smollm2_rule_seed2_30min_1thread",
            "gsm8k_smollm2_rule_seed2_30min_1thread_eval.json",
        ),
        (
            "TRL 1.16 GRPOTrainer (bf16 default)", "gsm8k_trl_seed2_30min_1thread_alone",
            "gsm8k_trl_seed2_30min_1thread_alone_eval.jsonl",
        ),
    ):
        steps = [r["time/step"] for r in rows(f"{tag}_metrics.jsonl")]
        shown = ", ".join(f"{x:.1f}" for x in steps[:3]) + (", ..." if len(steps) > 3 else "")
        out.append(
            {
                "label": label, "steps": len(steps),
                "secs": f"{shown} (median {statistics.median(steps):.1f})", "e": ends(evals)[1],
                "rss": f"{max_rss_gib(f'{tag}_time_v.txt'):.1f} GiB",
            }
        )
    return [
        {
            **r, "right": round(r["e"]["accuracy"] * r["e"]["num_problems"]),
            "cut": 100 * r["e"]["frac_truncated"],
        }
        for r in out
    ]


GSM8K_VS_TRL = Table(
    rows=_vs_trl_rows,
    columns=(
        Column("side (seed 2, 1 thread, 30 training minutes)", "{label}"), Column("steps", "{steps}"),
        Column("s/step", "{secs}"), Column("accuracy after (500, greedy)", "{e[accuracy]:percent} ({right})"),
        Column("format rate after", "{e[format_rate]:percent}"),
        Column("mean length after", "{e[completion_length_mean]:.1f}"), Column("cut at 256", "{cut:.0f}%"),
        Column("peak RSS (`/usr/bin/time -v`)", "{rss}"),
    ),
)


def trained(tag: str) -> dict:
    """A GSM8K run's steps, median s/step and 'right of sampled' (32 completions a step)."""
    m = rows(f"gsm8k_smollm2_{tag}_metrics.jsonl")
    right = round(sum(r["accuracy"] for r in m) * 32)
    return {
        "steps": len(m), "med": statistics.median(r["time/step"] for r in m),
        "right": f"{right} of {32 * len(m)}",
    }


def _sampled(e: dict) -> dict:
    n = e["num_problems"]
    return {
        **e, "n": n, "greedy_right": round(e["accuracy"] * n), "pass8_right": round(e["pass@8"] * n),
        "pass1": 100 * e["pass@1"],
    }


PASSK_COLUMNS = (
    Column("greedy accuracy", "{accuracy:percent} ({greedy_right})"),
    Column("greedy format", "{format_rate:percent}"), Column("greedy length", "{completion_length_mean:.1f}"),
    Column("pass@1 (sampled)", "{pass1:.2f}%"),
    Column("pass@8", "{pass@8:percent} ({pass8_right} of {n:.0f})"),
    Column("sampled format rate", "{sampled_format_rate:percent}"),
    Column("sampled length", "{sampled_completion_length_mean:.0f}"),
)


def passk(which: str) -> Table:
    """pass@8 before and after seed 2's 30 minutes, on the 500 test problems or the first 40."""
    return Table(
        rows=lambda: [
            {**_sampled(load(f"gsm8k_smollm2_pass8_{which}_{tag}.json")), "label": label}
            for label, tag in (
                ("SmolLM2-135M-Instruct (before)", "before"),
                ("seed 2 after 30 minutes (12 steps)", "seed2_after"),
            )
        ],
        columns=(Column("model", "{label}"), *PASSK_COLUMNS),
    )


def _s30_rows() -> list[dict]:
    out = [
        {
            **_sampled(load("gsm8k_smollm2_pass8_500_before.json")), "seed": "starting model", "steps": "-",
            "right": "-",
        }
    ]
    for seed, tag, after in (
        (0, "rule_seed0_30min_1thread_s30", "seed0_30min_1thread_after"),
        (1, "rule_seed1_30min_1thread_s30", "seed1_30min_1thread_after"),
        ("2 (above)", "rule_seed2_30min_1thread", "seed2_after"),
    ):
        t = trained(tag)
        out.append(
            {
                **_sampled(load(f"gsm8k_smollm2_pass8_500_{after}.json")), "seed": seed,
                "steps": f"{t['steps']} ({t['med']:.1f})", "right": t["right"],
            }
        )
    return out


SEEDS_S30 = Table(
    rows=_s30_rows,
    columns=(
        Column("seed", "{seed}"), Column("steps (median s/step)", "{steps}"),
        Column("right samples in training", "{right}"), *PASSK_COLUMNS,
    ),
)


def _ablation(label: str, tag: str) -> dict:
    """One change's run: its training and its greedy evaluation on the first 100 test problems."""
    e = load(f"gsm8k_smollm2_{tag}_eval100.json")
    return {**trained(tag), "label": label, "e": e, "cut": 100 * e["frac_truncated"]}


ABLATIONS = Table(
    rows=lambda: [
        _ablation(label, tag)
        for label, tag in (
            ("shipped (G 8, B 4, 256 tokens, lr 1e-5, full)", "rule_seed2_30min_1thread"),
            ("G 16, B 2", "ablation_g16_seed2_30min_1thread"),
            ("400 new tokens", "ablation_len400_seed2_30min_1thread"),
            ("lr 5e-6", "ablation_lr5e6_seed2_30min_1thread"),
            ("LoRA r 16 on all 7 projections, lr 1e-4", "ablation_lora_seed2_30min_1thread"),
        )
    ],
    columns=(
        Column("run", "{label}"), Column("steps", "{steps}"), Column("median s/step", "{med:.1f}"),
        Column("right samples", "{right}"), Column("acc. (100)", "{e[accuracy]:percent}"),
        Column("format (100)", "{e[format_rate]:percent}"),
        Column("length (100)", "{e[completion_length_mean]:.1f}"), Column("cut", "{cut:.0f}%"),
    ),
)


def _bucket_rows() -> list[dict]:
    sides = [r for r in rows("gsm8k_smollm2_prompt_buckets.jsonl") if "side" in r]
    out = []
    for side, label in (("length", "by total length (before)"), ("prompt", "prompt-aware (now)")):
        rs = sorted((r for r in sides if r["side"] == side), key=lambda r: r["round"])
        out.append(
            {**rs[0], "label": label, "ref": [r["ref_s"] for r in rs], "update": [r["update_s"] for r in rs]}
        )
    return out


PROMPT_BUCKETS = Table(
    rows=_bucket_rows,
    columns=(
        Column("plan", "{label}"), Column("micro-batches", "{micro_batches}"),
        Column("token-slots", "{token_slots:,}"), Column("reference pass (s, rounds 1, 2)", "{ref:.1f|, }"),
        Column("policy update (s, rounds 1, 2)", "{update:.1f|, }"),
    ),
)


def _beside_rows() -> list[dict]:
    out = []
    for label, tag in (
        ("grpokit (bf16 mixed)", "gsm8k_smollm2_rule_seed2_30min_1thread"),
        ("TRL 1.16 GRPOTrainer (its bf16 default)", "gsm8k_trl_seed2_30min_1thread"),
    ):
        m = rows(f"{tag}_metrics.jsonl")
        med = statistics.median(r["time/step"] for r in m)
        out.append(
            {
                "label": label, "steps": len(m), "secs": sum(r["time/step"] for r in m),
                "first": [r["time/step"] for r in m[:2]],
                "median": f"{med:.1f}{median_phases(m)}" if len(m) > 2 else "-",
                "rss": max_rss_gib(f"{tag}_time_v.txt"),
            }
        )
    return out


SEED2_BESIDE_TRL = Table(
    rows=_beside_rows,
    columns=(
        Column("side", "{label}"), Column("steps in the budget", "{steps} logged in {secs:.0f} s"),
        Column("s/step, steps 1 / 2", "{first:.1f}"), Column("median s/step", "{median}"),
        Column("peak RSS (`/usr/bin/time -v`)", "{rss:.1f} GiB"),
    ),
)


def _block(name: str, part: Table | Text) -> Block:
    return Block("docs/real_model.md", name, (part,))


BLOCKS = [
    _block("real-summary", SUMMARY_TABLE), _block("gsm8k-baseline", GSM8K_BASELINE),
    _block("real-arith-curve", ARITH_CURVE), _block("real-prompt-buckets", PROMPT_BUCKETS),
    _block("real-seed2-beside-trl", SEED2_BESIDE_TRL), _block("real-gsm8k-vs-trl", GSM8K_VS_TRL),
    _block("real-ablations", ABLATIONS), _block("real-pass8-500", passk("500")),
    _block("real-pass8-40", passk("first40")), _block("real-seeds-s30", SEEDS_S30),
    _block("real-gsm8k-seeds", GSM8K_SEEDS),
]
