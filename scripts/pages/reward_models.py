"""docs/reward_models.md's blocks and the README's reward-model row: the GRPO runs against learned and rule
rewards (benchmarks/results/rm/, scripts/rm_experiments.py), the reward models' own reports, Algorithm 1's
iterations; "before" is the demo's start (benchmarks/results/demo_seeds.jsonl)."""

from __future__ import annotations

import statistics
from pathlib import Path

from .raw import load, rows
from .render import Block, Column, Table, headline_row

SUPERVISION, ITERATIVE = "rm_supervision_results.json", "rm_iterative_results.json"


def runs(results: str, variant: str) -> list[dict]:
    """One variant's GRPO runs in rm/`results`, by seed."""
    return sorted((r for r in load(f"rm/{results}") if r["variant"] == variant), key=lambda r: r["seed"])


def start() -> float:
    """The demo model's held-out greedy accuracy before training (benchmarks/results/demo_seeds.jsonl)."""
    return statistics.mean(r["before"] for r in rows("demo_seeds.jsonl"))


def checker() -> list[dict]:
    """The demo with the answer checker as the reward, 400 steps, 3 seeds: the graduation sweep's runs."""
    return sorted(load("experiments/graduation.json")["rows"], key=lambda r: r["seed"])


def rm_auc(name: str) -> float:
    return load(f"rm/{name}_grpokit_rm.json")["report"]["held_out"]["auc"]


def _run_row(what: str, found: list[dict], **extra) -> dict:
    """A row of a set of runs: each seed's held-out accuracy after, the mean change, the mean wall time."""
    before = start()
    return {
        "what": what, "after": [r["eval/accuracy"] for r in found], "before": before,
        "change": statistics.mean(r["eval/accuracy"] for r in found) - before,
        "wall": statistics.mean(r["wall_s"] for r in found), **extra,
    }


def _summary_rows() -> list[dict]:
    return [
        _run_row(what, found)
        for what, found in (
            ("the answer checker (the demo)", checker()),
            (
                f"learned outcome RM (held-out AUC {rm_auc('demo-outcome'):.3f}), frozen, `loss.beta=0.2`",
                runs(SUPERVISION, "outcome_rm_beta0.2"),
            ),
            ("the same, at the paper's `loss.beta=0.04`", runs(SUPERVISION, "outcome_rm")),
            (
                "the same RM, beta 0.04, Algorithm 1 (3 x 133 steps, continual training + 10% replay)",
                runs(ITERATIVE, "continual"),
            ),
            ("the same RM, 3 x 133 steps, frozen (reference reset only)", runs(ITERATIVE, "frozen")),
            (
                f"learned process RM (step AUC {rm_auc('demo-process'):.3f}), frozen",
                runs(SUPERVISION, "process_rm"),
            ),
            ("rule-based arithmetic step verifier (`steps`)", runs(SUPERVISION, "rule_steps")),
        )
    ]


SUMMARY = Table(
    rows=_summary_rows,
    columns=(
        Column("reward during GRPO", "{what}"), Column("after (per seed)", "{after:pct}%"),
        Column("change", "{change:points}"),
    ),
    note="Before: {before:percent} (`benchmarks/results/demo_seeds.jsonl`); runs: "
    "`benchmarks/results/rm/rm_*_results.json`, the answer checker's "
    "`benchmarks/results/experiments/graduation.json`.", figures=lambda found: found[0],
)


def _frozen_rows() -> list[dict]:
    out = []
    for what, found, note in (
        ("learned outcome RM, loss.beta 0.04 (the paper's)", runs(SUPERVISION, "outcome_rm"), "shared cores"),
        ("**learned outcome RM, loss.beta 0.2**", runs(SUPERVISION, "outcome_rm_beta0.2"), "idle"),
        (
            "the answer checker itself (the demo with per-prompt tracking, the graduation runs)", checker(),
            "shared cores",
        ),
    ):
        kl = [r.get("mean/approx_kl") for r in found]
        out.append(
            _run_row(
                what, found, note=note, per_seed=[r["eval/accuracy"] - start() for r in found],
                kl=f"{min(kl):.3f}-{max(kl):.3f}" if None not in kl else "not recorded",
            )
        )
    return out


FROZEN = Table(
    rows=_frozen_rows,
    columns=(
        Column("reward during GRPO (frozen RM, nothing else)", "{what}"),
        Column("held-out before", "{before:percent}"), Column("after, seeds 0 / 1 / 2", "{after:pct}"),
        Column("change (mean; per seed)", "{change:points} ({per_seed:signed})"),
        Column("KL, mean of the run", "{kl}"), Column("wall per run (mean)", "{wall:seconds} ({note})"),
    ),
)


