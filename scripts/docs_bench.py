"""The `grpokit bench --compare-trl` tables of docs/performance.md and docs/precision.md, generated from the
raw lines each run wrote under benchmarks/results/ (scripts/update_readme.py writes them, tests/cli/
test_readme.py checks them). A bench file holds one or more runs: the sides' rows (grpokit and TRL
alternated ABBA, one row per side and round) and then the run's compare row."""

import statistics

from docs_measured import pct, rows, table

PHASES = (
    ("generate", "generate"),
    ("ref_forward", "ref forward"),
    ("policy_fwd_bwd", "policy fwd+bwd"),
    ("optimizer", "optimizer"),
)


def bench_run(name: str, run: int = 0) -> tuple[list[dict], list[dict], dict]:
    """(grpokit's rows by round, TRL's rows by round, the compare row) of run `run` in bench file `name`."""
    runs, sides = [], []
    for r in rows(name):
        compare = r.get("compare", r if "ratio_trl_over_grpokit_s_per_step" in r else None)
        if compare is not None:
            runs.append(
                (
                    [s for s in sides if s["side"] == "grpokit"],
                    [s for s in sides if s["side"] == "trl"],
                    compare,
                )
            )
            sides = []
        elif "side" in r:
            sides.append(r)
    return runs[run]


def _s(x: float) -> str:
    """Seconds as the tables print them: 3 decimals below 10 s, 2 above."""
    return f"{x:.3f}" if x < 10 else f"{x:.2f}"


def _per_round(c: dict) -> str:
    return ", ".join(f"{x:.2f}" for x in c["ratios_per_round"])


def _target(c: dict, at_least: float | None) -> str:
    if at_least is None:
        return ""
    ratio, under = c["ratio_trl_over_grpokit_s_per_step"], sum(x < at_least for x in c["ratios_per_round"])
    out = f">= {at_least}: {'met' if ratio >= at_least else 'missed'}"
    if ratio >= at_least and under:
        out += f" ({'one round' if under == 1 else f'{under} rounds'} under)"
    return out


def history(spec: list[tuple]) -> str:
    """One row per (label, file, run, target ratio) of the tiny / small comparisons."""
    out = []
    for label, name, run, at_least in spec:
        _, _, c = bench_run(name, run)
        out.append(
            [
                label,
                _s(c["grpokit_s_per_step"]),
                _s(c["trl_s_per_step"]),
                f"**{c['ratio_trl_over_grpokit_s_per_step']:.2f}** ({_per_round(c)})",
                _target(c, at_least),
                f"{c['rss_grpokit_mib']:.0f} / {c['rss_trl_mib']:.0f}",
                f"`{name}`",
            ]
        )
    return table(
        [
            "config",
            "grpokit s/step",
            "TRL s/step",
            "TRL / grpokit (per round)",
            "target",
            "peak RSS grpokit / TRL (MiB)",
            "raw lines",
        ],
        out,
    )


def _phase_mean(sides: list[dict], phase: str) -> tuple[float, float | None]:
    secs = statistics.mean(s["phases_s"][phase] for s in sides)
    fracs = [s.get("phase_peak_fraction", {}).get(phase) for s in sides]
    return secs, (statistics.mean(fracs) if None not in fracs else None)


def phases(spec: list[tuple]) -> str:
    """Seconds per step by phase (mean over the rounds), grpokit / TRL, each with its fraction of the
    matmul peak measured in its own run in brackets."""
    out = []
    for label, name, run in spec:
        g, t, _ = bench_run(name, run)
        cells = []
        for phase, _ in PHASES:
            (gs, gf), (ts, tf) = _phase_mean(g, phase), _phase_mean(t, phase)
            cells.append(
                f"{_s(gs)} ({gf:.2f}) / {_s(ts)} ({tf:.2f})"
                if gf is not None and tf is not None
                else f"{gs:.3f} / {ts:.3f}"
            )
        out.append([label, *cells])
    return table(["config", *(title for _, title in PHASES)], out)


