"""docs/experiments.md's blocks and the README's claims row: the tables scripts/experiments.py wrote to
benchmarks/results/experiments/NAME.md (from NAME.json, the sweep's raw rows), and each of the chapter's
claims with its verdict decided from those tables (`holds`: a test over the figures, never a fixed word)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from .raw import load, md_tables
from .render import Block, Column, Table, Text, headline_row

LABEL_KEYS = re.compile(r"^(variant|loss_type|scale_rewards|algorithm)=")
SWEEPS = Path(__file__).resolve().parents[2] / "configs" / "sweeps"
HOLDS, FAILS = "**holds**", "**does not hold here**"
MOVED = 0.05  # a length "moves" when its last 20 steps differ from its first 20 by more than 5%


def _verdict(holds: bool) -> str:
    return HOLDS if holds else FAILS


# ---- the sweeps' tables, as scripts/experiments.py wrote them


def md_table(name: str, part: int, columns: list[str] | None = None) -> Table:
    """Table `part` of experiments/NAME.md (only `columns`, in that order, where given)."""

    def found() -> list[dict]:
        t = md_tables(name)[0][part]
        keep = t[0] if columns is None else columns
        return [
            {"cells": [LABEL_KEYS.sub("", r[0]) if i == 0 else r[i] for i in map(t[0].index, keep)]}
            for r in t[1:]
        ]

    def header(_: list[dict]) -> list[Column]:
        keep = md_tables(name)[0][part][0] if columns is None else columns
        return [Column(h, f"{{cells[{i}]}}") for i, h in enumerate(keep)]

    return Table(rows=found, columns=header)


def experiment(name: str, columns: list[str] | None = None, part: int | None = None) -> Callable[[], list]:
    """experiments/NAME.md's tables (or only table `part`) and, after its last table, its wall-time line."""

    def parts() -> list:
        count = len(md_tables(name)[0])
        out: list = [md_table(name, i, columns) for i in (range(count) if part is None else [part])]
        if part in (None, count - 1):
            out.append(
                Text(
                    "{wall} Raw rows: `benchmarks/results/experiments/{name}.json`.",
                    lambda: {"wall": md_tables(name)[1], "name": name},
                )
            )
        return out

    return parts


# ---- the chapter's claims, each decided from its sweep's table


def cells(name: str, part: int = 0) -> dict[str, dict[str, str]]:
    """experiments/NAME.md's table `part` as {row label: {column: cell}}."""
    t = md_tables(name)[0][part]
    return {row[0]: dict(zip(t[0], row, strict=True)) for row in t[1:]}


def lead(cell: str) -> float:
    """A cell's leading figure (`53.0 (45.5-58.5)` -> 53.0)."""
    return float(cell.split()[0])


def _k() -> tuple[list[bool], str]:
    k = cells("k")
    acc = {int(label.split("=")[1]): lead(r["acc after % (min-max)"]) for label, r in k.items()}
    err = {g: float(k[f"G={g}"]["adv noise / rms error (start model)"].split("/")[1]) for g in (2, 32)}
    budget = yaml.safe_load((SWEEPS / "k.yaml").read_text())["base"]["overrides"]["rollout.prompts_per_step"]
    completions = budget * 8 * int(k["G=8"]["steps"])
    best = acc[8] >= max(acc.values())
    return [best], (
        f"at {completions:,} completions G = 8 ends {'best' if best else 'below the best'} ({acc[8]:.1f}%), "
        f"G = 4 {acc[4]:.1f}%, G = 2 {acc[2]:.1f}%, G = 32 {acc[32]:.1f}%; a completion's advantage error "
        f"falls {err[2]:.2f} -> {err[32]:.2f} from G = 2 to 32"
    )


def _graduation() -> tuple[list[bool], str]:
    windows, quarters = cells("graduation", 0), cells("graduation", 1)
    first, last = windows["steps 1-10"], windows["steps 391-400"]
    early = sum(int(quarters["steps 1-100"][f"{i}/8"]) for i in (1, 2))
    late = sum(int(quarters["steps 301-400"][f"{i}/8"]) for i in (5, 6, 7))
    holds = int(last["8/8"]) > int(first["8/8"]) and int(last["0/8"]) < int(first["0/8"]) and late > early
    return [holds], (
        f"graduated groups {first['8/8']}% -> {last['8/8']}%, stuck {first['0/8']}% -> {last['0/8']}% "
        f"(steps 1-10 -> 391-400); the gradient moves from 1-2/8 groups ({early}% of it) to 5-7/8 ({late}%)"
    )


def _moved(cell: str) -> bool:
    a, b = (float(x) for x in cell.split(" -> "))
    return abs(b - a) > MOVED * a