def _iteration_rows() -> list[dict]:
    held = {(r["variant"], r["seed"]): r["eval/accuracy"] for r in load(f"rm/{ITERATIVE}")}
    out = []
    for variant in ("continual", "frozen"):
        for seed in (0, 1):
            its = rows(f"rm/iterations_{variant}_seed{seed}.jsonl")
            out += [
                {
                    **it, "variant": variant, "seed": seed,
                    "held": f"{100 * held[(variant, seed)]:.1f}%" if it is its[-1] else "-",
                }
                for it in its
            ]
    return out


ITERATIONS = Table(
    rows=_iteration_rows,
    columns=(
        Column("RM", "{variant}"), Column("seed", "{seed}"),
        Column("iteration (step)", "{iteration:.0f} ({step:.0f})"),
        Column("RM AUC on the policy's samples", "{rm_auc:.3f}"),
        Column("within-group AUC", "{rm_group_auc:.3f}"),
        Column("verified accuracy (sampled)", "{verified_accuracy:percent}"),
        Column("held-out greedy", "{held}"),
    ),
    note="Held-out greedy accuracy is in the raw rows for the end of each run only "
         "(`rm_iterative_results.json`); "
    "at iterations 1 and 2 it was not recorded. Per iteration: "
    "`benchmarks/results/rm/iterations_<RM>_seed<N>.jsonl`.",
)


def _supervision_rows() -> list[dict]:
    return [
        _run_row(what, found, format=[100 * r["eval/format_rate"] for r in found])
        for what, found in (
            ("learned outcome RM (`rm:runs/rm/demo-outcome`)", runs(SUPERVISION, "outcome_rm")),
            (
                f"learned process RM (`rm:runs/rm/demo-process`, step AUC {rm_auc('demo-process'):.3f})",
                runs(SUPERVISION, "process_rm"),
            ),
            ("rule-based arithmetic step verifier (`steps`)", runs(SUPERVISION, "rule_steps")),
            ("(the answer checker, `rule`: the demo)", checker()),
        )
    ]


SUPERVISION_TABLE = Table(
    rows=_supervision_rows,
    columns=(
        Column("reward during GRPO (frozen)", "{what}"),
        Column("held-out after, seeds 0 / 1 / 2", "{after:pct}%"), Column("change (mean)", "{change:points}"),
        Column("format rate after", "{format:.0f}%"), Column("wall per run (mean)", "{wall:seconds}"),
    ),
)


def _trained_rows() -> list[dict]:
    out = []
    for name in ("demo-pairwise", "demo-outcome", "demo-process"):
        saved = load(f"rm/{name}_grpokit_rm.json")
        r = saved["report"]
        epochs = [
            f"{e['held_out']['auc']:.3f} ({e['held_out']['group_auc']:.3f} within)" for e in r["history"]
        ]
        out.append(
            {
                **r, "name": name, "kind": saved["kind"], "init": Path(saved["init"]).name,
                "epochs_auc": epochs, "h": r["held_out"],
            }
        )
    return out


TRAINED = Table(
    rows=_trained_rows,
    columns=(
        Column("RM", "`{name}`: {kind}, {objective}"),
        Column("data", "{num_train} train / {num_held_out} held-out completions"),
        Column("training", "`--init {init}`, {epochs} epoch(s), lr {learning_rate:g}, batch {batch_size}"),
        Column("held-out AUC by epoch", "{epochs_auc}"), Column("held-out AUC", "{h[auc]:.3f}"),
        Column("accuracy", "{h[accuracy]:.3f}"), Column("within-group AUC", "{h[group_auc]:.3f}"),
        Column("training s", "{train_seconds:seconds}"),
    ),
    note="Raw rows: `benchmarks/results/rm/<RM>_grpokit_rm.json` (each folder's own report; a process RM's "
         "figures "
    "are over steps).",
)


def headline() -> list[dict]:
    frozen = [r["eval/accuracy"] for r in load(f"rm/{SUPERVISION}") if r["variant"] == "outcome_rm"]
    cont = [r["eval/accuracy"] for r in load(f"rm/{ITERATIVE}") if r["variant"] == "continual"]
    return [
        headline_row(
            "learned reward models and Algorithm 1 (demo, 400 steps, beta 0.04)",
            "frozen outcome RM: {frozen:points} ({n_frozen} seeds, exploited); with continual training and "
            "10% replay: {cont:points} ({n_cont} seeds)", "reward models", "reward_models.md", "rm/",
            frozen=statistics.mean(frozen) - start(), n_frozen=len(frozen),
            cont=statistics.mean(cont) - start(), n_cont=len(cont),
        )
    ]


def _block(name: str, table: Table) -> Block:
    return Block("docs/reward_models.md", name, (table,))


BLOCKS = [
    _block("rm-summary", SUMMARY), _block("rm-trained", TRAINED), _block("rm-frozen", FROZEN),
    _block("rm-iterations", ITERATIONS), _block("rm-supervision", SUPERVISION_TABLE),
]
