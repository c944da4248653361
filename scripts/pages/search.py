"""docs/search.md's blocks and the README's search and tree rows: search at inference (search_demo.jsonl,
search_gsm8k.jsonl: benchmarks/search_demo.py), the kept beam cache (beam_cache.jsonl), tree and MCTS
rollouts against flat GRPO (tree_*.jsonl, mcts_*.jsonl: benchmarks/tree_vs_flat.py)."""

from __future__ import annotations

from pathlib import Path

from .raw import RESULTS, benchmarks, interpolate, rows
from .render import Block, Column, Table, Text, fill, headline_row

MCTS_PARTS = {"w": "width {}", "b": "budget {} tokens", "s": "step-verifier value"}
START_POLICY = "starting model (builtin:arith-demo)"


def arm_label(arm: str) -> str:
    """`tree-2x4-at6` -> 'tree 2x4, branch at 6'; `mcts-w3-b150` -> 'mcts, width 3, budget 150 tokens'."""
    if arm == "flat":
        return "flat"
    if arm.startswith("mcts"):
        return ", ".join(["mcts", *(MCTS_PARTS[p[0]].format(p[1:]) for p in arm.split("-")[1:])])
    widths, at = arm[len("tree-") :].split("-at")
    return f"tree {widths}, branch at {at.replace('-', ', ')}"


def curve_at(curve: list[list[float]], axis: int, x: float) -> float | None:
    """A training curve's accuracy at `x` on axis 1 (tokens) or 2 (seconds), linear between evaluations."""
    return interpolate([(c[axis], c[3]) for c in curve], x)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def policy_of(row: dict) -> str:
    """The policy a search row ran (rows before the field existed: the starting model)."""
    return row.get("policy", START_POLICY)


# ---- search at inference


def _labels(found: list[dict]) -> list[str]:
    """Each row's label; where a file's rows split steps at different separators, or were sampled with
    different seeds, with its separator and seed."""
    many = len({r["step_separator"] for r in found if r.get("step_separator")}) > 1
    seeds = len({r.get("seed", 0) for r in found}) > 1
    return [
        r["label"]
        + (f" (steps end at `{r['step_separator']!r}`)" if many and r.get("step_separator") else "")
        + (f", seed {r.get('seed', 0)}" if seeds else "")
        for r in found
    ]


def _search_rows(raw: Path) -> list[dict]:
    found = rows(raw)
    return [
        {
            **r, "policy": policy_of(r), "name": label, "day": r["date"][:10],
            "oracle": f"{r['oracle_accuracy']:.3f}" if "oracle_accuracy" in r else "",
        }
        for r, label in zip(found, _labels(found))
    ]


def _search_columns(found: list[dict]) -> list[Column]:
    oracle = any("oracle_accuracy" in r for r in found)
    return [
        Column("policy", "{policy}"), Column("search", "{name}"), Column("accuracy", "{accuracy:.3f}"),
        *([Column("pass@N of its samples", "{oracle}")] if oracle else []),
        Column("generated tokens / problem", "{tokens_per_problem:.1f}"),
        Column("wall s (search)", "{seconds:.1f}"), Column("problems", "{num_problems:.0f}"),
        Column("commit, date", "{commit}, {day}"),
    ]


def search_spec(raw: Path) -> Table:
    """Every row of a raw search file; where rows keep oracle_accuracy (pass@N of the samples), a column."""
    return Table(
        rows=lambda: _search_rows(raw), columns=_search_columns, note="{cpu}, {threads} thread a row",
        figures=lambda found: found[0],
    )


def search_table(raw: Path = RESULTS / "search_demo.jsonl") -> str:
    """The search table of a raw file, as docs/search.md shows it (benchmarks/search_demo.py prints it)."""
    return search_spec(raw).text({})


def _same_problems(raw: Path) -> str:
    """For each smaller problem count in a raw file: every row's accuracy (and pass@N) on those first N."""
    found = rows(raw)
    out = ""
    for n in sorted({int(r["num_problems"]) for r in found})[:-1]:
        cells = []
        for r, label in zip(found, _labels(found)):
            if len(r.get("correct_by_problem", [])) < n:
                continue
            cell = f"{label} {_pct(sum(r['correct_by_problem'][:n]) / n)}"
            if "oracle_by_problem" in r:
                cell += f" (pass@{r['budget']} of its samples {_pct(sum(r['oracle_by_problem'][:n]) / n)})"
            cells.append(cell)
        out += f"\n\nOn the first {n} problems, every row on the same problems: " + "; ".join(cells) + "."
    return out


