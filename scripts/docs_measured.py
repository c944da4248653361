"""Measured tables of docs/experiments.md, docs/reward_models.md and docs/memory.md, generated from their raw
files under benchmarks/results/ (scripts/update_readme.py writes them; tests/cli/test_readme.py checks them).

Each block sits between `<!-- NAME:start -->` and `<!-- NAME:end -->` on its page; BLOCKS names them, and
docs_bench.py adds the `grpokit bench` tables of docs/performance.md and docs/precision.md.
"""

import json
import re
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
LABEL_KEYS = re.compile(r"^(variant|loss_type|scale_rewards|algorithm)=")


def rows(name: str) -> list[dict]:
    """The JSON lines of benchmarks/results/`name` (lines that are not JSON objects left out)."""
    return [json.loads(line) for line in (RESULTS / name).read_text().splitlines() if line.strip()]


def load(name: str):
    return json.loads((RESULTS / name).read_text())


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(header: list[str], lines: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in line) + " |" for line in lines])


def block(text: str, name: str, body: str) -> str:
    """`text` with the block NAME's body replaced (unchanged when the page has no such markers)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    return re.sub(
        re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{body}\n{end}", text, flags=re.S
    )


# ---- docs/experiments.md: the tables scripts/experiments.py wrote to benchmarks/results/experiments/*.md


def md_tables(name: str) -> tuple[list[list[list[str]]], str]:
    """The tables of experiments/NAME.md (each a list of rows of cells, header first) and its last line."""
    text = (RESULTS / "experiments" / f"{name}.md").read_text()
    tables = []
    for chunk in text.strip().split("\n\n"):
        lines = [ln for ln in chunk.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
        if lines:
            tables.append([[c.strip() for c in ln.strip("|").split("|")] for ln in lines])
    return tables, text.strip().splitlines()[-1]


def experiment(name: str, columns: list[str] | None = None, part: int | None = None) -> str:
    """experiments/NAME.md's tables (only `columns`, in that order, where given) and its wall-time line;
    `part`: only that table, and the wall-time line after the last one only."""
    tables, wall = md_tables(name)
    out = []
    for t in tables if part is None else [tables[part]]:
        keep = list(range(len(t[0]))) if columns is None else [t[0].index(c) for c in columns]
        body = [[LABEL_KEYS.sub("", r[0]) if i == 0 else r[i] for i in keep] for r in t[1:]]
        out.append(table([t[0][i] for i in keep], body))
    if part not in (None, len(tables) - 1):
        return "\n\n".join(out)
    return "\n\n".join(out) + f"\n\n{wall} Raw rows: `benchmarks/results/experiments/{name}.json`."


def experiments_index() -> str:
    """The list of experiments with each sweep's summed cell wall time (from its raw .md)."""
    spec = [
        ("group size k", "k", "5 G x 3 seeds", "G = 8 the default", "**holds** (G = 4 within noise)"),
        ("graduation", "graduation", "3 seeds", "groups graduate, the signal moves", "**holds**"),
        (
            "length weighting",
            "length length_chain",
            "2 tasks x 4 x 3 seeds",
            "the per-completion mean causes a length drift",
            "**does not hold here**: no drift under any loss type",
        ),
        ("std scaling", "std_scaling", "3 x 3 seeds", "low-variance groups amplified", "**holds**"),
        (
            "all-wrong groups",
            "all_wrong",
            "3 x 3 seeds",
            "no signal from all-wrong groups",
            "**holds**; no remedy helps at 0%",
        ),
        (
            "GRPO vs PPO cost",
            "grpo_vs_ppo",
            "2 x 3 seeds",
            "saves the critic; generation may dominate",
            "critic: **holds**; generation: **does not hold here**",
        ),
    ]
    lines = []
    for i, (what, names, cells, claim, reading) in enumerate(spec, 1):
        walls = [re.search(r"([\d.]+) min", md_tables(n)[1]).group(1) for n in names.split()]
        lines.append(
            [
                i,
                what,
                f"`python scripts/experiments.py {names}`",
                cells,
                " + ".join(walls) + " min",
                claim,
                reading,
            ]
        )
    return table(
        ["#", "experiment", "command", "cells", "wall time (sum of cells)", "claim", "reading here"], lines
    )


# ---- docs/reward_models.md: benchmarks/results/rm/ (scripts/rm_experiments.py) and the demo's own runs


def _variant(results: str, variant: str) -> list[dict]:
    return sorted((r for r in load(f"rm/{results}") if r["variant"] == variant), key=lambda r: r["seed"])


def _start() -> float:
    """The demo model's held-out greedy accuracy before training (benchmarks/results/demo_seeds.jsonl)."""
    return statistics.mean(r["before"] for r in rows("demo_seeds.jsonl"))


