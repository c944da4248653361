"""docs/code.md's measured blocks: the hostile programs in both sandbox modes and through a training run,
the pool's throughput (benchmarks/results/sandbox_*.jsonl)."""

from __future__ import annotations

import statistics
from collections import Counter

from .raw import rows
from .render import Block, Column, Table, Text

PAGE = "docs/code.md"
HOSTILE, TRAIN, SPEED = "sandbox_hostile.jsonl", "sandbox_hostile_train.jsonl", "sandbox_throughput.jsonl"
HARM = ("watched_changed", "wrote_host_tmp", "leaked")


def _newest(name: str) -> list[dict]:
    """The rows of the file's newest commit (a benchmark is appended run after run)."""
    got = rows(name)
    last = got[-1]["commit"]
    return [r for r in got if r["commit"] == last]


def _mode_rows() -> list[dict]:
    """One row per way of running the suite: what the programs did to the machine."""
    out = []
    for label, got in (("bwrap, a caller process per program", [r for r in _newest(HOSTILE)
                                                                 if r["mode"] == "bwrap"]),
                       ("bwrap, inside a GRPO run (one step per program)", [r for r in _newest(TRAIN)
                                                                            if not r.get("summary")]),
                       ("process, a caller process per program", [r for r in _newest(HOSTILE)
                                                                   if r["mode"] == "process"])):
        ran = [r for r in got if r["outcome"] != "skipped"]
        outcomes = Counter(r["outcome"] for r in ran)
        out.append({"how": label, "programs": len(got), "ran": len(ran),
                    "outcomes": ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
                    "changed": sum(r["watched_changed"] for r in ran),
                    "tmp": sum(r["wrote_host_tmp"] for r in ran),
                    "leaked": sum(r["leaked"] for r in ran), "left": sum(r["left_processes"] for r in ran),
                    "slowest": max(r.get("seconds", r.get("sandbox_s", 0.0)) for r in ran),
                    "went_on": "every step" if all(r.get("run_went_on", True) for r in ran) else "no",
                    "harmful": _harm(got)})
    return out


def _harm(got: list[dict]) -> str:
    """The programs that changed, dropped or leaked something or killed their caller, and those not run."""
    harm = [r["program"] + (" (killed its caller)" if r["outcome"] == "caller_killed" else "") for r in got
            if any(r.get(k) for k in HARM) or r["outcome"] == "caller_killed"]
    skipped = [r["program"] for r in got if r["outcome"] == "skipped"]
    why = next((r["detail"] for r in got if r["outcome"] == "skipped"), "")
    return ", ".join(harm or ["none"]) + (f"; not run: {', '.join(skipped)} ({why})" if skipped else "")


def _meta() -> dict:
    h, t = _newest(HOSTILE)[0], [r for r in _newest(TRAIN) if r.get("summary")][0]
    return {"commit": h["commit"], "machine": h["machine"], "date": h["date"], "train_commit": t["commit"],
            "steps": t["train_steps"], "wall": t["wall_s"],
            "as_root": "as root" if h["as_root"] else "not root"}


MODES = Table(
    rows=_mode_rows,
    columns=(Column("suite", "{how}"), Column("programs run", "{ran} of {programs}"),
             Column("outcomes", "{outcomes}"), Column("watched folders changed", "{changed}"),
             Column("files left in /tmp, /dev/shm", "{tmp}"), Column("planted secrets leaked", "{leaked}"),
             Column("processes left", "{left}"), Column("slowest", "{slowest:.2f} s"),
             Column("the ones that did harm", "{harmful}")),
    note="`python benchmarks/sandbox_hostile.py` and `python benchmarks/sandbox_hostile_train.py` at "
         "commit {commit} ({machine}, {date}, {as_root}); the training run's {steps} steps took "
         "{wall:seconds} and went on after every program. Raw rows: "
         "`benchmarks/results/sandbox_hostile.jsonl`, `benchmarks/results/sandbox_hostile_train.jsonl`.",
    figures=lambda _: _meta(),
)


def _speed_rows() -> list[dict]:
    got = _newest(SPEED)
    out = []
    for w in sorted({r["workers"] for r in got}):
        med = {m: statistics.median(r["programs_per_s"] for r in got if r["workers"] == w and r["mode"] == m)
               for m in ("bwrap", "process")}
        runs = sum(1 for r in got if r["workers"] == w and r["mode"] == "bwrap")
        out.append({"workers": w, **med, "runs": runs})
    return out


SPEED_TABLE = Table(
    rows=_speed_rows,
    columns=(Column("workers", "{workers}"), Column("bwrap, programs / s", "{bwrap:.1f}"),
             Column("process, programs / s", "{process:.1f}")),
    note="Medians of {runs} runs of a batch of 32 quick programs through `SandboxPool` (`python "
         "benchmarks/sandbox_throughput.py`, commit {commit}, {machine}, {date}); raw rows: "
         "`benchmarks/results/sandbox_throughput.jsonl`.",
    figures=lambda r: {**_newest(SPEED)[0], "runs": r[0]["runs"]},
)

INTRO = Text(
    "The suite: {n} hostile programs (benchmarks/sandbox_programs.py), each after a correct `solve` so the "
    "reward says whether the attack disturbed the scoring (the forging ones after a wrong one): a program "
    "whose attack failed without an exception still passes its tests, which is the right reward.",
    figures=lambda: {"n": len([r for r in _newest(HOSTILE) if r["mode"] == "bwrap"])}, wrap=105,
)

BLOCKS = [Block(PAGE, "code-hostile", (INTRO, MODES)), Block(PAGE, "code-throughput", (SPEED_TABLE,))]
