"""docs/performance.md's blocks of what each speed-up pays (benchmarks/fast_gains.py), natural lengths,
SmolLM2's gains and the shared prompt cache."""

from __future__ import annotations

import statistics

from .performance import PHASES
from .raw import load, rows
from .render import Block, Column, Table, fill

VARIANTS = [
    ("all of them (`switch.plain()`)", "plain", {}, ""),
    ("decode kernels (`native`)", "decode_kernels", {}, "kept"),
    ("whole step in one C call (`whole_step`)", "whole_step", {"small": " (not used)"}, "kept"),
    ("activation reuse (`reuse`)", "reuse", {"demo": " (off: < 5M)", "tiny": " (off)"}, "kept"),
    ("glibc keeps freed memory", "keep_memory", {}, "kept"),
    (
        "grouped K/V with a mask", "gqa", {},
        "kept for memory (no `repeat_kv` copies saved for backward); 15 lines",
    ),
    ("C attention forward + backward", "attention", {}, "**removed**"),
    ("fused SiLU x up + RMSNorm in C", "fused_ops", {}, "kept for memory (below)"),
    ("the same two ops by `torch.compile` instead of C", "fused_compile", {}, "not adopted"),
]
GAIN_CONFIGS = (("demo", "demo"), ("tiny", "tiny/64"), ("tiny:256", "tiny/256"), ("small", "small/64 (fp32)"))


def _gain_rows() -> list[dict]:
    results = {
        **load("fast_gains_with_training_kernels.json")["results"],
        **load("fast_gains_with_training_kernels_tiny256.json")["results"],
    }
    out = []
    for label, key, notes, decision in VARIANTS:
        cells = []
        for config, _ in GAIN_CONFIGS:
            r = results[config].get(key)
            warm = fill(", +{first_step_extra_s:.1f} s", r) if r and key == "fused_compile" else ""
            cells.append(fill("{gain:ratio}", r) + warm + notes.get(config, "") if r else "")
        out.append({"label": label, "decision": decision, "cells": cells})
    return out


FAST_GAINS = Table(
    rows=_gain_rows,
    columns=(
        Column("speed-up off", "{label}"),
        *(Column(title, f"{{cells[{i}]}}") for i, (_, title) in enumerate(GAIN_CONFIGS)),
        Column("decision", "{decision}"),
    ),
)


def _length_rows() -> list[dict]:
    out = []
    for label, name in (
        ("fixed 128", "small_128_fixed-length.jsonl"),
        ("spread, limit 128 (mean 32)", "small_128_spread-lengths.jsonl"),
        ("fixed 34 (the same tokens)", "small_34_fixed-length.jsonl"),
    ):
        runs = [r for r in rows(name) if "side" in r]
        out.append(
            {
                "label": label, "name": name, "tokens": runs[0]["completion_tokens"],
                "s": statistics.mean(r["s_per_step"] for r in runs), "each": [r["s_per_step"] for r in runs],
                **{p: statistics.mean(r["phases_s"][p] for r in runs) for p, _ in PHASES[:3]},
                "rss": max(r["peak_rss_mib"] for r in runs),
            }
        )
    return out


def _length_figures(found: list[dict]) -> dict:
    # the shares of the rounded figures the table prints
    tokens = [float(f"{r['tokens']:.0f}") for r in found]
    secs = [float(f"{r['s']:.2f}") for r in found]
    return {
        "tokens": 100 * tokens[1] / tokens[0], "spread": 100 * secs[1] / secs[0],
        "fixed": 100 * secs[2] / secs[0],
    }


NATURAL_LENGTHS = Table(
    rows=_length_rows,
    columns=(
        Column("run", "{label}"), Column("completion tokens", "{tokens:.0f}"),
        Column("s/step (two runs)", "{s:.2f} ({each:.2f|, })"), Column("generate", "{generate:.2f}"),
        Column("ref forward", "{ref_forward:.2f}"), Column("policy fwd+bwd", "{policy_fwd_bwd:.2f}"),
        Column("peak RSS MiB", "{rss:.0f}"), Column("raw lines", "`{name}`"),
    ),
    note="With {tokens:.0f}% of the fixed-128 batch's tokens, the spread batch costs {spread:.0f}% of its "
         "time; "
    "the fixed-34 batch, the same tokens without the spread, {fixed:.0f}%.", figures=_length_figures,
)

SMOLLM2_GAINS = [  # (what was switched off, raw file, its variant key)
    (
        "the training passes' attention through SDPA instead of `fast.small_attention`",
        "fast_gains_smollm2_small_attention.json", "small_attention",
    ),
    (
        "`fast.master_grads`, its first form (embedding rows only)", "fast_gains_smollm2_embedding_rows.json",
        "embedding_rows",
    ),
    (
        "`fast.master_grads` (embedding rows and the bf16 head)", "fast_gains_smollm2_master_grads.json",
        "master_grads",
    ),
    (
        "the same in-place add for every linear layer too (taken out)",
        "fast_gains_smollm2_master_grads_with_linears.json", "master_grads",
    ),
]


def _smollm2_gain_rows() -> list[dict]:
    out = []
    for label, name, key in SMOLLM2_GAINS:
        d = load(name)
        r = d["results"]["smollm2"]
        out.append(
            {
                "label": label, "name": name, "steps": d["steps"], "on": r["all"]["s_per_step"],
                "off": r[key]["s_per_step"], "gain": r[key]["gain"],
            }
        )
    return out


SMOLLM2_GAIN_TABLE = Table(
    rows=_smollm2_gain_rows,
    columns=(
        Column("switched off", "{label}"), Column("interleaved steps", "{steps}"),
        Column("all on s/step", "{on:.2f}"), Column("off s/step", "{off:.2f}"),
        Column("cost when off", "**{gain:ratio}**"), Column("raw file", "`{name}`"),
    ),
)


def _cache_rows() -> list[dict]:
    out = []
    for name in ("prompt_cache_gsm8k_smollm2_4x8.jsonl", "prompt_cache_gsm8k_smollm2_16x8.jsonl"):
        runs = rows(name)
        sides = {s: [r["seconds"] for r in runs if r.get("side") == s] for s in ("shared", "copied")}
        first = next(r for r in runs if r.get("side") == "shared")
        out.append({**first, **sides, "name": name, "summary": runs[-1]})
    return out


PROMPT_CACHE = Table(
    rows=_cache_rows,
    columns=(
        Column("batch (x 256 new tokens)", "{rows} rows, prompts of {prompt_tokens} tokens"),
        Column("shared s (rounds)", "{shared:.1f}"), Column("copied s (rounds)", "{copied:.1f}"),
        Column("copied / shared", "**{summary[copied_over_shared]:ratio}**"),
        Column(
            "KV cache MiB shared / copied",
            "{summary[kv_cache_mib][shared]} / {summary[kv_cache_mib][copied]}",
        ),
        Column("precision", "{precision}, {threads} threads"), Column("raw lines", "`{name}`"),
    ),
)


def _block(name: str, table: Table) -> Block:
    return Block("docs/performance.md", name, (table,))


BLOCKS = [
    _block("perf-fast-gains", FAST_GAINS), _block("perf-natural-lengths", NATURAL_LENGTHS),
    _block("perf-smollm2-gains", SMOLLM2_GAIN_TABLE), _block("perf-prompt-cache", PROMPT_CACHE),
]
