"""docs/agents.md's tables and the README's agents rows, from benchmarks/results/agents_* (rows written by
benchmarks/agents_demo.py and benchmarks/agents_vs_trl.py)."""

from __future__ import annotations

from .raw import RESULTS, load, rows
from .render import Block, Column, Table, Text, headline_row

# each demonstration's runs, (label, file tag suffix): its config's rows first, then earlier recipes
RECIPES = {
    "calculator": (("with the tool", ""), ("without", "_notool")),
    "guess_number": (
        ("with the tool (the config: beta 0.04)", ""),
        ("with the tool, beta 0 (the config before)", "_beta0"),
        ("with the tool, beta 0, plus a cost of 0.25 per guess after the yes", "_turncost"),
        ("with the tool, beta 0, decayed over 300 steps", "_decay"),
        ("with the tool, beta 0, constant learning rate, 10 minutes (the first recipe)", "_constant"),
    ),
}
GUESS = "agents_guess_number"  # the config's runs (configs/agents_guess_number.yaml)
SUCCESS = "rewards/GuessNumber"
SMOLLM2 = "agents_calculator_smollm2_seed0"


def records(name: str) -> list[dict]:
    """Each seed's run of one agents demonstration: its evaluations by tag, training seconds, wall row."""
    out = []
    for f in sorted(RESULTS.glob(f"{name}_seed*_eval.jsonl")):
        tag = f.name[: -len("_eval.jsonl")]
        out.append(
            {
                **{r["tag"]: r for r in rows(f.name)}, "seed": int(tag.rsplit("seed", 1)[1]),
                "train_s": sum(r.get("time/step", 0.0) for r in rows(f"{tag}_metrics.jsonl")),
                "wall": load(f"{tag}_wall.json"),
            }
        )
    return out


def _run_rows(name: str, key: str) -> list[dict]:
    out = []
    for kind, suffix in RECIPES.get(name, (("with the tool", ""),)):
        for r in records(f"agents_{name}{suffix}"):
            b, a = r["before"], r["after"]
            out.append(
                {
                    **r, "kind": kind, "b": b[key], "a": a[key], "change": a[key] - b[key], "step": a["step"],
                    "turns": (b.get("turns_mean", 1), a.get("turns_mean", 1)),
                    "calls": (b.get("tool_calls_mean", 0), a.get("tool_calls_mean", 0)),
                }
            )
    return out


def runs_table(name: str, key: str, label: str) -> Table:
    """One row per run of an agents demonstration (with the tool and, where run, without)."""
    return Table(
        rows=lambda: _run_rows(name, key),
        columns=(
            Column("run", "{kind}"), Column("seed", "{seed}"), Column(f"{label} before", "{b:percent}"),
            Column(f"{label} after", "{a:percent}"), Column("change", "{change:points}"),
            Column("turns", "{turns[0]:.2f} -> {turns[1]:.2f}"),
            Column("tool calls per problem", "{calls[0]:.2f} -> {calls[1]:.2f}"), Column("steps", "{step}"),
            Column("training s", "{train_s:.0f}"), Column("wall s", "{wall[wall_seconds]:.0f}"),
        ),
    )


def agents_table(name: str, key: str, label: str) -> str:
    """The table of one demonstration, as docs/agents.md shows it (benchmarks/agents_demo.py prints it)."""
    return runs_table(name, key, label).text({})


def _problems() -> dict:
    return {
        "calc": records("agents_calculator")[0]["before"]["num_problems"],
        "guess": records(GUESS)[0]["before"]["num_problems"],
    }


RESULTS_PARTS = (
    Text("Calculator, 3-digit products (held-out greedy accuracy, {calc:.0f} problems):", _problems),
    runs_table("calculator", "accuracy", "accuracy"),
    Text("Guess the number (success rate over {guess:.0f} held-out episodes, greedy):", _problems),
    runs_table("guess_number", SUCCESS, "success"),
)


def _compare() -> dict:
    """The last compare row of benchmarks/results/agents_vs_trl.jsonl."""
    return [r for r in rows("agents_vs_trl.jsonl") if r.get("kind") == "compare"][-1]


