"""docs/precision.md's blocks: the matmul rates and whole passes `model.precision=auto` is decided on
(benchmarks/matmul_rates.py, `grpokit bench --size tiny|small --precision fp32|bf16`), the lm-head's
log-probs (benchmarks/head_logprobs.py), the SmolLM2 bench runs against TRL and each run's phases, the
step's matmul floor and the first measurement."""

from __future__ import annotations

from .performance import smollm2
from .raw import rows
from .render import Block, Column, Table, Text, fill

PHASES = ("generate", "ref_forward", "policy_fwd_bwd", "optimizer")


def _meta(r: dict) -> str:
    machine = r.get("cpu") or r.get("machine")
    threads = f", {r['threads']} thread{'s' if r['threads'] > 1 else ''}" if "threads" in r else ""
    return f"`{r['command']}`, commit {r['commit']}, {machine}{threads}, {r['date']}"


def _rate_rows() -> list[dict]:
    rates = rows("matmul_rates.jsonl")
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rates):
        by = {r["dtype"]: r for r in rates if r["shape"] == shape}
        out.append(
            {**by["fp32"], "bf16": by["bf16"]["gflops"], "ratio": by["bf16"]["gflops"] / by["fp32"]["gflops"]}
        )
    return out


RATES = Table(
    rows=_rate_rows,
    columns=(
        Column("shape", "{shape}"), Column("M x K x N", "{m} x {k} x {n}"),
        Column("fp32 GFLOP/s", "{gflops:.0f}"), Column("bf16 GFLOP/s", "{bf16:.0f}"),
        Column("bf16 / fp32", "{ratio:ratio}"),
    ),
    note="Best of {rounds} calls each; {meta}. Raw rows: `benchmarks/results/matmul_rates.jsonl`.",
    figures=lambda _: {**rows("matmul_rates.jsonl")[0], "meta": _meta(rows("matmul_rates.jsonl")[0])},
)


def _pass_rows() -> list[dict]:
    out = []
    for r in rows("precision_passes.jsonl"):
        if "side" in r:
            size = (
                r["command"].split("--size ")[-1].split()[0] if "--size" in r["command"] else "SmolLM2-135M"
            )
            out.append({**r, **r["phases_s"], "model": size})
    return out


def _pass_figures(runs: list[dict]) -> dict:
    return {
        "command": runs[0]["command"].replace("--size tiny --precision fp32", "--size S --precision P"),
        "made": "; ".join(dict.fromkeys(fill("commit {commit}, {machine}, {date}", r) for r in runs)),
    }


PASSES = Table(
    rows=_pass_rows,
    columns=(
        Column("model", "{model}"), Column("precision", "{precision}"), Column("s/step", "{s_per_step:.2f}"),
        Column("generate (sample 4 x 8 x 64)", "{generate:.2f}"), Column("ref forward", "{ref_forward:.2f}"),
        Column("policy fwd+bwd", "{policy_fwd_bwd:.2f}"), Column("peak RSS MiB", "{peak_rss_mib:.0f}"),
    ),
    note="Each row one run of `{command}`, SmolLM2 with `--model smollm2-135m-instruct` for `--size S` (each "
    "row's command is in its raw row); {made}. Raw rows: `benchmarks/results/precision_passes.jsonl`.",
    figures=_pass_figures,
)


