"""docs/code.md's measured blocks: the code demo's seeds (benchmarks/results/code_demo_seeds.jsonl), the
SmolLM2 hour, the hostile programs in both sandbox modes and through a training run, the pool's throughput
(benchmarks/results/sandbox_*.jsonl)."""

from __future__ import annotations

import statistics
from collections import Counter

from .raw import newest_group, rows
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
    h, he = _hour(), _hour()["he"]
    pct = "{:.1%}".format

    def row(what: str, key: str, src: dict, tests: str | None) -> dict:
        b, a = src["before"], src["after"]
        return {"what": what, "before": b[key], "after": a[key],
                "tests": "" if tests is None else f"{pct(b[tests])} -> {pct(a[tests])}"}

    n_he = int(he["before"]["num_problems"])
    out = [row(f"built-in functions, held out ({int(h['before']['num_problems'])} never trained on), greedy, "
               "all hidden tests pass", "accuracy", h, "rewards/code_tests"),
           row(f"HumanEval ({n_he} problems), greedy pass@1", "accuracy", he, "rewards/code_tests")]
    for k in ("pass@1", "pass@8"):
        if k in he["before"] and k in he["after"]:
            out.append(row(f"HumanEval ({n_he} problems), {k} of 8 samples at temperature 1.0", k, he, None))
    return out


SMOLLM2 = Table(
    rows=_smollm2_rows,
    columns=(Column("evaluation", "{what}"), Column("before", "{before:percent}"),
             Column("after", "{after:percent}"), Column("tests passed, before -> after", "{tests}")),
    note="`{command}` ({machine}, {threads} thread, commit {commit}, {date}): {steps} steps in "
         "{minutes:.0f} training minutes (evaluations off the clock), the other core running other work; "
         "the reward phase (programs in the sandbox) took {reward_share:percent} of the step time. "
         "Held out: {b_right} -> {a_right} of {n} functions. HumanEval: `{he_command}` (before: the base "
         "model, commit {hb_commit}, threads {hb_threads}; after: commit {ha_commit}, threads "
         "{ha_threads}). Raw rows: "
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


OVERLAP = "reward_overlap.jsonl"     # benchmarks/reward_overlap.py


def _overlap_rows() -> list[dict]:
    """The newest overlap benchmark: each side's means, then the ratios on / off."""
    summary = [r for r in rows(OVERLAP) if r.get("summary")][-1]
    out = [{"side": side, **summary[side]} for side in ("off", "on")]
    return out + [{"side": "on / off", **summary["ratio_on_over_off"]}]


OVERLAP_TABLE = Table(
    rows=_overlap_rows,
    columns=(Column("reward.overlap", "{side}"), Column("step", "{step_s:.3f}"),
             Column("scoring (its own wall time)", "{reward_s:.3f}"),
             Column("the step waited", "{reward_wait_s:.3f}"), Column("share of the step waiting",
                                                                     "{wait_share:.3f}")),
    note="Seconds per step (ratios in the last row), means over each side's runs after their first step: "
         "`{command}` at commit {commit} ({machine}, {date}); {note}. Both sides trained the same numbers: "
         "{same_numbers}. Raw rows: `benchmarks/results/reward_overlap.jsonl`.",
    figures=lambda _: {**[r for r in rows(OVERLAP) if r.get("summary")][-1],
                       "note": [r for r in rows(OVERLAP) if not r.get("summary")][-1].get("note", "")},
)

CODE_DEMO = "code_demo_seeds.jsonl"   # scripts/demo_seeds.py --config configs/code_demo.yaml


def _demo_rows() -> list[dict]:
    """The newest set of the code demo's seeds, by seed: hidden tests passed and all-pass, before / after."""
    got = sorted(newest_group(rows(CODE_DEMO)), key=lambda r: r["seed"])
    tests = "rewards/code_tests"
    return [{**r, "tests0": r["eval_before"][tests], "tests": r["eval_after"][tests],
             "change": r["eval_after"][tests] - r["eval_before"][tests], "train_min": r["train_s"] / 60}
            for r in got]


def _demo_figures(found: list[dict]) -> dict:
    gains = [r["change"] for r in found]
    return {**found[0], "gain": statistics.mean(gains), "low": min(gains), "high": max(gains),
            "seeds": [r["seed"] for r in found], "afters": [r["tests"] for r in found]}


DEMO_TABLE = Table(
    rows=_demo_rows,
    columns=(Column("seed", "{seed}"), Column("held-out functions", "{problems}"),
             Column("tests passed before", "{tests0:percent}"), Column("after", "{tests:percent}"),
             Column("change", "{change:points}"), Column("all five pass, before -> after",
                                                         "{before:percent} -> {after:percent}"),
             Column("steps", "{steps}"), Column("training", "{train_min:.1f} min"),
             Column("wall", "{wall_s:seconds}")),
    note="Mean change {gain:points} (the goal: +25 pt). `python scripts/demo_seeds.py --config "
         "configs/code_demo.yaml` (each seed: `grpokit train configs/code_demo.yaml run.seed=S`), commit "
         "{commit}, {machine}, threads: {threads} (torch's, one per core), {date}; training = the steps' "
         "own seconds (at most 10 "
         "minutes, `run.max_minutes`), wall = the whole command with its two evaluations of the 229 "
         "held-out functions. Raw rows: `benchmarks/results/code_demo_seeds.jsonl`.",
    figures=_demo_figures,
)


def headline() -> list[dict]:
    h, demo = _hour(), _demo_rows()
    d = _demo_figures(demo)
    he = h["he"]
    n_hostile = len([r for r in _newest(HOSTILE) if r["mode"] == "bwrap"])
    sampled = (" pass@8 {p8b:percent} -> {p8a:percent};" if "pass@8" in he["after"] else "")
    return [headline_row(
        "code: `grpokit train configs/code_demo.yaml` (the shipped char model, {n} held-out functions, <= 10 "
        "min on 2 cores), and SmolLM2-135M-Instruct ({minutes:.0f} min on one core); programs run in the "
        "bubblewrap sandbox",
        "demo: hidden tests passed {before0:percent} -> {afters:pct}%, seeds {seeds} (mean {gain:points}); "
        "SmolLM2: held-out functions {b:percent} -> {a:percent}, HumanEval greedy {hb:percent} -> "
        "{ha:percent};" + sampled + " {hostile} hostile programs: nothing changed, leaked or left behind",
        "code", "code.md", f"{CODE_DEMO}, code_smollm2_*, sandbox_hostile*.jsonl", n=demo[0]["problems"],
        before0=demo[0]["tests0"], minutes=h["minutes"], b=h["before"]["accuracy"], a=h["after"]["accuracy"],
        hb=he["before"]["accuracy"], ha=he["after"]["accuracy"], p8b=he["before"].get("pass@8"),
        p8a=he["after"].get("pass@8"), hostile=n_hostile, **d)]


BLOCKS = [Block(PAGE, "code-demo", (DEMO_TABLE,)), Block(PAGE, "code-hostile", (INTRO, MODES)),
          Block(PAGE, "code-throughput", (SPEED_TABLE,)), Block(PAGE, "code-overlap", (OVERLAP_TABLE,)),
          Block(PAGE, "code-smollm2", (SMOLLM2,))]