def _vs_trl_rows() -> list[dict]:
    c = _compare()
    t, g = c["trl"], c["grpokit"]
    tree = t["mean_process_tree_cpu_seconds"] / g["mean_process_tree_cpu_seconds"]
    return [
        {
            "what": "seconds per step (wall)", "t": f"{t['median_seconds_per_step']:.2f}",
            "g": f"{g['median_seconds_per_step']:.2f}",
            "ratio": f"{c['trl_over_grpokit_seconds_per_step']:.2f}x",
        },
        {
            "what": "CPU seconds per step", "t": f"{t['median_cpu_seconds_per_step']:.3f}",
            "g": f"{g['median_cpu_seconds_per_step']:.3f}",
            "ratio": f"{c['trl_over_grpokit_cpu_seconds_per_step']:.2f}x",
        },
        {
            "what": f"a whole run, CPU seconds (imports, model, {c['steps']} steps, children)",
            "t": f"{t['mean_process_tree_cpu_seconds']:.1f}",
            "g": f"{g['mean_process_tree_cpu_seconds']:.1f}", "ratio": f"{tree:.2f}x",
        },
        {
            "what": f"reward per step (mean of {t['rounds'] * c['steps']} steps)",
            "t": f"{t['mean_reward']:.3f}", "g": f"{g['mean_reward']:.3f}", "ratio": "",
        },
        {
            "what": "tool calls per trajectory (mean)", "t": f"{t['mean_tool_calls_per_trajectory']:.2f}",
            "g": f"{g['mean_tool_calls_per_trajectory']:.2f}", "ratio": "",
        },
        {
            "what": "peak RSS", "t": f"{t['peak_rss_mb']:.0f} MB", "g": f"{g['peak_rss_mb']:.0f} MB",
            "ratio": "",
        },
    ]


VS_TRL = Table(
    rows=_vs_trl_rows,
    columns=(
        Column("", "{what}"), Column("TRL 1.16", "{t}"), Column("grpokit.trl", "{g}"),
        Column("TRL / grpokit", "{ratio}"),
    ),
)

SMOLLM2_TABLE = Table(
    rows=lambda: rows(f"{SMOLLM2}_eval.jsonl"),
    columns=(
        Column("evaluation", "{tag}"), Column("step", "{step}"), Column("accuracy", "{accuracy:percent}"),
        Column("tool calls per problem", "{tool_calls_mean:.2f}"), Column("turns", "{turns_mean:.2f}"),
        Column("truncated", "{frac_truncated:.2f}"),
    ),
)


def headline() -> list[dict]:
    calc, bare, guess = records("agents_calculator"), records("agents_calculator_notool"), records(GUESS)
    smol = {r["tag"]: r for r in rows(f"{SMOLLM2}_eval.jsonl")}
    c = _compare()
    return [
        headline_row(
            "agents: the calculator tool, 3-digit products (demo-size model, tool-call warm start, 10 min "
            "of GRPO on one core)",
            "{start:percent} -> {after:pct}% with the tool ({n} seeds); without it {bare_start:percent} -> "
            "{bare:pct}%", "agents", "agents.md", "agents_calculator_*", start=calc[0]["before"]["accuracy"],
            after=[r["after"]["accuracy"] for r in calc], n=len(calc),
            bare_start=bare[0]["before"]["accuracy"], bare=[r["after"]["accuracy"] for r in bare],
        ),
        headline_row(
            "agents: guess the number, higher / lower feedback (multi-turn, 600 GRPO steps on one core, "
            "beta 0.04)",
            "success {start:percent} -> {after:pct}% ({n} seeds), turns {turns0:.2f} -> {turns:.2f}",
            "agents", "agents.md", "agents_guess_number_*", start=guess[0]["before"][SUCCESS],
            after=[r["after"][SUCCESS] for r in guess], n=len(guess), turns0=guess[0]["before"]["turns_mean"],
            turns=[r["after"]["turns_mean"] for r in guess],
        ),
        headline_row(
            "agents: SmolLM2-135M-Instruct with the calculator, 3-digit products (5-step sft warm start, "
            "{minutes:.0f} min of GRPO on one core, seed 0)",
            "{b[accuracy]:percent} -> {a[accuracy]:percent} held-out, tool calls per problem "
            "{b[tool_calls_mean]:.2f} -> {a[tool_calls_mean]:.2f} ({a[step]} steps)", "agents", "agents.md",
            "agents_calculator_smollm2_*", b=smol["before"], a=smol["after"],
            minutes=sum(r.get("time/step", 0.0) for r in rows(f"{SMOLLM2}_metrics.jsonl")) / 60,
        ),
        headline_row(
            "one TRL agent program (a tool, G 4, B 4) on TRL 1.16 and on grpokit.trl, only the import "
            "changed (tiny tool-calling model, one core)",
            "{trl_over_grpokit_seconds_per_step:ratio} faster a step "
            "({trl_over_grpokit_cpu_seconds_per_step:ratio} in CPU seconds a step, {tree:ratio} over the "
            "whole process tree) on a saturated machine: each process had {g_share:percent} / "
            "{t_share:percent} of its core", "agents", "agents.md", "agents_vs_trl.jsonl", **c,
            tree=c["trl"]["mean_process_tree_cpu_seconds"] / c["grpokit"]["mean_process_tree_cpu_seconds"],
            g_share=c["grpokit"]["median_cpu_seconds_per_step"] / c["grpokit"]["median_seconds_per_step"],
            t_share=c["trl"]["median_cpu_seconds_per_step"] / c["trl"]["median_seconds_per_step"],
        ),
    ]


BLOCKS = [
    Block("docs/agents.md", "agents-results", RESULTS_PARTS),
    Block("docs/agents.md", "agents-vs-trl", (VS_TRL,)),
    Block("docs/agents.md", "agents-smollm2", (SMOLLM2_TABLE,)),
]
