"""docs/reliability.md's soak and docs/coming_from_trl.md's conformance counts, generated from
benchmarks/results/soak_resume.jsonl (`python benchmarks/soak_resume.py --record ...`) and
benchmarks/results/conformance_runs.jsonl (`python benchmarks/conformance_run.py --trl --record ...`);
scripts/update_readme.py writes them, tests/cli/test_readme.py checks them."""

from docs_measured import rows


def _day(row: dict) -> str:
    return row["date"][:10]


def soak() -> str:
    """The newest soak row, printed as `soak_resume.py` prints it, with how it was measured."""
    r = rows("soak_resume.jsonl")[-1]
    kills = [k["after_step"] for k in r["kills"]]
    out = [
        f"steps completed: {r['rows']}/{r['steps']} (each logged once: {r['steps_logged_once']})",
        f"kills survived: {len(kills)} ({r['kills_during_save']} during a checkpoint write), "
        f"attempts: {r['attempts']}, killed after steps: {kills}",
        f"bytes written: crashed run {r['bytes_written']:,}, uninterrupted run "
        f"{r['reference_bytes_written']:,}; one checkpoint: {r['checkpoint_bytes']:,} bytes",
        f"steps with a non-zero gradient: {r['steps_with_nonzero_grad']}/{r['steps']}",
        f"final weights bit-identical to the uninterrupted run: {r['weights_bit_identical']}; "
        f"per-step reward and loss equal: {r['per_step_reward_and_loss_equal']}",
        f"wall time: {r['wall_s']} s",
    ]
    extra = (r["bytes_written"] - r["reference_bytes_written"]) / 1e6
    return (
        f"Measured {_day(r)} on {r['cpu']} (2 cores, the two runs side by side, {r['threads']} thread each), "
        f"commit {r['commit']}: `{r['command']}`. Raw row: `benchmarks/results/soak_resume.jsonl`.\n\n"
        "```\n" + "\n".join(out) + "\n```\n\n"
        f"The crashed run wrote {extra:.1f} MB more than the uninterrupted one: the steps it trained again "
        "after each kill and their checkpoints."
    )


def _skips(reasons: dict) -> str:
    return ", ".join(f"{n} {key}" for key, n in sorted(reasons.items(), key=lambda kv: -kv[1]))


def _side(label: str, r: dict) -> str:
    skips = f", {r['skipped']} skipped ({_skips(r['skip_reasons'])})" if r["skipped"] else ""
    seconds = f"{r['test_seconds']:.0f} s of test time"
    return f"{label} {r['passed']} passed, {r['failed']} failed{skips} in {seconds}"


def _newest_conformance() -> dict[str, dict]:
    """{impl: row} of the newest conformance run (grpokit, trl, both)."""
    runs = rows("conformance_runs.jsonl")
    return {r["impl"]: r for r in runs if r["date"] == runs[-1]["date"]}


def conformance() -> str:
    """The newest conformance run: per implementation, passed / failed / skipped and seconds."""
    by = _newest_conformance()
    first = by["grpokit"]
    parts = [_side("grpokit.trl", by["grpokit"])]
    if "trl" in by:
        parts.append(_side("TRL 1.16", by["trl"]))
    if by.get("both", {}).get("skipped"):
        b = by["both"]
        parts.append(f"{b['skipped']} cases skipped for both by a mark ({_skips(b['skip_reasons'])})")
    return (
        f"Measured {_day(first)} on {first['cpu']}, one core, {first['threads']} thread, commit "
        f"{first['commit']}, {first['wall_s']:.0f} s of wall time for the run: " + "; ".join(parts)
        + ". Raw rows: `benchmarks/results/conformance_runs.jsonl`."
    )


def conformance_row() -> str:
    """The README's headline row of the newest conformance run."""
    by = _newest_conformance()
    g, t, both = by["grpokit"], by["trl"], by["both"]
    return ("| TRL conformance: the behaviours TRL's own GRPOTrainer tests check, on grpokit.trl and on "
            f"TRL | {g['passed']} of {g['passed'] + g['failed']} pass on grpokit.trl (TRL: {t['passed']}, "
            f"{t['skipped']} skipped), agents included; {both['skipped']} skipped on both, each with its "
            "reason | "
            "[coming from TRL](docs/coming_from_trl.md), `benchmarks/results/conformance_runs.jsonl` |")


BLOCKS = {
    "reliability.md": {"soak": soak},
    "coming_from_trl.md": {"conformance-counts": conformance},
}