def _length() -> tuple[list[bool], str]:
    demo, chain = cells("length"), cells("length_chain")
    col = "length (steps 1-20 -> last 20)"
    drift = _moved(demo["loss_type=grpo"][col]) or _moved(chain["loss_type=grpo"][col])
    moved = [r[col] for t in (demo, chain) for r in t.values() if _moved(r[col])]
    acc = {k: chain[f"loss_type={k}"]["acc after %"].split()[0] for k in ("dapo", "bnpo", "grpo")}
    what = "no loss type moved the length" if not moved else f"lengths moved ({'; '.join(moved)})"
    steps = load("experiments/length.json")["rows"][0]["steps"]
    return [drift], (
        f"the 1/2 vs 1/8 per-token weight is as stated (a test), but in {steps} steps {what} "
        f"({demo['loss_type=grpo'][col].split()[0]} on the demo, {chain['loss_type=grpo'][col].split()[0]} "
        f"on three-term sums) and wrong answers are not longer; dapo/bnpo {acc['dapo']}/{acc['bnpo']}% vs "
        f"grpo {acc['grpo']}% on three-term sums"
    )


def _std_scaling() -> tuple[list[bool], str]:
    s = cells("std_scaling")
    group, none = s["scale_rewards=group"], s["scale_rewards=none"]
    holds = float(group["weight 1/8"]) > float(none["weight 1/8"])
    return [holds], (
        f"a 1/8 group weighs {group['weight 1/8']} of a 4/8 group with it, {none['weight 1/8']} without; "
        f"accuracy {group['acc after %'].split()[0]}% (group) vs {none['acc after %'].split()[0]}% (none)"
    )


def _all_wrong() -> tuple[list[bool], str]:
    a = cells("all_wrong")
    after = {lead(r["acc after %"]) for r in a.values()}
    learned = max(after) - max(lead(r["acc before %"]) for r in a.values())
    return [learned < 1.0], (
        f"{100 * lead(a['variant=plain']['zero-std share']):.0f}% of 3-digit groups all wrong, "
        f"{', '.join(f'{x:.0f}%' for x in sorted(after))} after for plain, dynamic "
        "sampling and G = 16 alike"
    )


def _grpo_vs_ppo() -> tuple[list[bool], str]:
    c = cells("grpo_vs_ppo")
    g, p = c["algorithm=grpo"], c["algorithm=ppo"]
    step, at = lead(g["s/step"]), "acc at 88 training s %"
    saving = 1 - lead(g["peak RSS MiB"]) / lead(p["peak RSS MiB"])
    critic = lead(p["s/step"]) > step and saving > 0
    generation = lead(g["generate s"]) / step >= 0.5
    return [critic, generation], (
        f"critic {_verdict(critic)} ({lead(p['s/step']) / step:.1f}x faster steps, {100 * saving:.0f}% less "
        f"memory, {g[at]}% vs {p[at]}% at the same training time); generation dominating "
        f"{_verdict(generation)} ({100 * lead(g['generate s']) / step:.0f}% of the step; the update "
        f"{100 * lead(g['update s']) / step:.0f}%)"
    )


@dataclass(frozen=True)
class Claim:
    short: str  # its name in the README's row
    claim: str  # as the chapter states it
    reading: Callable[[], tuple[list[bool], str]]  # (the verdict of each part, the figures behind them)
    link: str

    def verdicts(self) -> list[bool]:
        return self.reading()[0]

    def here(self) -> str:
        verdicts, text = self.reading()
        return text if len(verdicts) > 1 else f"{_verdict(verdicts[0])}: {text}"


CLAIMS = [
    Claim("k = 8", "k = 8 is the default; 2 unstable, 16+ better statistics", _k, "[k](experiments/k.png)"),
    Claim(
        "graduation", "groups graduate, the signal moves to what is still unsolved", _graduation,
        "[graduation](experiments/graduation.png)",
    ),
    Claim(
        "the length drift",
        "the per-completion mean favours short answers' tokens; Dr. GRPO / DAPO remove a length drift",
        _length, "[length](experiments/length.png), [chain](experiments/length_chain.png)",
    ),
    Claim(
        "std scaling", "std scaling re-weights prompts by difficulty", _std_scaling,
        "[std_scaling](experiments/std_scaling.png)",
    ),
    Claim(
        "all-wrong groups", "all-wrong groups give no signal", _all_wrong,
        "[all_wrong](experiments/all_wrong.png)",
    ),
    Claim(
        "GRPO vs PPO", "GRPO saves the critic; generation and reward may still dominate", _grpo_vs_ppo,
        "[grpo_vs_ppo](experiments/grpo_vs_ppo.png)",
    ),
]
CLAIMS_TABLE = Table(
    rows=lambda: [{"claim": c.claim, "here": c.here(), "link": c.link} for c in CLAIMS],
    columns=(Column("claim", "{claim}"), Column("here", "{here}"), Column("figure", "{link}")),
    note="Figures from `benchmarks/results/experiments/<name>.md` (tables of `<name>.json`).",
)