def smollm2(spec: list[tuple]) -> str:
    """SmolLM2-135M against TRL: per (label, file) both sides' s/step by round, the ratio and peak RSS."""
    out = []
    for label, name in spec:
        g, t, c = bench_run(name)
        out.append(
            [
                label,
                ", ".join(f"{r['s_per_step']:.2f}" for r in g),
                ", ".join(f"{r['s_per_step']:.2f}" for r in t),
                f"**{c['ratio_trl_over_grpokit_s_per_step']:.2f}x** ({_per_round(c)})",
                f"{c['rss_grpokit_mib']:.0f} / {c['rss_trl_mib']:.0f}",
                f"{c['rss_grpokit_mib'] / c['rss_trl_mib']:.3f}",
                f"`{name}`",
            ]
        )
    return table(
        [
            "run",
            "grpokit s/step (round 1, 2)",
            "TRL s/step (round 1, 2)",
            "TRL / grpokit (median of rounds; per round)",
            "peak RSS grpokit / TRL (MiB)",
            "RSS ratio",
            "raw lines",
        ],
        out,
    )


def first_measurement() -> str:
    """2026-12-01, shared machine: every side's row of smollm2_64_fixed_bf16_vs_trl_default.jsonl."""
    out = []
    sides = [r for r in rows("smollm2_64_fixed_bf16_vs_trl_default.jsonl") if "side" in r]
    for r in sides:
        p, f = r["phases_s"], r["phase_peak_fraction_bf16"]
        out.append(
            [
                r["round"],
                "grpokit" if r["side"] == "grpokit" else "TRL",
                f"{r['s_per_step']:.1f}",
                ", ".join(f"{x:.1f}" for x in r["all_steps_s"]),
                f"{p['generate']:.1f} / {p['ref_forward']:.1f} / {p['policy_fwd_bwd']:.1f}",
                f"{r['peak_rss_mib']:.0f}",
                f"{r['matmul_peak_gflops']:.0f} / {r['matmul_peak_gflops_bf16']:.0f}",
                f"{f['generate']:.3f} / {f['ref_forward']:.3f} / {f['policy_fwd_bwd']:.3f}",
            ]
        )
    return table(
        [
            "round",
            "side",
            "s/step (median of the timed steps)",
            "every step (s)",
            "generate / ref / policy fwd+bwd (s)",
            "peak RSS (MiB)",
            "fp32 / bf16 matmul peak in that run (GFLOP/s)",
            "fraction of the bf16 peak: generate / ref / policy",
        ],
        out,
    )


def step_floor() -> str:
    """The matmul floor of the bench step beside three bench runs (smollm2_64_step_floor_2026-12-03.jsonl)."""
    out = []
    for r in rows("smollm2_64_step_floor_2026-12-03.jsonl"):
        b, ph = r["bench"], r["phases"]
        need = b["trl_s"] / 4
        out.append(
            [
                f"{r['dtype']}, `{b['file']}`",
                f"{b['peak_gflops']:.0f} GFLOP/s",
                f"{b['floor_s']:.2f} s ({ph['generate']['floor_s']:.2f} "
                f"/ {ph['ref_forward']['floor_s']:.2f} / "
                f"{ph['policy_fwd_bwd']['floor_s']:.2f} at the script's "
                f"own peak, {r['peak_1024_gflops']:.0f})",
                f"{b['grpokit_s']:.2f}",
                f"{b['trl_s']:.2f}",
                f"{b['trl_over_grpokit']:.2f}x",
                f"**{b['trl_over_floor']:.2f}x**",
                f"{need:.2f} s: {need / b['floor_s']:.2f}x the floor",
            ]
        )
    return table(
        [
            "bench run",
            "peak in that run",
            "floor (generate / reference / update)",
            "grpokit s/step",
            "TRL s/step",
            "TRL / grpokit",
            "TRL / floor",
            "4x needs",
        ],
        out,
    )


