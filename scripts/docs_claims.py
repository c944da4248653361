"""docs/experiments.md's claims summary, each figure read from the tables scripts/experiments.py wrote to
benchmarks/results/experiments/NAME.md (from NAME.json, the sweep's raw rows); scripts/update_readme.py
writes it and tests/cli/test_readme.py checks it."""

from docs_measured import md_tables, table


def _cells(name: str, part: int = 0) -> dict[str, dict[str, str]]:
    """experiments/NAME.md's table `part` as {row label: {column: cell}}."""
    t = md_tables(name)[0][part]
    return {row[0]: dict(zip(t[0], row, strict=True)) for row in t[1:]}


def _x(cell: str) -> float:
    """A cell's leading figure (`53.0 (45.5-58.5)` -> 53.0)."""
    return float(cell.split()[0])


def _k() -> str:
    k = _cells("k")
    acc = {g: k[f"G={g}"]["acc after % (min-max)"].split()[0] for g in (8, 4, 2, 32)}
    err = [k[f"G={g}"]["adv noise / rms error (start model)"].split("/")[1].strip() for g in (2, 32)]
    return (
        f"**holds**: at 25,600 completions G = 8 ends best ({acc[8]}%), G = 4 {acc[4]}%, G = 2 {acc[2]}%, "
        f"G = 32 {acc[32]}%; a completion's advantage error falls {float(err[0]):.2f} -> "
        f"{float(err[1]):.2f} from G = 2 to 32"
    )


def _graduation() -> str:
    windows, quarters = _cells("graduation", 0), _cells("graduation", 1)
    first, last = windows["steps 1-10"], windows["steps 391-400"]
    early = sum(int(quarters["steps 1-100"][f"{i}/8"]) for i in (1, 2))
    late = sum(int(quarters["steps 301-400"][f"{i}/8"]) for i in (5, 6, 7))
    return (
        f"**holds**: graduated groups {first['8/8']}% -> {last['8/8']}%, stuck {first['0/8']}% -> "
        f"{last['0/8']}% (steps 1-10 -> 391-400); the gradient moves from 1-2/8 groups ({early}% of it) "
        f"to 5-7/8 ({late}%)"
    )


def _length() -> str:
    demo, chain = _cells("length"), _cells("length_chain")
    col = "length (steps 1-20 -> last 20)"
    acc = {k: chain[f"loss_type={k}"]["acc after %"].split()[0] for k in ("dapo", "bnpo", "grpo")}
    return (
        "**does not hold here**: the 1/2 vs 1/8 per-token weight is as stated (a test), but in 200 steps no "
        f"loss type moved the length ({demo['loss_type=grpo'][col].split()[0]} on the demo, "
        f"{chain['loss_type=grpo'][col].split()[0]} on three-term sums) and wrong answers are not longer; "
        f"dapo/bnpo {acc['dapo']}/{acc['bnpo']}% vs grpo {acc['grpo']}% on three-term sums"
    )


def _std_scaling() -> str:
    s = _cells("std_scaling")
    group, none = s["scale_rewards=group"], s["scale_rewards=none"]
    return (
        f"**holds**: a 1/8 group weighs {group['weight 1/8']} of a 4/8 group with it, {none['weight 1/8']} "
        f"without; accuracy {group['acc after %'].split()[0]}% (group) vs "
        f"{none['acc after %'].split()[0]}% (none)"
    )


def _all_wrong() -> str:
    a = _cells("all_wrong")
    after = {_x(r["acc after %"]) for r in a.values()}
    return (
        f"**holds**: {100 * _x(a['variant=plain']['zero-std share']):.0f}% of 3-digit groups all wrong, "
        f"{', '.join(f'{x:.0f}%' for x in sorted(after))} after for plain, dynamic sampling and G = 16 alike"
    )


def _grpo_vs_ppo() -> str:
    c = _cells("grpo_vs_ppo")
    g, p = c["algorithm=grpo"], c["algorithm=ppo"]
    step = _x(g["s/step"])
    at = "acc at 88 training s %"
    return (
        f"critic **holds** ({_x(p['s/step']) / step:.1f}x faster steps, "
        f"{100 * (1 - _x(g['peak RSS MiB']) / _x(p['peak RSS MiB'])):.0f}% less memory, {g[at]}% vs {p[at]}% "
        f"at the same training time); generation dominating **does not hold here** "
        f"({100 * _x(g['generate s']) / step:.0f}% of the step; "
        f"the update {100 * _x(g['update s']) / step:.0f}%)"
    )


CLAIMS = [
    ("k = 8 is the default; 2 unstable, 16+ better statistics", _k, "[k](experiments/k.png)"),
    (
        "groups graduate, the signal moves to what is still unsolved",
        _graduation,
        "[graduation](experiments/graduation.png)",
    ),
    (
        "the per-completion mean favours short answers' tokens; Dr. GRPO / DAPO remove a length drift",
        _length,
        "[length](experiments/length.png), [chain](experiments/length_chain.png)",
    ),
    (
        "std scaling re-weights prompts by difficulty",
        _std_scaling,
        "[std_scaling](experiments/std_scaling.png)",
    ),
    ("all-wrong groups give no signal", _all_wrong, "[all_wrong](experiments/all_wrong.png)"),
    (
        "GRPO saves the critic; generation and reward may still dominate",
        _grpo_vs_ppo,
        "[grpo_vs_ppo](experiments/grpo_vs_ppo.png)",
    ),
]


def claims() -> str:
    """One row per claim: the reading here with its figures, and the figure's link."""
    return table(["claim", "here", "figure"], [[claim, fn(), link] for claim, fn, link in CLAIMS]) + (
        "\n\nFigures from `benchmarks/results/experiments/<name>.md` (tables of `<name>.json`)."
    )


BLOCKS = {"experiments.md": {"exp-claims": claims}}
