"""docs/search.md's tree-against-flat and MCTS-against-flat tables, from benchmarks/results/tree_*.jsonl and
mcts_*.jsonl (rows written by benchmarks/tree_vs_flat.py); scripts/update_readme.py calls `render_tree`."""

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
TREE_START, TREE_END = "<!-- tree-results:start -->", "<!-- tree-results:end -->"
SEARCH_START, SEARCH_END = "<!-- search-results:start -->", "<!-- search-results:end -->"
GSM8K_START, GSM8K_END = "<!-- search-gsm8k:start -->", "<!-- search-gsm8k:end -->"
MCTS_START, MCTS_END = "<!-- mcts-results:start -->", "<!-- mcts-results:end -->"
BEAM_START, BEAM_END = "<!-- beam-cache:start -->", "<!-- beam-cache:end -->"
MCTS_PARTS = {"w": "width {}", "b": "budget {} tokens", "s": "step-verifier value"}


def _runs(path: Path) -> tuple[list[dict], dict]:
    """(the per-run rows, the summary) of the last benchmark recorded in `path`."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    last = max(i for i, r in enumerate(rows) if r.get("summary"))
    first = max((i + 1 for i, r in enumerate(rows[:last]) if r.get("summary")), default=0)
    return rows[first:last], rows[last]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def arm_label(arm: str) -> str:
    """`tree-2x4-at6` -> 'tree 2x4, branch at 6'; `mcts-w3-b150` -> 'mcts, width 3, budget 150 tokens'."""
    if arm == "flat":
        return "flat"
    if arm.startswith("mcts"):
        return ", ".join(["mcts", *(MCTS_PARTS[p[0]].format(p[1:]) for p in arm.split("-")[1:])])
    widths, at = arm[len("tree-"):].split("-at")
    return f"tree {widths}, branch at {at.replace('-', ', ')}"


def interpolate(curve: list[list[float]], axis: int, x: float) -> float | None:
    """The curve's accuracy at `x` on axis 1 (tokens) or 2 (seconds), linear between evaluations."""
    pts = [(c[axis], c[3]) for c in curve]
    for (x0, a0), (x1, a1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return a0 if x1 == x0 else a0 + (a1 - a0) * (x - x0) / (x1 - x0)
    return None


def tree_table(path: Path) -> str:
    """Per arm: accuracy per seed and mean, tokens and seconds against flat; flat at equal tokens, seconds."""
    runs, s = _runs(path)
    lines = ["| arm | held-out accuracy per seed | mean | generated tokens (vs flat) | training s (vs flat) "
             "| flat's accuracy at equal tokens | flat's accuracy at equal seconds |",
             "|---|---|---|---|---|---|---|"]
    for arm in dict.fromkeys(r["arm"] for r in runs):
        f = s[arm]
        seeds = " / ".join(_pct(a) for a in f["final_accuracy"])
        tokens, secs = f"{f['tokens'] / 1e6:.2f} M", f"{f['train_s']:.0f}"
        if arm != "flat":
            tokens += f" ({f['tokens_vs_flat']:.2f}x)"
            secs += f" ({f['train_s_vs_flat']:.2f}x)"
        eq_t = _pct(f.get("flat_accuracy_at_equal_tokens")) if arm != "flat" else ""
        eq_s = _pct(f.get("flat_accuracy_at_equal_train_s")) if arm != "flat" else ""
        if arm != "flat" and f.get("flat_accuracy_at_equal_train_s") is None:   # a flat run ended sooner
            end = min(r["train_s"] for r in runs if r["arm"] in ("flat", arm))   # every run reached it
            both = {a: [interpolate(r["curve"], 2, end) for r in runs if r["arm"] == a]
                    for a in ("flat", arm)}
            eq_s = (f"{_pct(sum(both['flat']) / len(both['flat']))} (at {end:.0f} s, where every run of both "
                    f"arms is; this arm {_pct(sum(both[arm]) / len(both[arm]))})")
        lines.append(f"| {arm_label(arm)} | {seeds} | {_pct(f['mean_final_accuracy'])} | {tokens} | {secs} "
                     f"| {eq_t} | {eq_s} |")
    r0 = runs[0]
    lines += ["", f"{len({r['seed'] for r in runs})} seeds, {r0['steps']} steps each; raw rows: "
              f"`benchmarks/results/{path.name}`; machine: {r0['machine']}, one thread a run, "
              f"{r0['parallel']} runs at once; commit {r0['commit']}, {r0['date']}; command: "
              f"`{s['command']}`."]
    return "\n".join(lines)


def tree_results(pattern: str = "tree_*.jsonl") -> str:
    """A measured block of docs/search.md: every file matching `pattern`, one section each."""
    out = []
    for path in sorted(RESULTS.glob(pattern)):
        runs, _ = _runs(path)
        title = f"#### {runs[0]['config']} {' '.join(runs[0]['overrides'])}".rstrip()
        out.append(f"{title}\n\n{tree_table(path)}")
    return "\n\n".join(out) or "(no runs recorded yet)"


def policy_of(row: dict) -> str:
    """The policy a search row ran (rows before the field existed: the starting model)."""
    return row.get("policy", "starting model (builtin:arith-demo)")


def _labels(rows: list[dict]) -> list[str]:
    """Each row's label; where a file's rows split steps at different separators, or were sampled with
    different seeds, with its separator and seed."""
    many = len({r["step_separator"] for r in rows if r.get("step_separator")}) > 1
    seeds = len({r.get("seed", 0) for r in rows}) > 1
    return [r["label"] + (f" (steps end at `{r['step_separator']!r}`)" if many and r.get("step_separator")
                          else "") + (f", seed {r.get('seed', 0)}" if seeds else "") for r in rows]


def search_table(raw: Path = RESULTS / "search_demo.jsonl") -> str:
    """docs/search.md's search-at-inference table: every row of a raw file (default search_demo.jsonl);
    where rows keep oracle_accuracy (pass@N of the samples), a column for it."""
    rows = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    oracle = any("oracle_accuracy" in r for r in rows)
    lines = ["| policy | search | accuracy | " + ("pass@N of its samples | " if oracle else "")
             + "generated tokens / problem | wall s (search) | problems | commit, date |",
             "|---|---|---|---|---|---|---|" + ("---|" if oracle else "")]
    for r, label in zip(rows, _labels(rows)):
        cell = (f" {r['oracle_accuracy']:.3f} |" if "oracle_accuracy" in r else " |") if oracle else ""
        lines.append(f"| {policy_of(r)} | {label} | {r['accuracy']:.3f} |{cell} "
                     f"{r['tokens_per_problem']:.1f} | {r['seconds']:.1f} | {int(r['num_problems'])} "
                     f"| {r['commit']}, {r['date'][:10]} |")
    first = rows[0]
    lines += ["", f"{first['cpu']}, {first['threads']} thread a row"]
    return "\n".join(lines)


def same_problems(raw: Path) -> str:
    """For each smaller problem count in a raw file: every row's accuracy (and pass@N) on those first N
    problems, from the rows' per-problem records; empty when every row ran the same problems."""
    rows = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    sizes = sorted({int(r["num_problems"]) for r in rows})
    out = ""
    for n in sizes[:-1]:
        cells = []
        for r, label in zip(rows, _labels(rows)):
            if len(r.get("correct_by_problem", [])) < n:
                continue
            cell = f"{label} {_pct(sum(r['correct_by_problem'][:n]) / n)}"
            if "oracle_by_problem" in r:
                cell += f" (pass@{r['budget']} of its samples {_pct(sum(r['oracle_by_problem'][:n]) / n)})"
            cells.append(cell)
        out += f"\n\nOn the first {n} problems, every row on the same problems: " + "; ".join(cells) + "."
    return out


def search_row() -> str:
    """The README's search row: the starting model's greedy, best and best MCTS rows; the trained policy's
    greedy and best, where the raw file has them."""
    rows = [json.loads(line) for line in (RESULTS / "search_demo.jsonl").read_text().splitlines()
            if line.strip()]
    start = [r for r in rows if policy_of(r) == policy_of({})]
    trained = [r for r in rows if policy_of(r) != policy_of({})]

    def at(r: dict) -> str:
        return f"{r['label']} {_pct(r['accuracy'])} at {r['tokens_per_problem']:.0f}"

    g, best = start[0], max(start, key=lambda r: r["accuracy"])
    mcts = max((r for r in start if r["search"] == "mcts"), key=lambda r: r["accuracy"])
    text = (f"starting model: greedy {_pct(g['accuracy'])} at {g['tokens_per_problem']:.0f} tokens/problem; "
            f"{at(best)}; {at(mcts)}")
    for name in dict.fromkeys(policy_of(r) for r in trained):
        mine = [r for r in trained if policy_of(r) == name]
        text += f"; {name}: {'; '.join(at(r) for r in (mine[0], max(mine, key=lambda r: r['accuracy'])))}"
    return (f"| search at inference (`grpokit eval --search`, demo, {int(g['num_problems'])} held-out "
            f"problems) | {text} | [search](docs/search.md), `benchmarks/results/search_demo.jsonl` |")


def gsm8k_rows() -> list[str]:
    """The README's GSM8K search row (SmolLM2-135M-Instruct), where search_gsm8k.jsonl exists: each
    method on the most problems, pass@N of the samples, and the smaller runs on their first N."""
    path = RESULTS / "search_gsm8k.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    most = max(int(r["num_problems"]) for r in rows)
    full = [r for r in rows if int(r["num_problems"]) == most]
    cells = [f"{r['label']} {_pct(r['accuracy'])}" for r in full]
    ceiling = next((r for r in full if "oracle_accuracy" in r), None)
    if ceiling is not None:
        cells.append(f"pass@{ceiling['budget']} of the samples {_pct(ceiling['oracle_accuracy'])}")
    text = "; ".join(cells)
    for n in sorted({int(r["num_problems"]) for r in rows} - {most}):   # every row read on the first n
        mine = [r for r in rows if len(r.get("correct_by_problem", [])) >= n]
        text += f"; on the first {n}: " + ", ".join(
            f"{r['label']} {_pct(sum(r['correct_by_problem'][:n]) / n)}" for r in mine)
    return [f"| search at inference (SmolLM2-135M-Instruct, GSM8K test, first {most} problems) | {text} | "
            "[search](docs/search.md), `benchmarks/results/search_gsm8k.jsonl` |"]


def tree_rows() -> list[str]:
    """The README's tree rows: each tree_*.jsonl's tree arms against flat."""
    out = []
    for path in sorted(RESULTS.glob("tree_*.jsonl")):
        runs, s = _runs(path)
        for arm in (a for a in dict.fromkeys(r["arm"] for r in runs) if a != "flat"):
            f = s[arm]
            task = "three-term sums" if "task.terms=3" in runs[0]["overrides"] else runs[0]["config"]
            out.append(f"| tree rollouts for training ({task}, {arm_label(arm)}; "
                       f"{len(f['seeds'])} seeds, {runs[0]['steps']} steps) | held-out "
                       f"{_pct(f['mean_final_accuracy'])} vs flat {_pct(s['flat']['mean_final_accuracy'])} "
                       "with "
                       f"{f['tokens_vs_flat']:.2f}x the generated tokens and {f['train_s_vs_flat']:.2f}x the "
                       f"training seconds; flat at equal tokens {_pct(f['flat_accuracy_at_equal_tokens'])} | "
                       f"[search](docs/search.md), `benchmarks/results/{path.name}` |")
    return out


def beam_cache_table(raw: Path = RESULTS / "beam_cache.jsonl") -> str:
    """docs/search.md's kept-cache measurement (benchmarks/beam_cache.py): per path, seconds per problem,
    ms per generated token and prefill tokens, over the problems whose rows carry no note (a note says
    the core was shared), and the ratio of the readable path's ms per token to the kept path's."""
    rows = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    clean = [r for r in rows if "note" not in r]
    lines = ["| path | problems | s / problem | generated tokens / problem | ms / generated token | "
             "prefill tokens / problem |", "|---|---|---|---|---|---|"]
    per_token = {}
    for path, name in (("kept", "kept cache"), ("readable", "readable (re-prefill each round)")):
        rs = [r for r in clean if r["path"] == path]
        s, t = sum(r["seconds"] for r in rs), sum(r["tokens"] for r in rs)
        per_token[path] = 1000 * s / t
        lines.append(f"| {name} | {len(rs)} | {s / len(rs):.1f} | {t / len(rs):.0f} | "
                     f"{per_token[path]:.1f} | {sum(r['prefill_tokens'] for r in rs) / len(rs):.0f} |")
    r0, noted = rows[0], len({r["problem"] for r in rows if "note" in r})
    lines += ["", f"{r0['model']}, {r0['task']}, beam {r0['budget']}x{r0['expand']} (step verifier, steps "
              f"end at `{r0['step_separator']!r}`), {r0['cpu']}, {r0['threads']} thread, {r0['commit']}, "
              f"{r0['date'][:10]}: the kept cache decodes a generated token "
              f"{per_token['readable'] / per_token['kept']:.2f}x faster"
              + (f" ({noted} problem left out: its rows note a shared core)" if noted else "") + "."]
    return "\n".join(lines)


def render_tree(text: str) -> str:
    """docs/search.md with its generated blocks redrawn: the search tables (search_demo.jsonl and
    search_gsm8k.jsonl), the tree tables (tree_*.jsonl) and the MCTS tables (mcts_*.jsonl)."""
    text = re.sub(re.escape(SEARCH_START) + ".*?" + re.escape(SEARCH_END),
                  lambda _: f"{SEARCH_START}\n{search_table()}\n{SEARCH_END}", text, flags=re.S)
    gsm8k = RESULTS / "search_gsm8k.jsonl"
    if gsm8k.is_file():      # SmolLM2-135M-Instruct on GSM8K test (benchmarks/search_demo.py --config)
        block = search_table(gsm8k) + same_problems(gsm8k)
        text = re.sub(re.escape(GSM8K_START) + ".*?" + re.escape(GSM8K_END),
                      lambda _: f"{GSM8K_START}\n{block}\n{GSM8K_END}", text, flags=re.S)
    if (RESULTS / "beam_cache.jsonl").is_file():
        text = re.sub(re.escape(BEAM_START) + ".*?" + re.escape(BEAM_END),
                      lambda _: f"{BEAM_START}\n{beam_cache_table()}\n{BEAM_END}", text, flags=re.S)
    for start, end, pattern in ((TREE_START, TREE_END, "tree_*.jsonl"),
                                (MCTS_START, MCTS_END, "mcts_*.jsonl")):
        text = re.sub(re.escape(start) + ".*?" + re.escape(end),
                      lambda _, s=start, e=end, p=pattern: f"{s}\n{tree_results(p)}\n{e}", text, flags=re.S)
    return text