def memory_summary() -> str:
    """docs/performance.md's short memory table, from benchmarks/results/memory_table.jsonl."""
    sides = {r["side"]: r for r in rows("memory_table.jsonl")}
    label = {
        "grpo": "grpokit GRPO, micro-batches of 8, chunked log-probs",
        "ppo": "grpokit PPO with a critic (value model + GAE), same batch",
        "trl": "TRL 1.16 GRPOTrainer, whole batch per pass",
        "trl-micro": "TRL 1.16 GRPOTrainer, micro-batches of 8 (gradient accumulation 4)",
    }
    peak = {k: r["peak_mib"] for k, r in sides.items()}
    first = sides["grpo"]
    return (
        table(
            ["4 x 8 completions x 256 tokens, vocab 49,152, fp32 (peak RSS)", "MiB"],
            [[label[k], f"{v:.0f}"] for k, v in peak.items()],
        )
        + f"\n\nGRPO saves {100 * (1 - peak['grpo'] / peak['ppo']):.1f}% "
          "of peak memory against PPO-with-critic "
        "here (the chapter claims 30-40%); grpokit's peak is "
        f"{100 * peak['grpo'] / peak['trl']:.1f}% of TRL's "
        f"whole-batch peak and {100 * peak['grpo'] / peak['trl-micro']:.1f}% of its micro-batched one "
        f"({first['date']}, commit {first['commit']}, `benchmarks/results/memory_table.jsonl`)."
    )


# ---- docs/memory.md: the chapter's claim against benchmarks/results/memory_table.jsonl


def memory_claims() -> str:
    sides = {r["side"]: r for r in rows("memory_table.jsonl")}
    grpo, ppo = sides["grpo"], sides["ppo"]
    base = grpo["baseline_mib"]
    saving = 1 - grpo["peak_mib"] / ppo["peak_mib"]
    above = 1 - (grpo["peak_mib"] - base) / (ppo["peak_mib"] - ppo["baseline_mib"])
    extra = ppo["activations_and_rest_mib"] - grpo["activations_and_rest_mib"]
    return (
        table(
            ["", "claimed (DeepSeekMath write-ups)", "measured here (CPU, fp32, this model and batch)"],
            [
                ["PPO with critic, peak", "100%", f"{ppo['peak_mib']:.0f} MiB"],
                [
                    "GRPO, peak",
                    "60-70%",
                    f"{grpo['peak_mib']:.0f} MiB = {pct(grpo['peak_mib'] / ppo['peak_mib'])}",
                ],
                [
                    "memory GRPO saves",
                    "30-40%",
                    f"**{pct(saving)}** of the peak ({pct(above)} of the peak above the "
                    f"{base:.0f} MiB process baseline)",
                ],
            ],
        )
        + f"\n\nThe critic's activations: {extra:.0f} MiB more in the last column of the table above "
        f"({grpo['date']}, commit {grpo['commit']}, `benchmarks/results/memory_table.jsonl`)."
    )