def _span(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"


def _head_figures() -> dict:
    runs = rows("head_logprobs_smollm2.jsonl")
    now, before = [r for r in runs if "code" not in r], [r for r in runs if "code" in r]
    spans = {f"{k}_now": _span([r["min_ms"][k] for r in now]) for k in now[0]["min_ms"]}
    spans |= {f"{k}_before": _span([r["min_ms"][k] for r in before]) for k in ("grpokit", "no-grad")}
    return {
        **now[0], **{k.replace("-", "_"): v for k, v in spans.items()}, "runs": len(now),
        "code": before[0]["code"].split()[0],
    }


HEAD = Text(
    "`python benchmarks/head_logprobs.py` ({rows} rows, {dtype}, {threads} threads, min of 6, {runs} runs; "
    "`benchmarks/results/head_logprobs_smollm2.jsonl`): forward + backward {grpokit_now} ms now against "
    "{grpokit_before} ms before ({code}) and {autograd_now} ms for plain autograd, with {matmuls_now} ms of "
    "matmuls; the no-grad reference head {no_grad_now} ms against {no_grad_before} before.", _head_figures,
)


def _side_rows(spec: list[tuple[str, str, list[str] | None]]) -> list[dict]:
    out = []
    for label, name, labels in spec:
        for i, r in enumerate(r for r in rows(name) if "side" in r):
            bf16 = r.get("precision") == "bf16"
            fraction = r["phase_peak_fraction_bf16" if bf16 else "phase_peak_fraction"]
            out.append(
                {
                    **r, "label": label if i == 0 else "",
                    "tag": labels[i] if labels else f"{r['side']}, round {r.get('round', 1)}",
                    "phases": [r["phases_s"][p] for p in PHASES],
                    "fractions": [fraction[p] for p in PHASES[:3]],
                    "peak": f"{r.get('precision', 'fp32')} "
                    f"{r['matmul_peak_gflops_bf16' if bf16 else 'matmul_peak_gflops']:.0f}",
                }
            )
    return out


def bench_phases(spec: list[tuple[str, str, list[str] | None]]) -> Table:
    """Every side's row of each bench file: s/step, seconds per phase, the fraction of the 1024^3 matmul peak
    (of the run's own precision) each phase reached, that peak and the peak RSS; `labels`: names for the rows
    of a file that does not record its micro-batch size."""
    return Table(
        rows=lambda: _side_rows(spec),
        columns=(
            Column("run (raw lines)", "{label}"), Column("side, round", "{tag}"),
            Column("s/step", "{s_per_step:.2f}"),
            Column("generate / reference / policy fwd+bwd / optimizer (s)", "{phases:.2f}"),
            Column("fraction of the peak: generate / reference / policy", "{fractions:.2f}"),
            Column("1024^3 peak in the run (GFLOP/s)", "{peak}"),
            Column("peak RSS MiB", "{peak_rss_mib:.0f}"),
        ),
    )


def _floor_rows() -> list[dict]:
    return [
        {
            **r, **r["bench"], "ph": {k: v["floor_s"] for k, v in r["phases"].items()},
            "need": r["bench"]["trl_s"] / 4, "need_x": r["bench"]["trl_s"] / 4 / r["bench"]["floor_s"],
        }
        for r in rows("smollm2_64_step_floor_2026-12-03.jsonl")
    ]


FLOOR = Table(
    rows=_floor_rows,
    columns=(
        Column("bench run", "{dtype}, `{file}`"), Column("peak in that run", "{peak_gflops:.0f} GFLOP/s"),
        Column(
            "floor (generate / reference / update)",
            "{floor_s:.2f} s ({ph[generate]:.2f} / {ph[ref_forward]:.2f} / {ph[policy_fwd_bwd]:.2f} at the "
            "script's own peak, {peak_1024_gflops:.0f})",
        ),
        Column("grpokit s/step", "{grpokit_s:.2f}"), Column("TRL s/step", "{trl_s:.2f}"),
        Column("TRL / grpokit", "{trl_over_grpokit:ratio}"),
        Column("TRL / floor", "**{trl_over_floor:ratio}**"),
        Column("4x needs", "{need:.2f} s: {need_x:ratio} the floor"),
    ),
)


def _first_rows() -> list[dict]:
    return [
        {
            **r, "who": "grpokit" if r["side"] == "grpokit" else "TRL", "p": r["phases_s"],
            "f": r["phase_peak_fraction_bf16"],
        }
        for r in rows("smollm2_64_fixed_bf16_vs_trl_default.jsonl")
        if "side" in r
    ]


FIRST = Table(
    rows=_first_rows,
    columns=(
        Column("round", "{round}"), Column("side", "{who}"),
        Column("s/step (median of the timed steps)", "{s_per_step:.1f}"),
        Column("every step (s)", "{all_steps_s:.1f|, }"),
        Column(
            "generate / ref / policy fwd+bwd (s)",
            "{p[generate]:.1f} / {p[ref_forward]:.1f} / {p[policy_fwd_bwd]:.1f}",
        ),
        Column("peak RSS (MiB)", "{peak_rss_mib:.0f}"),
        Column(
            "fp32 / bf16 matmul peak in that run (GFLOP/s)",
            "{matmul_peak_gflops:.0f} / {matmul_peak_gflops_bf16:.0f}",
        ),
        Column(
            "fraction of the bf16 peak: generate / ref / policy",
            "{f[generate]:.3f} / {f[ref_forward]:.3f} / {f[policy_fwd_bwd]:.3f}",
        ),
    ),
)

S24 = [
    (
        "`--compare-trl --rounds 2` (the issue's command: grpokit `auto` = bf16, whole batch per pass; TRL "
        "at its default bf16)", "smollm2_64_fixed_s24_best_vs_trl_default.jsonl",
    ),
    (
        "the same with `--micro-batch-size 8` (one group per grpokit pass; TRL at its default whole batch "
        "per pass)", "smollm2_64_fixed_s24_best_mb8_vs_trl_default.jsonl",
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


S25_S27 = [
    (
        "2026-12-02 (later), `smollm2_64_fixed_s25_best_mb8_vs_trl_default_run2.jsonl`",
        "smollm2_64_fixed_s25_best_mb8_vs_trl_default_run2.jsonl", None,
    ),
    (
        "2026-12-03, `smollm2_64_fixed_s26_best_mb8_vs_trl_default.jsonl`",
        "smollm2_64_fixed_s26_best_mb8_vs_trl_default.jsonl", None,
    ),
    (
        "2026-12-03 (later), `smollm2_64_fixed_s27_best_mb8_vs_trl_default.jsonl`",
        "smollm2_64_fixed_s27_best_mb8_vs_trl_default.jsonl", None,
    ),
    (
        "fp32 against fp32, `smollm2_64_fixed_s25_fp32_mb8_vs_fp32.jsonl`",
        "smollm2_64_fixed_s25_fp32_mb8_vs_fp32.jsonl", None,
    ),
    (
        "the same 2026-12-03, `smollm2_64_fixed_s26_fp32_mb8_vs_fp32.jsonl`",
        "smollm2_64_fixed_s26_fp32_mb8_vs_fp32.jsonl", None,
    ),
]
S24_PHASES = [
    (
        "bf16, whole batch, `smollm2_64_fixed_s24_best_vs_trl_default.jsonl`",
        "smollm2_64_fixed_s24_best_vs_trl_default.jsonl", None,
    ),
    (
        "bf16, `--micro-batch-size 8`, `smollm2_64_fixed_s24_best_mb8_vs_trl_default.jsonl`",
        "smollm2_64_fixed_s24_best_mb8_vs_trl_default.jsonl", None,
    ),
    (
        "fp32 against fp32, `smollm2_64_fixed_s24_fp32_vs_fp32.jsonl`",
        "smollm2_64_fixed_s24_fp32_vs_fp32.jsonl", None,
    ),
    # the file's rows are the four runs in the order they were made (its rows do not record the size)
    (
        "grpokit alone, bf16, `smollm2_64_fixed_s24_grpokit_bf16_micro_batch.jsonl`",
        "smollm2_64_fixed_s24_grpokit_bf16_micro_batch.jsonl",
        ["8 per pass", "whole batch", "4 per pass", "16 per pass"],
    ),
]
ALONE = [
    (
        "bf16, `smollm2_64_fixed_grpokit_bf16_alone.jsonl`", "smollm2_64_fixed_grpokit_bf16_alone.jsonl",
        ["grpokit"],
    ),
    (
        "fp32, `smollm2_64_fixed_grpokit_fp32_alone.jsonl`", "smollm2_64_fixed_grpokit_fp32_alone.jsonl",
        ["grpokit"],
    ),
]


def _block(name: str, part: Table | Text) -> Block:
    return Block("docs/precision.md", name, (part,))


BLOCKS = [
    _block("prec-head", HEAD), _block("prec-rates", RATES), _block("prec-passes", PASSES),
    _block("prec-s25", smollm2(S25)), _block("prec-s25-phases", bench_phases(S25_S27)),
    _block("prec-floor", FLOOR), _block("prec-s24", smollm2(S24)),
    _block("prec-s24-phases", bench_phases(S24_PHASES)), _block("prec-first", FIRST),
    _block("prec-alone", bench_phases(ALONE)),
]