# ---- the index of experiments: the same verdicts, each sweep's summed wall time

# (what, sweeps, cells, claim, the reading's words beside each verdict: one entry per verdict)
INDEX = [
    ("group size k", "k", "5 G x 3 seeds", "G = 8 the default", ("{} (G = 4 within noise)",)),
    ("graduation", "graduation", "3 seeds", "groups graduate, the signal moves", ("{}",)),
    (
        "length weighting", "length length_chain", "2 tasks x 4 x 3 seeds",
        "the per-completion mean causes a length drift", ("{}: no drift under any loss type",),
    ),
    ("std scaling", "std_scaling", "3 x 3 seeds", "low-variance groups amplified", ("{}",)),
    (
        "all-wrong groups", "all_wrong", "3 x 3 seeds", "no signal from all-wrong groups",
        ("{}; no remedy helps at 0%",),
    ),
    (
        "GRPO vs PPO cost", "grpo_vs_ppo", "2 x 3 seeds", "saves the critic; generation may dominate",
        ("critic: {}", "generation: {}"),
    ),
]


def _index_rows() -> list[dict]:
    out = []
    for i, ((what, names, n, claim, words), c) in enumerate(zip(INDEX, CLAIMS, strict=True), 1):
        walls = [re.search(r"([\d.]+) min", md_tables(s)[1]).group(1) for s in names.split()]
        reading = "; ".join(w.format(_verdict(v)) for w, v in zip(words, c.verdicts(), strict=True))
        out.append(
            {
                "i": i, "what": what, "names": names, "n": n, "walls": " + ".join(walls), "claim": claim,
                "reading": reading,
            }
        )
    return out


INDEX_TABLE = Table(
    rows=_index_rows,
    columns=(
        Column("#", "{i}"),
        Column("experiment", "{what}"), Column("command", "`python scripts/experiments.py {names}`"),
        Column("cells", "{n}"), Column("wall time (sum of cells)", "{walls} min"), Column("claim", "{claim}"),
        Column("reading here", "{reading}"),
    ),
)


def headline() -> list[dict]:
    """The README's row: how many claims hold (from the verdicts above) and GRPO against PPO."""
    whole = [c for c in CLAIMS if len(c.verdicts()) == 1]
    hold = [c.short for c in whole if c.verdicts()[0]]
    fail = [c.short for c in whole if not c.verdicts()[0]]
    mixed = [c for c in CLAIMS if len(c.verdicts()) > 1]
    parts = [
        f"{len(hold)} hold", *(f"{name} does not here" for name in fail),
        *(f"{c.short} in part" for c in mixed),
    ]
    rows = load("experiments/grpo_vs_ppo.json")["rows"]
    side = {a: [r for r in rows if r["loss.algorithm"] == a] for a in ("grpo", "ppo")}
    return [
        headline_row(
            "the chapter's claims ({names})",
            "{verdicts}; at {steps} steps GRPO {grpo:percent}, PPO {ppo:percent} ({seeds} seeds), GRPO "
            "{faster:.1f}x faster", "experiments", "experiments.md", "experiments/",
            names=", ".join(c.short for c in CLAIMS), verdicts=", ".join(parts), steps=rows[0]["steps"],
            grpo=statistics.mean(r["eval/accuracy"] for r in side["grpo"]),
            ppo=statistics.mean(r["eval/accuracy"] for r in side["ppo"]),
            seeds=len({r["seed"] for r in side["grpo"]}),
            faster=statistics.mean(r["wall_s"] for r in side["ppo"])
            / statistics.mean(r["wall_s"] for r in side["grpo"]),
        )
    ]


STD_COLUMNS = [
    "scale_rewards", "acc after %", *[f"share {k}/8 %" for k in range(1, 8)],
    *[f"weight {k}/8" for k in (1, 2, 3, 5, 6, 7)],
]
PPO_COLUMNS = [
    "algorithm", "s/step", "generate s", "reward s", "ref_forward s", "value_forward s", "update s",
    "optimizer s", "peak RSS MiB", "acc after %", "acc at 88 training s %",
]


def _block(name: str, parts) -> Block:
    return Block("docs/experiments.md", name, parts)


BLOCKS = [
    _block("exp-claims", (CLAIMS_TABLE,)), _block("exp-index", (INDEX_TABLE,)),
    _block("exp-k", experiment("k")), _block("exp-graduation", experiment("graduation", part=0)),
    _block("exp-graduation-share", experiment("graduation", part=1)),
    _block("exp-length", experiment("length")), _block("exp-length-chain", experiment("length_chain")),
    _block("exp-std-scaling", experiment("std_scaling", STD_COLUMNS)),
    _block("exp-all-wrong", experiment("all_wrong")),
    _block("exp-grpo-vs-ppo", experiment("grpo_vs_ppo", PPO_COLUMNS)),
]
