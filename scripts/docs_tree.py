"""docs/search.md's tree-against-flat and MCTS-against-flat tables, from benchmarks/results/tree_*.jsonl and
mcts_*.jsonl (rows written by benchmarks/tree_vs_flat.py); scripts/update_readme.py calls `render_tree`."""

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
TREE_START, TREE_END = "<!-- tree-results:start -->", "<!-- tree-results:end -->"
MCTS_START, MCTS_END = "<!-- mcts-results:start -->", "<!-- mcts-results:end -->"
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


def render_tree(text: str) -> str:
    """docs/search.md with its tree block (tree_*.jsonl) and its MCTS block (mcts_*.jsonl) redrawn."""
    for start, end, pattern in ((TREE_START, TREE_END, "tree_*.jsonl"),
                                (MCTS_START, MCTS_END, "mcts_*.jsonl")):
        text = re.sub(re.escape(start) + ".*?" + re.escape(end),
                      lambda _, s=start, e=end, p=pattern: f"{s}\n{tree_results(p)}\n{e}", text, flags=re.S)
    return text