MB8 = "TRL at its default whole batch per pass"
S24 = [
    (
        "`--compare-trl --rounds 2` (the issue's command: grpokit "
        "`auto` = bf16, whole batch per pass; TRL at "
        "its default bf16)",
        "smollm2_64_fixed_s24_best_vs_trl_default.jsonl",
    ),
    (
        f"the same with `--micro-batch-size 8` (one group per grpokit pass; {MB8})",
        "smollm2_64_fixed_s24_best_mb8_vs_trl_default.jsonl",
    ),
    (
        "`--precision fp32 --trl-precision fp32` (fp32 against fp32)",
        "smollm2_64_fixed_s24_fp32_vs_fp32.jsonl",
    ),
]
S25 = [
    (
        "`--compare-trl --rounds 2 --micro-batch-size 8`",
        "smollm2_64_fixed_s25_best_mb8_vs_trl_default_run2.jsonl",
    ),
    (
        "the same, an earlier run (its grpokit round 1 shared the machine with a plot and a test)",
        "smollm2_64_fixed_s25_best_mb8_vs_trl_default.jsonl",
    ),
    (
        "the same, 2026-12-03, with `fast.master_grads` (that day's bf16 peak: the phases table)",
        "smollm2_64_fixed_s26_best_mb8_vs_trl_default.jsonl",
    ),
    (
        "the same, 2026-12-03 (later), with `SiluMulDown` and the head's sliced gradient add",
        "smollm2_64_fixed_s27_best_mb8_vs_trl_default.jsonl",
    ),
]
SUMMARY = [
    (
        f"bf16, `--micro-batch-size 8` ({MB8}), with `SiluMulDown` "
        "and the head's sliced gradient add (2026-12-03, later)",
        "smollm2_64_fixed_s27_best_mb8_vs_trl_default.jsonl",
    ),
    (
        "bf16, `--micro-batch-size 8`, with `fast.master_grads` (2026-12-03; "
        "this machine's bf16 peak half of 12-02's)",
        "smollm2_64_fixed_s26_best_mb8_vs_trl_default.jsonl",
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
C_PASSES = [("tiny, 64", "tiny_64_fixed_fused.jsonl", 0, T),
            ("tiny, 256, run 1", "tiny_256_fixed_fused.jsonl", 0, T),
            ("tiny, 256, run 2", "tiny_256_fixed_fused_run2.jsonl", 0, T),
            ("small, 64 (`--rounds 2`)", "small_64_fixed_fused_gated.jsonl", 0, S),
            ("small, 256 (`--rounds 2 --steps 3`)", "small_256_fixed_fused_gated.jsonl", 0, S),
            ("small, 256, before `GatedSiluMul` (RSS above TRL's)", "small_256_fixed_fused.jsonl", 0, None)]
PANELS = [("tiny, 64, run 1", "tiny_64_fixed_attn.jsonl", 0, T),
          ("tiny, 64, run 2", "tiny_64_fixed_attn2.jsonl", 0, T),
          ("tiny, 256, run 1", "tiny_256_fixed_attn.jsonl", 0, T),
          ("tiny, 256, run 2", "tiny_256_fixed_attn2.jsonl", 0, T),
          ("small, 64 (`--rounds 2`)", "small_64_fixed_attn.jsonl", 0, S),
          ("small, 256 (`--rounds 2 --steps 3`)", "small_256_fixed_attn.jsonl", 0, S),
          ("tiny, 64, before the attention forward", "tiny_64_fixed_panels.jsonl", 0, None),
          ("tiny, 256, before the attention forward", "tiny_256_fixed_panels.jsonl", 0, None)]
SPLIT = [("tiny, 64", "tiny_64_fixed_split.jsonl", 0, T),
         ("tiny, 256 (4 rounds)", "tiny_256_fixed_split_rounds4.jsonl", 0, T),
         ("tiny, 256 (2 rounds)", "tiny_256_fixed_split.jsonl", 0, T)]
NATIVE = [("tiny, 64", "tiny_64_fixed_native.jsonl", 0, T),
          ("tiny, 256", "tiny_256_fixed_native.jsonl", 0, T),
          ("small, 64", "small_64_fixed_native.jsonl", 0, S),
          ("small, 256", "small_256_fixed_native.jsonl", 0, S)]
BEFORE = [("tiny, 64", "tiny_64_fixed.jsonl", 0, T), ("tiny, 256", "tiny_256_fixed.jsonl", 0, T),
          ("small, 64", "small_64_fixed_rounds4.jsonl", 0, S), ("small, 256", "small_256_fixed.jsonl", 0, S)]

def _no_target(spec: list[tuple]) -> list[tuple]:
    return [s[:3] for s in spec]


BLOCKS = {
    "performance.md": {
        "perf-smollm2": lambda: smollm2(SUMMARY),
        "perf-memory": memory_summary,
        "perf-c-passes": lambda: history(C_PASSES),
        "perf-c-passes-phases": lambda: phases(_no_target(C_PASSES[:5])),
        "perf-panels": lambda: history(PANELS),
        "perf-panels-phases": lambda: phases(_no_target(PANELS[1:4:2])),
        "perf-split": lambda: history(SPLIT),
        "perf-split-phases": lambda: phases(_no_target(SPLIT[:2])),
        "perf-native": lambda: history(NATIVE),
        "perf-native-phases": lambda: phases(_no_target(NATIVE)),
        "perf-before": lambda: history(BEFORE),
        "perf-before-phases": lambda: phases(_no_target(BEFORE)),
    },
    "memory.md": {"memory-claims": memory_claims},
    "precision.md": {
        "prec-s25": lambda: smollm2(S25),
        "prec-floor": step_floor,
        "prec-s24": lambda: smollm2(S24),
        "prec-first": first_measurement,
    },
}