def _checker() -> list[dict]:
    """The demo with the answer checker as the reward, 400 steps, 3 seeds: the graduation sweep's runs."""
    return sorted(load("experiments/graduation.json")["rows"], key=lambda r: r["seed"])


def _after(runs: list[dict]) -> str:
    return " / ".join(f"{100 * r['eval/accuracy']:.1f}" for r in runs)


def _change(runs: list[dict]) -> float:
    return 100 * (statistics.mean(r["eval/accuracy"] for r in runs) - _start())


def _wall(runs: list[dict]) -> str:
    return f"{statistics.mean(r['wall_s'] for r in runs):.0f} s"


def _rm_auc(name: str) -> float:
    return load(f"rm/{name}_grpokit_rm.json")["report"]["held_out"]["auc"]


def rm_summary() -> str:
    """The summary table: each reward during GRPO, the held-out accuracy after per seed, the change."""
    out = []
    for what, runs in (
        ("the answer checker (the demo)", _checker()),
        (
            f"learned outcome RM (held-out AUC {_rm_auc('demo-outcome'):.3f}), frozen, `loss.beta=0.2`",
            _variant("rm_supervision_results.json", "outcome_rm_beta0.2"),
        ),
        ("the same, at the paper's `loss.beta=0.04`", _variant("rm_supervision_results.json", "outcome_rm")),
        (
            "the same RM, beta 0.04, Algorithm 1 (3 x 133 steps, continual training + 10% replay)",
            _variant("rm_iterative_results.json", "continual"),
        ),
        (
            "the same RM, 3 x 133 steps, frozen (reference reset only)",
            _variant("rm_iterative_results.json", "frozen"),
        ),
        (
            f"learned process RM (step AUC {_rm_auc('demo-process'):.3f}), frozen",
            _variant("rm_supervision_results.json", "process_rm"),
        ),
        (
            "rule-based arithmetic step verifier (`steps`)",
            _variant("rm_supervision_results.json", "rule_steps"),
        ),
    ):
        out.append([what, f"{_after(runs)}%", f"{_change(runs):+.1f} pt"])
    return (
        table(["reward during GRPO", "after (per seed)", "change"], out)
        + f"\n\nBefore: {pct(_start())} (`benchmarks/results/demo_seeds.jsonl`); runs: "
        "`benchmarks/results/rm/rm_*_results.json`, the answer checker's "
        "`benchmarks/results/experiments/graduation.json`."
    )


def rm_frozen() -> str:
    """GRPO against a frozen outcome RM at two betas, beside the answer checker."""
    out = []
    for what, runs, note in (
        (
            "learned outcome RM, loss.beta 0.04 (the paper's)",
            _variant("rm_supervision_results.json", "outcome_rm"),
            "shared cores",
        ),
        (
            "**learned outcome RM, loss.beta 0.2**",
            _variant("rm_supervision_results.json", "outcome_rm_beta0.2"),
            "idle",
        ),
        (
            "the answer checker itself (the demo with per-prompt tracking, the graduation runs)",
            _checker(),
            "shared cores",
        ),
    ):
        per_seed = " / ".join(f"{100 * (r['eval/accuracy'] - _start()):+.1f}" for r in runs)
        kl = [r.get("mean/approx_kl") for r in runs]
        kl_txt = f"{min(kl):.3f}-{max(kl):.3f}" if None not in kl else "not recorded"
        out.append(
            [
                what,
                pct(_start()),
                _after(runs),
                f"{_change(runs):+.1f} pt ({per_seed})",
                kl_txt,
                f"{_wall(runs)} ({note})",
            ]
        )
    return table(
        [
            "reward during GRPO (frozen RM, nothing else)",
            "held-out before",
            "after, seeds 0 / 1 / 2",
            "change (mean; per seed)",
            "KL, mean of the run",
            "wall per run (mean)",
        ],
        out,
    )


def rm_iterations() -> str:
    """Algorithm 1: each iteration's RM AUC on the policy's samples and the held-out accuracy."""
    held = {(r["variant"], r["seed"]): r["eval/accuracy"] for r in load("rm/rm_iterative_results.json")}
    out = []
    for variant in ("continual", "frozen"):
        for seed in (0, 1):
            its = rows(f"rm/iterations_{variant}_seed{seed}.jsonl")
            for it in its:
                acc = held[(variant, seed)] if it is its[-1] else None
                out.append(
                    [
                        variant,
                        seed,
                        f"{it['iteration']:.0f} ({it['step']:.0f})",
                        f"{it['rm_auc']:.3f}",
                        f"{it['rm_group_auc']:.3f}",
                        pct(it["verified_accuracy"]),
                        pct(acc) if acc is not None else "-",
                    ]
                )
    return (
        table(
            [
                "RM",
                "seed",
                "iteration (step)",
                "RM AUC on the policy's samples",
                "within-group AUC",
                "verified accuracy (sampled)",
                "held-out greedy",
            ],
            out,
        )
        + "\n\nHeld-out greedy accuracy is in the raw rows for "
          "the end of each run only (`rm_iterative_results."
        "json`); at iterations 1 and 2 it was not recorded. Per iteration: "
        "`benchmarks/results/rm/iterations_<RM>_seed<N>.jsonl`."
    )


