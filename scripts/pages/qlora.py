"""docs/memory.md's QLoRA blocks: the recipe measured as QLoRA / LoRA / full training
(benchmarks/results/qlora_recipe.jsonl, `grpokit bench --memory --config`), the QLoRA hour on SmolLM2
(qlora_smollm2_arith_1thread_60min_*), and the GPU memory computed from those parts
(grpokit.model.memory_estimate)."""

from __future__ import annotations

import statistics

from grpokit.model.memory_estimate import ARCHS, CUDA_CONTEXT_MIB, Measured, estimate_mib

from . import race
from .raw import last_benchmark, rows
from .render import Block, Column, Table

RECIPE = "qlora_recipe.jsonl"
HOUR = "qlora_smollm2_arith_1thread_60min_seed0"
SIDES = {"qlora": "QLoRA: 4-bit NF4 base, LoRA r 16", "lora-bf16": "bf16 LoRA: bfloat16 base, LoRA r 16",
         "lora": "LoRA r 16, float32 base, bf16 matmuls",
         "full": "full training, float32 masters, bf16 matmuls"}


def _recipe_rows() -> list[dict]:
    runs, _ = last_benchmark(RECIPE)
    out = []
    for side, label in SIDES.items():
        mine = [r for r in runs if r["side"] == side]
        med = {k: statistics.median(r[k] for r in mine) for k in ("load_peak_mib", "step_peak_mib",
                                                                     "s_per_step", "weights_mib")}
        out.append({"side": label, "runs": len(mine), **mine[0], **med,
                    "s_all": [r["s_per_step"] for r in mine], "peaks": [r["step_peak_mib"] for r in mine]})
    full = out[-1]
    for r in out:
        r["peak_ratio"], r["time_ratio"] = r["step_peak_mib"] / full["step_peak_mib"], \
            r["s_per_step"] / full["s_per_step"]
    return out


RECIPE_TABLE = Table(
    rows=_recipe_rows,
    columns=(Column("side", "{side}"), Column("step peak RSS", "{step_peak_mib:.0f} MiB ({peaks:.0f})"),
             Column("of full", "{peak_ratio:.2f}"), Column("load peak", "{load_peak_mib:.0f} MiB"),
             Column("weights held", "{weights_mib:.0f} MiB"), Column("trainable", "{trainable_params:,}"),
             Column("AdamW state", "{optimizer_state_mib:.1f} MiB"),
             Column("s/step", "{s_per_step:.2f} ({s_all:.2f})"), Column("of full", "{time_ratio:.2f}")),
    note="`{command}` at commit {commit} ({machine}, {date}): each side {runs} runs of {steps} steps, in its "
         "own process, the order qlora, lora-bf16, lora, full, then reversed; the medians, every run in "
         "brackets. Every LoRA side trains float32 adapters with float32 AdamW state. "
         "The other core ran the QLoRA hour below. Step peak: the resident peak from the first step to the "
         "last (VmHWM reset after loading), over a process baseline of {baseline_mib:.0f} MiB; the load "
         "peak includes writing the GGUF model out once and reading it back quantized. Raw rows: "
         "`benchmarks/results/qlora_recipe.jsonl`.",
    figures=lambda got: got[0],
)


def _eval(name: str) -> dict[str, dict]:
    return {r["tag"]: r for r in rows(f"{name}_eval.jsonl")}


def _hour_row(name: str, side: str, seed: int) -> dict:
    steps, ev = rows(f"{name}_metrics.jsonl"), _eval(name)
    return {"side": SIDES[side], "seed": seed, "before": ev["before"]["accuracy"],
            "after": ev["after"]["accuracy"], "steps": len(steps),
            "s_per_step": statistics.median(r["time/step"] for r in steps),
            "peak": max(r["peak_rss_mib"] for r in steps)}


def _hour_rows() -> list[dict]:
    """The QLoRA hour, then grpokit's full-training hours of the arithmetic race (one per seed)."""
    full = [_hour_row(race.RACE.format(side="smollm2", seed=seed), "full", seed)
            for seed in race.seeds("smollm2")]
    return [_hour_row(HOUR, "qlora", 0)] + full


