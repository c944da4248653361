"""docs/performance.md's blocks and the README's equal-work row: `grpokit bench --compare-trl` runs (each
file: the sides' rows, alternated, then the run's compare row), the C passes' history and the short
memory table (what each speed-up pays, natural lengths and the prompt cache: scripts/pages/gains.py)."""

from __future__ import annotations

import statistics

from .raw import bench_run, rows
from .render import Block, Column, Table, fill, headline_row

PHASES = (
    ("generate", "generate"), ("ref_forward", "ref forward"), ("policy_fwd_bwd", "policy fwd+bwd"),
    ("optimizer", "optimizer"),
)
EQUAL = "bench_smollm2_equal_micro_batches.jsonl"


def short_s(x: float) -> str:
    """Seconds as the bench tables print them: 3 decimals below 10 s, 2 above."""
    return f"{x:.3f}" if x < 10 else f"{x:.2f}"


# ---- the equal-work comparison (docs/performance.md's first table, the README's row)


def _compares() -> list[dict]:
    """The equal-work file's compare rows, largest micro-batch first (0: whole batches)."""
    found = rows(EQUAL)
    out = []
    for mb in sorted({r["micro_batch_size"] for r in found if "compare" in r}, reverse=True):
        c = next(r for r in found if "compare" in r and r["micro_batch_size"] == mb)["compare"]
        out.append(
            {
                "mb": mb, "setting": f"micro-batches of {mb}" if mb else "whole batches",
                "speed": c["ratio_trl_over_grpokit_s_per_step"],
                "memory": c["rss_grpokit_mib"] / c["rss_trl_mib"],
            }
        )
    return out


def _equal_rounds() -> list[dict]:
    found = rows(EQUAL)
    out = []
    for c in _compares():
        sides = [r for r in found if "side" in r and r.get("micro_batch_size") == c["mb"]]
        for k in sorted({r["round"] for r in sides}):
            g = next(r for r in sides if r["round"] == k and r["side"] == "grpokit")
            t = next(r for r in sides if r["round"] == k and r["side"] == "trl")
            out.append(
                {
                    **g, "mb": c["mb"] or "whole batch", "g": g["s_per_step"], "t": t["s_per_step"],
                    "ratio": t["s_per_step"] / g["s_per_step"], "rss_g": g["peak_rss_mib"],
                    "rss_t": t["peak_rss_mib"],
                }
            )
    return out


EQUAL_TABLE = Table(
    rows=_equal_rounds,
    columns=(
        Column("micro-batches (both sides)", "{mb}"), Column("round", "{round}"),
        Column("grpokit s/step", "{g:.2f}"), Column("TRL s/step", "{t:.2f}"),
        Column("TRL / grpokit", "{ratio:.2f}"), Column("grpokit peak RSS MiB", "{rss_g:.0f}"),
        Column("TRL peak RSS MiB", "{rss_t:.0f}"), Column("machine", "{machine}"),
        Column("commit", "{commit}"), Column("date", "{date}"),
    ),
    note="{summary}.",
    figures=lambda _: {
        "summary": "; ".join(
            fill(
                "{setting}: TRL / grpokit s/step {speed:.2f} (median of rounds), peak RSS grpokit / TRL "
                "{memory:.2f}", c,
            )
            for c in _compares()
        )
    },
)


def headline() -> list[dict]:
    parts = "; ".join(
        fill("{setting}: {speed:.2f}x faster, peak RSS {memory:.2f} of TRL's", c) for c in _compares()
    )
    return [
        headline_row(
            "one step against TRL 1.16 at equal work (SmolLM2 bf16, 4 x 8 x 64 tokens, the same "
            "micro-batches on both sides, one thread)", "{parts}", "performance", "performance.md", EQUAL,
            parts=parts,
        )
    ]


# ---- the tiny / small / SmolLM2 comparisons, run by run


