"""docs/performance.md's ragged-completions block: grpokit's padded update, its padding-free update
(optim.padding_free) and TRL 1.16 on one naturally sampled SmolLM2 GSM8K batch
(benchmarks/ragged_update.py; benchmarks/results/ragged_update.jsonl: the sample row, the sides' rows, the
summary)."""

from __future__ import annotations

from .raw import last_benchmark
from .render import Block, Column, Table

RAGGED = "ragged_update.jsonl"
LABELS = {"padded": "grpokit, padded (length buckets, a group's prompt run once)",
          "packed": "grpokit, padding-free (`optim.padding_free=true`)",
          "trl": "TRL 1.16 (`rollout_func` returning the same tokens)"}


def _run() -> tuple[dict, list[dict], dict]:
    runs, summary = last_benchmark(RAGGED)
    return runs[0], runs[1:], summary


def _rows() -> list[dict]:
    _, sides, summary = _run()
    padded = summary["sides"]["padded"]
    out = []
    for side, label in LABELS.items():
        mine = [r for r in sides if r["side"] == side]
        if not mine:
            continue
        med = summary["sides"][side]
        row = {"side": label, "train_all": [r["train_s"] for r in mine],
               "peaks": [r["step_peak_mib"] for r in mine], "train_s": med["train_s"],
               "peak": med["step_peak_mib"], "train_ratio": med["train_s"] / padded["train_s"],
               "peak_ratio": med["step_peak_mib"] / padded["step_peak_mib"]}
        if side == "trl":
            row.update(update="-", ref="-", slots="-")
        else:
            slots = med["real_slots"] if side == "packed" else med["padded_slots"]
            each = ", ".join(f"{r['update_s']:.1f}" for r in mine)
            row.update(update=f"{med['update_s']:.1f} ({each})", ref=f"{med['ref_s']:.1f}",
                       slots=f"{slots:,.0f}")
        out.append(row)
    return out


def _figures(_rows: list[dict]) -> dict:
    sample, sides, summary = _run()
    return {**sample, **summary, "runs": len([r for r in sides if r["side"] == "padded"]),
            "steps": len(sides[0]["all_train_s"]), "met": "met" if summary["goal_within_10pct"] else "missed",
            "gap": summary["packed_over_padded_update"] / summary["real_over_padded_slots"] - 1}


TABLE = Table(
    rows=_rows,
    columns=(Column("side", "{side}"), Column("train s/step (runs)", "{train_s:.1f} ({train_all:.1f|, })"),
             Column("of padded", "{train_ratio:ratio}"), Column("update s (runs)", "{update}"),
             Column("reference s", "{ref}"), Column("token-slots run", "{slots}"),
             Column("step peak RSS (runs)", "{peak:.0f} MiB ({peaks:.0f|, })"),
             Column("of padded", "{peak_ratio:ratio}")),
    note="`{command}` at commit {commit} ({cpu}, {date}). One batch of 4 GSM8K prompts x 8 completions "
         "(the two-shot chat prompts of `configs/smollm2_gsm8k_cpu.yaml`, {prompt_tokens_mean:.0f} prompt "
         "tokens on average; temperature 0.7, at most {max_length} tokens) sampled once by grpokit in "
         "{generate_s:.0f} s; completion lengths min {length_min}, quartiles {length_p25:.0f} / "
         "{length_median:.0f} / {length_p75:.0f}, max {length_max}, mean {length_mean:.0f}, {truncated} cut "
         "at the limit. Every side trains on those tokens: SmolLM2-135M-Instruct in bf16 mixed precision, "
         "beta 0.04, micro-batches of 8 rows, {steps} steps per run in its own process (the first left out), "
         "the sides in the order padded, packed, TRL, then reversed. Train s: the reference pass, the "
         "policy's forward and backward and AdamW, no sampling. Token-slots: what the update's micro-batches "
         "run (padded: distinct prompts x prompt width + rows x longest completion; padding-free: the real "
         "tokens, a group's prompt once). Goal (issue 59): the padding-free update's time over the "
         "padded one's within 10% of its token-slots over the padded ones': "
         "{packed_over_padded_update:.3f} against {real_over_padded_slots:.3f}, {gap:percent} above it, "
         "**{met}**. The padded plan already cuts most of the padding (length buckets inside each group, "
         "each prompt run once): the padding-free update runs {real_over_padded_slots:percent} of its "
         "token-slots. TRL takes {trl_over_padded_train:ratio} grpokit's padded train time; grpokit's "
         "padded peak is {padded_over_trl_peak:.2f} of TRL's. Raw rows: "
         "`benchmarks/results/ragged_update.jsonl`.",
    figures=_figures,
)

BLOCKS = [Block("docs/performance.md", "ragged-update", (TABLE,))]
