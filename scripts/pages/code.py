"""docs/code.md's measured blocks: the hostile programs in both sandbox modes and through a training run,
the pool's throughput (benchmarks/results/sandbox_*.jsonl)."""

from __future__ import annotations

import statistics
from collections import Counter

from .raw import rows
from .render import Block, Column, Table, Text, headline_row

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

HOUR = "code_smollm2_hour"            # the GRPO hour's eval.jsonl and metrics.jsonl rows
HUMANEVAL = "code_smollm2_humaneval.jsonl"


def _hour() -> dict:
    evals = {r["tag"]: r for r in rows(f"{HOUR}_eval.jsonl")}
    steps = [r for r in rows(f"{HOUR}_metrics.jsonl") if "time/step" in r]
    he = {r["side"]: r for r in rows(HUMANEVAL)}
    reward = sum(r["time/reward"] for r in steps) / sum(r["time/step"] for r in steps)
    info = rows(f"{HOUR}_run.jsonl")[0]
    return {"before": evals["before"], "after": evals["after"], "steps": len(steps), "he": he,
            "minutes": sum(r["time/step"] for r in steps) / 60, "reward_share": reward, **info}


def _smollm2_rows() -> list[dict]:
    h = _hour()
    return [{"what": f"built-in functions, held out ({int(h['before']['num_problems'])} never trained on), "
                     "greedy, all hidden tests pass", "before": h["before"]["accuracy"],
             "after": h["after"]["accuracy"], "tests": h["after"]["rewards/code_tests"],
             "tests0": h["before"]["rewards/code_tests"]},
            {"what": f"HumanEval ({int(h['he']['before']['num_problems'])} problems), greedy pass@1",
             "before": h["he"]["before"]["accuracy"], "after": h["he"]["after"]["accuracy"],
             "tests": h["he"]["after"]["rewards/code_tests"],
             "tests0": h["he"]["before"]["rewards/code_tests"]}]


SMOLLM2 = Table(
    rows=_smollm2_rows,
    columns=(Column("evaluation", "{what}"), Column("before", "{before:percent}"),
             Column("after", "{after:percent}"), Column("tests passed, before -> after",
                                                       "{tests0:percent} -> {tests:percent}")),
    note="`{command}` ({machine}, {threads} thread, commit {commit}, {date}): {steps} steps in "
         "{minutes:.0f} training minutes (evaluations off the clock), the other core running other work; "
         "the reward phase (programs in the sandbox) took {reward_share:percent} of the step time. "
         "Held out: {b_right} -> {a_right} of {n} functions. HumanEval: `{he_command}` (before: the base "
         "model, commit {hb_commit}, {hb_threads} thread; after: commit {ha_commit}, {ha_threads} "
         "threads). Raw rows: "
         "`benchmarks/results/code_smollm2_hour_*.jsonl`, `benchmarks/results/code_smollm2_humaneval.jsonl`.",
    figures=lambda _: _smollm2_figures(),
)


def _smollm2_figures() -> dict:
    h = _hour()
    n = int(h["before"]["num_problems"])
    return {**h, "he_command": h["he"]["after"]["command"], "n": n,
            "b_right": round(h["before"]["accuracy"] * n), "a_right": round(h["after"]["accuracy"] * n),
            "hb_commit": h["he"]["before"]["commit"], "hb_threads": h["he"]["before"]["threads"],
            "ha_commit": h["he"]["after"]["commit"], "ha_threads": h["he"]["after"]["threads"]}


def headline() -> list[dict]:
    h = _hour()
    return [headline_row(
        "code: SmolLM2-135M-Instruct, the built-in code task (programs run in the bubblewrap sandbox), "
        "{minutes:.0f} min of GRPO on one core, seed 0",
        "held-out functions {b:percent} -> {a:percent} (all hidden tests); HumanEval greedy {hb:percent} -> "
        "{ha:percent}; 42 hostile programs: nothing changed, leaked or left behind", "code", "code.md",
        "code_smollm2_*, sandbox_hostile*.jsonl", minutes=h["minutes"], b=h["before"]["accuracy"],
        a=h["after"]["accuracy"], hb=h["he"]["before"]["accuracy"], ha=h["he"]["after"]["accuracy"])]


BLOCKS = [Block(PAGE, "code-hostile", (INTRO, MODES)), Block(PAGE, "code-throughput", (SPEED_TABLE,)),
          Block(PAGE, "code-smollm2", (SMOLLM2,))]