def _target(c: dict, at_least: float | None) -> str:
    if at_least is None:
        return ""
    ratio, under = c["ratio_trl_over_grpokit_s_per_step"], sum(x < at_least for x in c["ratios_per_round"])
    out = f">= {at_least}: {'met' if ratio >= at_least else 'missed'}"
    if ratio >= at_least and under:
        out += f" ({'one round' if under == 1 else f'{under} rounds'} under)"
    return out


def history(spec: list[tuple]) -> Table:
    """One row per (label, file, run, target ratio) of the tiny / small comparisons."""

    def found() -> list[dict]:
        out = []
        for label, name, run, at_least in spec:
            c = bench_run(name, run)[2]
            out.append(
                {
                    **c, "label": label, "name": name, "g": short_s(c["grpokit_s_per_step"]),
                    "t": short_s(c["trl_s_per_step"]), "target": _target(c, at_least),
                }
            )
        return out

    return Table(
        rows=found,
        columns=(
            Column("config", "{label}"), Column("grpokit s/step", "{g}"), Column("TRL s/step", "{t}"),
            Column(
                "TRL / grpokit (per round)",
                "**{ratio_trl_over_grpokit_s_per_step:.2f}** ({ratios_per_round:.2f|, })",
            ),
            Column("target", "{target}"),
            Column("peak RSS grpokit / TRL (MiB)", "{rss_grpokit_mib:.0f} / {rss_trl_mib:.0f}"),
            Column("raw lines", "`{name}`"),
        ),
    )


def _phase_cell(g: list[dict], t: list[dict], phase: str) -> str:
    """Mean seconds of a phase, grpokit / TRL, each with its fraction of its run's matmul peak."""

    def mean(sides: list[dict]) -> tuple[float, float | None]:
        fracs = [s.get("phase_peak_fraction", {}).get(phase) for s in sides]
        return (
            statistics.mean(s["phases_s"][phase] for s in sides),
            statistics.mean(fracs) if None not in fracs else None,
        )

    (gs, gf), (ts, tf) = mean(g), mean(t)
    if gf is None or tf is None:
        return f"{gs:.3f} / {ts:.3f}"
    return f"{short_s(gs)} ({gf:.2f}) / {short_s(ts)} ({tf:.2f})"


def phases(spec: list[tuple]) -> Table:
    """Seconds per step by phase (mean over the rounds), grpokit / TRL, for (label, file, run, _) runs."""

    def found() -> list[dict]:
        out = []
        for label, name, run, *_ in spec:
            g, t, _ = bench_run(name, run)
            out.append({"label": label, **{p: _phase_cell(g, t, p) for p, _ in PHASES}})
        return out

    return Table(
        rows=found,
        columns=(Column("config", "{label}"), *(Column(title, "{" + p + "}") for p, title in PHASES)),
    )


def smollm2(spec: list[tuple[str, str]]) -> Table:
    """SmolLM2-135M against TRL: per (label, file) both sides' s/step by round, the ratio and peak RSS."""

    def found() -> list[dict]:
        out = []
        for label, name in spec:
            g, t, c = bench_run(name)
            out.append(
                {
                    **c, "label": label, "name": name, "g": [r["s_per_step"] for r in g],
                    "t": [r["s_per_step"] for r in t], "rss": c["rss_grpokit_mib"] / c["rss_trl_mib"],
                }
            )
        return out

    return Table(
        rows=found,
        columns=(
            Column("run", "{label}"), Column("grpokit s/step (round 1, 2)", "{g:.2f|, }"),
            Column("TRL s/step (round 1, 2)", "{t:.2f|, }"),
            Column(
                "TRL / grpokit (median of rounds; per round)",
                "**{ratio_trl_over_grpokit_s_per_step:.2f}x** ({ratios_per_round:.2f|, })",
            ),
            Column("peak RSS grpokit / TRL (MiB)", "{rss_grpokit_mib:.0f} / {rss_trl_mib:.0f}"),
            Column("RSS ratio", "{rss:.3f}"), Column("raw lines", "`{name}`"),
        ),
    )