GSM8K = RESULTS / "search_gsm8k.jsonl"
SEARCH_GSM8K = Table(
    rows=lambda: _search_rows(GSM8K), columns=_search_columns, note="{cpu}, {threads} thread a row{same}",
    figures=lambda found: {**found[0], "same": _same_problems(GSM8K)},
)


def _at(r: dict) -> str:
    return f"{r['label']} {_pct(r['accuracy'])} at {r['tokens_per_problem']:.0f}"


def _search_headline() -> dict:
    found = rows("search_demo.jsonl")
    start = [r for r in found if policy_of(r) == START_POLICY]
    g, best = start[0], max(start, key=lambda r: r["accuracy"])
    mcts = max((r for r in start if r["search"] == "mcts"), key=lambda r: r["accuracy"])
    text = (f"starting model: greedy {_pct(g['accuracy'])} at {g['tokens_per_problem']:.0f} tokens/problem; "
            f"{_at(best)}; {_at(mcts)}")
    trained = [r for r in found if policy_of(r) != START_POLICY]
    for name in dict.fromkeys(policy_of(r) for r in trained):
        mine = [r for r in trained if policy_of(r) == name]
        text += f"; {name}: {'; '.join(_at(r) for r in (mine[0], max(mine, key=lambda r: r['accuracy'])))}"
    return headline_row(
        "search at inference (`grpokit eval --search`, demo, {n:.0f} held-out problems)", "{text}", "search",
        "search.md", "search_demo.jsonl", n=g["num_problems"], text=text,
    )


def _gsm8k_headline() -> list[dict]:
    """Each method on the most problems, pass@N of the samples, and the smaller runs on their first N."""
    if not GSM8K.is_file():
        return []
    found = rows(GSM8K.name)
    most = max(int(r["num_problems"]) for r in found)
    full = [r for r in found if int(r["num_problems"]) == most]
    cells = [f"{r['label']} {_pct(r['accuracy'])}" for r in full]
    ceiling = next((r for r in full if "oracle_accuracy" in r), None)
    if ceiling is not None:
        cells.append(f"pass@{ceiling['budget']} of the samples {_pct(ceiling['oracle_accuracy'])}")
    text = "; ".join(cells)
    for n in sorted({int(r["num_problems"]) for r in found} - {most}):  # every row read on the first n
        mine = [r for r in found if len(r.get("correct_by_problem", [])) >= n]
        text += f"; on the first {n}: " + ", ".join(
            f"{r['label']} {_pct(sum(r['correct_by_problem'][:n]) / n)}" for r in mine
        )
    return [
        headline_row(
            "search at inference (SmolLM2-135M-Instruct, GSM8K test, first {most} problems)", "{text}",
            "search", "search.md", GSM8K.name, most=most, text=text,
        )
    ]


# ---- the kept beam cache


def _cache_rows() -> list[dict]:
    clean = [r for r in rows("beam_cache.jsonl") if "note" not in r]
    out = []
    for path, name in (("kept", "kept cache"), ("readable", "readable (re-prefill each round)")):
        rs = [r for r in clean if r["path"] == path]
        s, t = sum(r["seconds"] for r in rs), sum(r["tokens"] for r in rs)
        out.append(
            {
                "name": name, "n": len(rs), "s": s / len(rs), "t": t / len(rs), "per_token": 1000 * s / t,
                "prefill": sum(r["prefill_tokens"] for r in rs) / len(rs),
            }
        )
    return out


def _cache_figures(found: list[dict]) -> dict:
    all_rows = rows("beam_cache.jsonl")
    noted = len({r["problem"] for r in all_rows if "note" in r})
    r0 = all_rows[0]
    return {
        **r0, "sep": repr(r0["step_separator"]), "day": r0["date"][:10],
        "faster": found[1]["per_token"] / found[0]["per_token"],
        "left": f" ({noted} problem left out: its rows note a shared core)" if noted else "",
    }


BEAM_CACHE = Table(
    rows=_cache_rows,
    columns=(
        Column("path", "{name}"), Column("problems", "{n}"), Column("s / problem", "{s:.1f}"),
        Column("generated tokens / problem", "{t:.0f}"), Column("ms / generated token", "{per_token:.1f}"),
        Column("prefill tokens / problem", "{prefill:.0f}"),
    ),
    note="{model}, {task}, beam {budget}x{expand} (step verifier, steps end at `{sep}`), {cpu}, {threads} "
         "thread, "
    "{commit}, {day}: the kept cache decodes a generated token {faster:.2f}x faster{left}.",
    figures=_cache_figures,
)


# ---- tree and MCTS rollouts against flat GRPO, one section per raw file