def rm_supervision() -> str:
    """Process vs outcome supervision: frozen learned RMs, the step verifier and the answer checker."""
    out = []
    for what, runs in (
        (
            "learned outcome RM (`rm:runs/rm/demo-outcome`)",
            _variant("rm_supervision_results.json", "outcome_rm"),
        ),
        (
            f"learned process RM (`rm:runs/rm/demo-process`, step AUC {_rm_auc('demo-process'):.3f})",
            _variant("rm_supervision_results.json", "process_rm"),
        ),
        (
            "rule-based arithmetic step verifier (`steps`)",
            _variant("rm_supervision_results.json", "rule_steps"),
        ),
        ("(the answer checker, `rule`: the demo)", _checker()),
    ):
        fmt = " / ".join(f"{100 * r['eval/format_rate']:.0f}" for r in runs)
        out.append([what, f"{_after(runs)}%", f"{_change(runs):+.1f} pt", f"{fmt}%", _wall(runs)])
    return table(
        [
            "reward during GRPO (frozen)",
            "held-out after, seeds 0 / 1 / 2",
            "change (mean)",
            "format rate after",
            "wall per run (mean)",
        ],
        out,
    )


def rm_trained() -> str:
    """The three reward models the GRPO runs used, from the report each saved in its grpokit_rm.json."""
    out = []
    for name in ("demo-pairwise", "demo-outcome", "demo-process"):
        saved = load(f"rm/{name}_grpokit_rm.json")
        r, h = saved["report"], saved["report"]["held_out"]
        epochs = " / ".join(
            f"{e['held_out']['auc']:.3f} ({e['held_out']['group_auc']:.3f} within)" for e in r["history"]
        )
        out.append(
            [
                f"`{name}`: {saved['kind']}, {r['objective']}",
                f"{r['num_train']} train / {r['num_held_out']} held-out completions",
                f"`--init {Path(saved['init']).name}`, "
                f"{r['epochs']} epoch(s), lr {r['learning_rate']:g}, batch {r['batch_size']}",
                epochs,
                f"{h['auc']:.3f}",
                f"{h['accuracy']:.3f}",
                f"{h['group_auc']:.3f}",
                f"{r['train_seconds']:.0f} s",
            ]
        )
    return (
        table(
            [
                "RM",
                "data",
                "training",
                "held-out AUC by epoch",
                "held-out AUC",
                "accuracy",
                "within-group AUC",
                "training s",
            ],
            out,
        )
        + "\n\nRaw rows: `benchmarks/results/rm/<RM>_grpokit_rm.json` (each folder's own report; a process "
        "RM's figures are over steps)."
    )


BLOCKS = {
    "experiments.md": {
        "exp-index": experiments_index,
        "exp-k": lambda: experiment("k"),
        "exp-graduation": lambda: experiment("graduation", part=0),
        "exp-graduation-share": lambda: experiment("graduation", part=1),
        "exp-length": lambda: experiment("length"),
        "exp-length-chain": lambda: experiment("length_chain"),
        "exp-std-scaling": lambda: experiment(
            "std_scaling",
            [
                "scale_rewards",
                "acc after %",
                *[f"share {k}/8 %" for k in range(1, 8)],
                *[f"weight {k}/8" for k in (1, 2, 3, 5, 6, 7)],
            ],
        ),
        "exp-all-wrong": lambda: experiment("all_wrong"),
        "exp-grpo-vs-ppo": lambda: experiment(
            "grpo_vs_ppo",
            [
                "algorithm",
                "s/step",
                "generate s",
                "reward s",
                "ref_forward s",
                "value_forward s",
                "update s",
                "optimizer s",
                "peak RSS MiB",
                "acc after %",
                "acc at 88 training s %",
            ],
        ),
    },
    "reward_models.md": {
        "rm-summary": rm_summary,
        "rm-trained": rm_trained,
        "rm-frozen": rm_frozen,
        "rm-iterations": rm_iterations,
        "rm-supervision": rm_supervision,
    },
}


def render(page: str, text: str, blocks: dict | None = None) -> str:
    """`text` (docs/`page`) with each of its measured blocks regenerated."""
    for name, fn in (blocks or BLOCKS).get(page, {}).items():
        text = block(text, name, fn())
    return text