MB8 = "TRL at its default whole batch per pass"
SUMMARY = [
    (
        f"bf16, `--micro-batch-size 8` ({MB8}), with `SiluMulDown` and the head's sliced gradient add "
        "(2026-12-03, later)", "smollm2_64_fixed_s27_best_mb8_vs_trl_default.jsonl",
    ),
    (
        "bf16, `--micro-batch-size 8`, with `fast.master_grads` (2026-12-03; this machine's bf16 peak half "
        "of 12-02's)", "smollm2_64_fixed_s26_best_mb8_vs_trl_default.jsonl",
    ),
    (
        "bf16, `--micro-batch-size 8`, with the lm-head blocks and small attention (2026-12-02, later)",
        "smollm2_64_fixed_s25_best_mb8_vs_trl_default_run2.jsonl",
    ),
    (
        "fp32 against TRL fp32, `--micro-batch-size 8`, the same code",
        "smollm2_64_fixed_s25_fp32_mb8_vs_fp32.jsonl",
    ),
    (
        "fp32 against TRL fp32, `--micro-batch-size 8`, 2026-12-03",
        "smollm2_64_fixed_s26_fp32_mb8_vs_fp32.jsonl",
    ),
    (
        "bf16, whole batch per pass on both sides (2026-12-02)",
        "smollm2_64_fixed_s24_best_vs_trl_default.jsonl",
    ),
    ("bf16, `--micro-batch-size 8` (2026-12-02)", "smollm2_64_fixed_s24_best_mb8_vs_trl_default.jsonl"),
    (
        "fp32 against TRL fp32 (`--precision fp32 --trl-precision fp32`, whole batches, 2026-12-02)",
        "smollm2_64_fixed_s24_fp32_vs_fp32.jsonl",
    ),
]
T, S = 2.5, 1.3  # the targets for TRL / grpokit: tiny, small
C_PASSES = [
    ("tiny, 64", "tiny_64_fixed_fused.jsonl", 0, T), ("tiny, 256, run 1", "tiny_256_fixed_fused.jsonl", 0, T),
    ("tiny, 256, run 2", "tiny_256_fixed_fused_run2.jsonl", 0, T),
    ("small, 64 (`--rounds 2`)", "small_64_fixed_fused_gated.jsonl", 0, S),
    ("small, 256 (`--rounds 2 --steps 3`)", "small_256_fixed_fused_gated.jsonl", 0, S),
    ("small, 256, before `GatedSiluMul` (RSS above TRL's)", "small_256_fixed_fused.jsonl", 0, None),
]
PANELS = [
    ("tiny, 64, run 1", "tiny_64_fixed_attn.jsonl", 0, T),
    ("tiny, 64, run 2", "tiny_64_fixed_attn2.jsonl", 0, T),
    ("tiny, 256, run 1", "tiny_256_fixed_attn.jsonl", 0, T),
    ("tiny, 256, run 2", "tiny_256_fixed_attn2.jsonl", 0, T),
    ("small, 64 (`--rounds 2`)", "small_64_fixed_attn.jsonl", 0, S),
    ("small, 256 (`--rounds 2 --steps 3`)", "small_256_fixed_attn.jsonl", 0, S),
    ("tiny, 64, before the attention forward", "tiny_64_fixed_panels.jsonl", 0, None),
    ("tiny, 256, before the attention forward", "tiny_256_fixed_panels.jsonl", 0, None),
]
SPLIT = [
    ("tiny, 64", "tiny_64_fixed_split.jsonl", 0, T),
    ("tiny, 256 (4 rounds)", "tiny_256_fixed_split_rounds4.jsonl", 0, T),
    ("tiny, 256 (2 rounds)", "tiny_256_fixed_split.jsonl", 0, T),
]
NATIVE = [
    ("tiny, 64", "tiny_64_fixed_native.jsonl", 0, T), ("tiny, 256", "tiny_256_fixed_native.jsonl", 0, T),
    ("small, 64", "small_64_fixed_native.jsonl", 0, S), ("small, 256", "small_256_fixed_native.jsonl", 0, S),
]
BEFORE = [
    ("tiny, 64", "tiny_64_fixed.jsonl", 0, T), ("tiny, 256", "tiny_256_fixed.jsonl", 0, T),
    ("small, 64", "small_64_fixed_rounds4.jsonl", 0, S), ("small, 256", "small_256_fixed.jsonl", 0, S),
]