def _equal_seconds(runs: list[dict], f: dict, arm: str) -> str:
    """Flat's accuracy at this arm's training seconds; where a flat run ended sooner, both arms read at the
    end every run of both reached."""
    if f.get("flat_accuracy_at_equal_train_s") is not None:
        return _pct(f["flat_accuracy_at_equal_train_s"])
    end = min(r["train_s"] for r in runs if r["arm"] in ("flat", arm))
    both = {a: [curve_at(r["curve"], 2, end) for r in runs if r["arm"] == a] for a in ("flat", arm)}
    return (
        f"{_pct(sum(both['flat']) / len(both['flat']))} (at {end:.0f} s, where every run of both arms is; "
        f"this arm {_pct(sum(both[arm]) / len(both[arm]))})"
    )


def _arm_rows(runs: list[dict], s: dict) -> list[dict]:
    out = []
    for arm in dict.fromkeys(r["arm"] for r in runs):
        f, flat = s[arm], arm == "flat"
        out.append(
            {
                **f, "arm": arm_label(arm), "tokens_m": f["tokens"] / 1e6,
                "seeds": [_pct(a) for a in f["final_accuracy"]],
                "tokens_vs": "" if flat else fill(" ({tokens_vs_flat:.2f}x)", f),
                "secs_vs": "" if flat else fill(" ({train_s_vs_flat:.2f}x)", f),
                "eq_t": "" if flat else _pct(f.get("flat_accuracy_at_equal_tokens")),
                "eq_s": "" if flat else _equal_seconds(runs, f, arm),
            }
        )
    return out


ARM_COLUMNS = (
    Column("arm", "{arm}"), Column("held-out accuracy per seed", "{seeds}"),
    Column("mean", "{mean_final_accuracy:percent}"),
    Column("generated tokens (vs flat)", "{tokens_m:.2f} M{tokens_vs}"),
    Column("training s (vs flat)", "{train_s:.0f}{secs_vs}"),
    Column("flat's accuracy at equal tokens", "{eq_t}"), Column("flat's accuracy at equal seconds", "{eq_s}"),
)


def _section(path: Path) -> Table:
    runs, s = benchmarks(path.name)[-1]
    r0 = runs[0]
    return Table(
        rows=lambda: _arm_rows(runs, s), columns=ARM_COLUMNS,
        title=f"#### {r0['config']} {' '.join(r0['overrides'])}".rstrip(),
        note="{n} seeds, {steps} steps each; raw rows: `benchmarks/results/{file}`; machine: {machine}, one "
             "thread a "
        "run, {parallel} runs at once; commit {commit}, {date}; command: `{command}`.",
        figures=lambda _: {
            **r0, "n": len({r["seed"] for r in runs}), "file": path.name, "command": s["command"],
        },
    )


def sections(pattern: str):
    """The parts of a tree or MCTS block: every raw file matching `pattern`, one section each."""

    def parts() -> list:
        found = [_section(p) for p in sorted(RESULTS.glob(pattern))]
        return found or [Text("(no runs recorded yet)")]

    return parts


def _tree_headline() -> list[dict]:
    out = []
    for path in sorted(RESULTS.glob("tree_*.jsonl")):
        runs, s = benchmarks(path.name)[-1]
        task = "three-term sums" if "task.terms=3" in runs[0]["overrides"] else runs[0]["config"]
        for arm in (a for a in dict.fromkeys(r["arm"] for r in runs) if a != "flat"):
            out.append(
                headline_row(
                    "tree rollouts for training ({task}, {arm}; {n} seeds, {steps} steps)",
                    "held-out {mean_final_accuracy:percent} vs flat {flat:percent} with "
                    "{tokens_vs_flat:.2f}x the generated tokens and {train_s_vs_flat:.2f}x the training "
                    "seconds; flat at equal tokens {flat_accuracy_at_equal_tokens:percent}", "search",
                    "search.md", path.name, **s[arm], task=task, arm=arm_label(arm), n=len(s[arm]["seeds"]),
                    steps=runs[0]["steps"], flat=s["flat"]["mean_final_accuracy"],
                )
            )
    return out


def headline() -> list[dict]:
    return [_search_headline(), *_gsm8k_headline(), *_tree_headline()]


BLOCKS = [
    Block("docs/search.md", "search-results", (search_spec(RESULTS / "search_demo.jsonl"),)),
    Block("docs/search.md", "search-gsm8k", (SEARCH_GSM8K,)),
    Block("docs/search.md", "beam-cache", (BEAM_CACHE,)),
    Block("docs/search.md", "tree-results", sections("tree_*.jsonl")),
    Block("docs/search.md", "mcts-results", sections("mcts_*.jsonl")),
]