HOUR_TABLE = Table(
    rows=_hour_rows,
    columns=(Column("run (60 training minutes, one thread)", "{side}"), Column("seed", "{seed}"),
             Column("greedy held-out accuracy before", "{before:percent}"),
             Column("after", "{after:percent}"), Column("steps", "{steps}"),
             Column("median s/step", "{s_per_step:.1f}"), Column("peak RSS", "{peak:.0f} MiB")),
    note="QLoRA: `{command}` at commit {commit} ({machine}, {date}), the other core running the recipe "
         "bench above and other work. Full training: grpokit's side of the arithmetic race in "
         "[real_model.md](real_model.md) (`configs/smollm2_arith_cpu.yaml`, seeds 0 and 1 on 2026-12-03, "
         "seed 2 on 2026-12-05, the other core running TRL), on other days and machines, so s/step is not "
         "comparable across these rows; the bench above is. "
         "Before is the 4-bit model's own score: quantizing SmolLM2-135M to NF4 costs "
         "{drop:points} of greedy accuracy before any training. Peak RSS: the run's whole-process peak, "
         "evaluations and loading included. Raw rows: `benchmarks/results/{hour}_*.jsonl`.",
    figures=lambda got: {**rows(f"{HOUR}_run.jsonl")[0], "hour": HOUR,
                         "drop": got[0]["before"] - got[1]["before"]},
)

GPU_RUNS = (("Qwen2.5-1.5B-Instruct", 4, True), ("Qwen2.5-1.5B-Instruct", 8, True),
            ("Qwen2.5-3B-Instruct", 4, True), ("Qwen2.5-7B-Instruct", 4, True),
            ("Qwen2.5-1.5B-Instruct", 4, False))
WIDTH, ROWS, RANK = 512, 32, 16   # configs/qlora_qwen2.5-1.5b_gsm8k_gpu.yaml: 256 + 256 tokens, B 4 x G 8


def _measured() -> tuple[Measured, dict]:
    runs, _ = last_benchmark(RECIPE)
    row = [r for r in runs if r["side"] == "qlora"][0]
    return Measured.from_row(row, ARCHS["SmolLM2-135M-Instruct"], micro_batch=8), row


def _gpu_rows() -> list[dict]:
    measured, _ = _measured()
    out = []
    for name, mb, ckpt in GPU_RUNS:
        est = estimate_mib(ARCHS[name], measured, r=RANK, micro_batch=mb, width=WIDTH, rows=ROWS,
                           checkpointing=ckpt)
        gib = est["peak"] / 1024
        out.append({"model": name, "mb": mb, "ckpt": "on" if ckpt else "off", **est, "gib": gib,
                    "fits": ", ".join(f"{c} GB" for c in (12, 24) if est["peak"] * 2**20 <= c * 1e9 * 0.95)
                    or "neither"})
    return out


GPU_TABLE = Table(
    rows=_gpu_rows,
    columns=(Column("model", "{model}"), Column("micro-batch", "{mb}"), Column("checkpointing", "{ckpt}"),
             Column("4-bit linears", "{quantized_linears:.0f}"),
             Column("other weights", "{other_weights:.0f}"),
             Column("adapters + AdamW", "{adapters:.0f}"), Column("activations", "{activations:.0f}"),
             Column("logits", "{logits:.0f}"), Column("KV cache", "{kv_cache:.0f}"),
             Column("computed peak", "**{gib:.1f} GiB**"), Column("fits", "{fits}")),
    note="Computed, not measured (MiB; no GPU ran these): `grpokit.model.memory_estimate` with the unit "
         "costs of the first qlora run above, {q:.3f} bytes per 4-bit weight with its scales and "
         "{a:.1f} bytes of activations per token, per unit of hidden size, per layer (the CPU run's step "
         "peak less its baseline, weights, gradients, AdamW state and logits, over its {mb} x {width} "
         "tokens), plus {ctx:.0f} MiB of CUDA context, assumed. The recipe is "
         "`configs/qlora_qwen2.5-1.5b_gsm8k_gpu.yaml` (G 8, B 4, 256 prompt + 256 completion tokens, LoRA "
         "r 16 on all projections). Fits: the peak within 95% of the card. The CPU's activations include "
         "allocator slack and float32 temporaries, so these lean high.",
    figures=lambda _: {"q": _measured()[0].bytes_per_quantized_weight, "a": _measured()[0].activation_bytes,
                       "mb": 8, "width": _measured()[1]["sequence_width"], "ctx": CUDA_CONTEXT_MIB},
)

BLOCKS = [Block("docs/memory.md", "qlora-recipe", (RECIPE_TABLE,)),
          Block("docs/memory.md", "qlora-hour", (HOUR_TABLE,)),
          Block("docs/memory.md", "qlora-gpu", (GPU_TABLE,))]