# ---- the short memory table (docs/memory.md has the full one)

MEMORY_LABELS = {
    "grpo": "grpokit GRPO, micro-batches of 8, chunked log-probs",
    "ppo": "grpokit PPO with a critic (value model + GAE), same batch",
    "trl": "TRL 1.16 GRPOTrainer, whole batch per pass",
    "trl-micro": "TRL 1.16 GRPOTrainer, micro-batches of 8 (gradient accumulation 4)",
}


def _memory_figures(found: list[dict]) -> dict:
    peak = {r["side"]: r["peak_mib"] for r in found}
    first = next(r for r in found if r["side"] == "grpo")
    return {
        **first, "saving": 1 - peak["grpo"] / peak["ppo"], "of_trl": peak["grpo"] / peak["trl"],
        "of_micro": peak["grpo"] / peak["trl-micro"],
    }


MEMORY = Table(
    rows=lambda: list(
        {r["side"]: {**r, "label": MEMORY_LABELS[r["side"]]} for r in rows("memory_table.jsonl")}.values()
    ),
    columns=(
        Column("4 x 8 completions x 256 tokens, vocab 49,152, fp32 (peak RSS)", "{label}"),
        Column("MiB", "{peak_mib:.0f}"),
    ),
    note="GRPO saves {saving:percent} of peak memory against PPO-with-critic here (the chapter claims "
         "30-40%); "
    "grpokit's peak is {of_trl:percent} of TRL's whole-batch peak and {of_micro:percent} of its "
    "micro-batched one ({date}, commit {commit}, `benchmarks/results/memory_table.jsonl`).",
    figures=_memory_figures,
)


# ---- architectures outside the lean decoder (benchmarks/arch_decode.py)

def _arch_rows() -> list[dict]:
    return [r for r in rows("arch_decode.jsonl") if r.get("summary")]


ARCH_DECODE = Table(
    rows=_arch_rows,
    columns=(Column("architecture", "{model_type}"),
             Column("grpokit's decode loop, generation tok/s", "{fast_generate_tokens_per_s:.0f}"),
             Column("model.generate, tok/s", "{generate_generate_tokens_per_s:.0f}"),
             Column("ratio", "{ratio_fast_over_generate:.2f}x")),
    note="`{command}` at commit {commit} ({machine}): random-init 4-layer models (hidden 256), `grpokit "
         "bench --model DIR --backend fast | generate {bench_args}`, the sides alternated, medians of the "
         "generation phase's tokens/s. Raw rows: `benchmarks/results/arch_decode.jsonl`.",
    figures=lambda found: found[0],
)


# ---- what each speed-up pays (benchmarks/fast_gains.py)

# (the variant switched off, its key in the results, the notes per column, the decision)
def _block(name: str, table: Table) -> Block:
    return Block("docs/performance.md", name, (table,))


BLOCKS = [
    _block("bench-equal", EQUAL_TABLE), _block("perf-smollm2", smollm2(SUMMARY)),
    _block("perf-memory", MEMORY), _block("perf-c-passes", history(C_PASSES)),
    _block("perf-c-passes-phases", phases(C_PASSES[:5])), _block("perf-panels", history(PANELS)),
    _block("perf-panels-phases", phases(PANELS[1:4:2])), _block("perf-split", history(SPLIT)),
    _block("perf-split-phases", phases(SPLIT[:2])), _block("perf-native", history(NATIVE)),
    _block("perf-native-phases", phases(NATIVE)), _block("perf-before", history(BEFORE)),
    _block("perf-before-phases", phases(BEFORE)), _block("arch-decode", ARCH_DECODE),
]
