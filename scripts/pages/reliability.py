"""docs/reliability.md's soak (benchmarks/soak_resume.py), docs/coming_from_trl.md's conformance counts
(benchmarks/conformance_run.py) with the README's conformance row, and the blocks generated from the code
itself: docs/configuration.md's config reference and coming_from_trl.md's TRL field tables."""

from __future__ import annotations

from grpokit.config.schema import config_reference
from grpokit.trl.fields import BLOCKS as TRL_BLOCKS

from .raw import rows
from .render import Block, Text, fill, headline_row


def _soak_figures() -> dict:
    r = rows("soak_resume.jsonl")[-1]
    return {
        **r, "day": r["date"][:10], "killed": [k["after_step"] for k in r["kills"]], "kills": len(r["kills"]),
        "extra": (r["bytes_written"] - r["reference_bytes_written"]) / 1e6,
    }


SOAK = (
    Text(
        "Measured {day} on {cpu} (2 cores, the two runs side by side, {threads} thread each), commit "
        "{commit}: `{command}`. Raw row: `benchmarks/results/soak_resume.jsonl`.", _soak_figures,
    ),
    Text(
        "```\nsteps completed: {rows}/{steps} (each logged once: {steps_logged_once})\nkills survived: "
        "{kills} ({kills_during_save} during a checkpoint write), attempts: {attempts}, killed after steps: "
        "{killed!s}\nbytes written: crashed run {bytes_written:,}, uninterrupted run "
        "{reference_bytes_written:,}; one checkpoint: {checkpoint_bytes:,} bytes\nsteps with a non-zero "
        "gradient: {steps_with_nonzero_grad}/{steps}\nfinal weights bit-identical to the uninterrupted run: "
        "{weights_bit_identical}; per-step reward and loss equal: {per_step_reward_and_loss_equal}\nwall "
        "time: {wall_s} s\n```", _soak_figures,
    ),
    Text(
        "The crashed run wrote {extra:.1f} MB more than the uninterrupted one: the steps it trained again "
        "after each kill and their checkpoints.", _soak_figures,
    ),
)


def _skips(reasons: dict) -> str:
    return ", ".join(f"{n} {key}" for key, n in sorted(reasons.items(), key=lambda kv: -kv[1]))


def newest_conformance() -> dict[str, dict]:
    """{impl: row} of the newest conformance run (grpokit, trl, both)."""
    runs = rows("conformance_runs.jsonl")
    return {r["impl"]: r for r in runs if r["date"] == runs[-1]["date"]}


def _side(label: str, r: dict) -> str:
    skips = (
        fill(", {skipped} skipped ({why})", {**r, "why": _skips(r["skip_reasons"])}) if r["skipped"] else ""
    )
    return fill(
        "{label} {passed} passed, {failed} failed{skips} in {test_seconds:seconds} of test time",
        {**r, "label": label, "skips": skips},
    )


def _conformance_figures() -> dict:
    by = newest_conformance()
    parts = [_side("grpokit.trl", by["grpokit"])]
    if "trl" in by:
        parts.append(_side("TRL 1.16", by["trl"]))
    if by.get("both", {}).get("skipped"):
        parts.append(
            fill(
                "{skipped} cases skipped for both by a mark ({why})",
                {**by["both"], "why": _skips(by["both"]["skip_reasons"])},
            )
        )
    return {**by["grpokit"], "day": by["grpokit"]["date"][:10], "parts": "; ".join(parts)}


CONFORMANCE = Text(
    "Measured {day} on {cpu}, one core, {threads} thread, commit {commit}, {wall_s:.0f} s of wall time for "
    "the run: {parts}. Raw rows: `benchmarks/results/conformance_runs.jsonl`.", _conformance_figures,
)


def headline() -> list[dict]:
    by = newest_conformance()
    g, t, both = by["grpokit"], by["trl"], by["both"]
    return [
        headline_row(
            "TRL conformance: grpokit's own suite of the behaviours TRL's GRPOTrainer tests check (not TRL's "
            "test file; the common check: a final loss row and moved weights, no number compared with TRL), "
            "on grpokit.trl and on TRL",
            "{passed} of {ran} pass on grpokit.trl (TRL: {trl_passed}, {trl_skipped} skipped), agents "
            "included; {both} are empty placeholders skipped on both ({why}: the vlm ones are a feature "
            "grpokit lacks, it refuses images)", "coming from TRL", "coming_from_trl.md",
            "conformance_runs.jsonl", **g, ran=g["passed"] + g["failed"], trl_passed=t["passed"],
            trl_skipped=t["skipped"], both=both["skipped"], why=_skips(both["skip_reasons"]),
        )
    ]


def _code_block(page: str, name: str, make) -> Block:
    """A block generated from the code (not from raw rows): `make()`'s text as it is."""
    return Block(page, name, (Text("{text}", lambda: {"text": make()}),))


BLOCKS = [
    Block("docs/reliability.md", "soak", SOAK),
    Block("docs/coming_from_trl.md", "conformance-counts", (CONFORMANCE,)),
    _code_block("docs/configuration.md", "config-reference", config_reference),
    *(_code_block("docs/coming_from_trl.md", name, make) for name, make in TRL_BLOCKS.items()),
]
