"""The chapter's claims, measured: one command per experiment of docs/experiments.md.

    python scripts/experiments.py k            # runs configs/sweeps/k.yaml (skipping finished cells),
                                               # then its figure and table
    python scripts/experiments.py length length_chain   # several, in order
    python scripts/experiments.py all          # every one, one after another
    python scripts/experiments.py k --report   # figure and table only, from the finished sweep

Each writes docs/experiments/<name>.png, benchmarks/results/experiments/<name>.md (the table in
docs/experiments.md) and <name>.json (every figure behind it). Definitions: `grpokit.observe.experiments`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from grpokit.cli import sft, sweep
from grpokit.config.schema import build_config
from grpokit.errors import UserError, run_command
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.observe.experiment_plots import Panels
from grpokit.observe.experiments import (
    advantage_noise,
    by_label,
    cell_series,
    gradient_share,
    group_weight,
    pass_rate_histogram,
    sample_pool,
    seed_bands,
    sweep_rows,
)
from grpokit.observe.metrics import read_metrics
from grpokit.tasks import load_examples

FIGURES, RESULTS = Path("docs/experiments"), Path("benchmarks/results/experiments")
POOL_PROMPTS, POOL_SIZE = 128, 128     # advantage noise: completions pooled per training prompt
EXPERIMENTS = ("k", "graduation", "length", "length_chain", "std_scaling", "all_wrong", "grpo_vs_ppo")
CHAIN_MODEL = Path("runs/sft/arith-chain")   # the warm start of length_chain (three-term sums)
CHAIN_SFT = ["task.terms=3", "task.num_train=15000", "rollout.max_completion_length=48", "--out",
             str(CHAIN_MODEL), "--steps", "800", "--stop-at", "400", "--eval-limit", "200"]


def _mean(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def _spread(rows, key, scale=1.0, fmt=".1f"):
    """'mean (min-max)' of a results column over seeds."""
    vals = [r[key] * scale for r in rows if isinstance(r.get(key), (int, float))]
    if not vals:
        return "n/a"
    return f"{_mean(vals):{fmt}} ({min(vals):{fmt}}-{max(vals):{fmt}})"


def _first_eval(rows, sweep_dir, key="accuracy"):
    return _mean([read_metrics(sweep_dir / r["folder"], "eval.jsonl")[0].get(key) for r in rows])


def _table(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in line) + " |" for line in lines])


def _history(sweep_dir, rows):
    return [h for r in rows for h in read_metrics(sweep_dir / r["folder"], "prompt_history.jsonl")]


def _group_size(sweep_dir, row):
    return json.loads((sweep_dir / row["folder"] / "config.json").read_text())["rollout"]["num_generations"]


def _pool_noise(sweep_dir, row, model_dir, group_sizes):
    """Advantage noise of the pooled samples of one cell's policy (model_dir None: the start model)."""
    cfg = build_config(json.loads((sweep_dir / row["folder"] / "config.json").read_text()))
    if model_dir is not None:
        cfg.model.name_or_path = str(model_dir)
    model, tok = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    examples = load_examples(cfg.task, cfg.task.train_split)[:POOL_PROMPTS]
    torch.manual_seed(0)
    pool = sample_pool(model, tok, examples, cfg, size=POOL_SIZE)
    gen = torch.Generator().manual_seed(0)
    noise = advantage_noise(pool["reward"], group_sizes=group_sizes, generator=gen)
    plain = advantage_noise(pool["reward"], group_sizes=group_sizes, scale_rewards="none", generator=gen)
    return {"pass_rate": float(pool["correct"].mean()), "group": noise, "none": plain}


def report_k(sweep_dir, rows):
    groups = by_label(rows)
    sizes = [_group_size(sweep_dir, m[0]) for m in groups.values()]
    cache = RESULTS / "k_noise.json"
    if cache.is_file():
        noise = {k: {m: {int(g): v for g, v in d.items()} if isinstance(d, dict) else d for m, d in s.items()}
                 for k, s in json.loads(cache.read_text()).items()}
    else:
        mid = next(m for m in groups.values() if _group_size(sweep_dir, m[0]) == 8)[0]
        noise = {"start": _pool_noise(sweep_dir, mid, None, sizes),
                 "after_G8_seed0": _pool_noise(sweep_dir, mid, sweep_dir / mid["folder"] / "final", sizes)}
        cache.write_text(json.dumps(noise, indent=1))
    fig = Panels(title="Experiment 1: group size G at 25,600 sampled completions (B = 16), 3 seeds")
    fig.curves(seed_bands(rows, sweep_dir, "eval/accuracy", x="completions"),
               title="held-out greedy accuracy",
               xlabel="completions sampled", ylabel="accuracy", percent=True)
    fig.curves(seed_bands(rows, sweep_dir, "frac_zero_std", x="completions", window=20),
               title="share of zero-std groups (20-step mean)", xlabel="completions sampled", ylabel="share")
    fig.bars({f"{w} ({m})": [noise[w][m][g]["adv_rmse"] for g in sizes]
              for w in noise for m in ("group", "none")},
             categories=[f"G={g}" for g in sizes], title="advantage error vs the pool's (rms)",
             ylabel="rms error")
    lines = []
    for (label, members), g in zip(groups.items(), sizes):
        half = _mean([cell_series(sweep_dir / r["folder"], "eval/accuracy")[1][2] for r in members]) * 100
        lines.append([f"G={g}", members[0]["steps"], f"{_first_eval(members, sweep_dir) * 100:.1f}",
                      f"{half:.1f}", _spread(members, "eval/accuracy", 100),
                      _spread(members, "wall_s", 1, ".0f"), _spread(members, "mean/frac_zero_std", 1, ".2f"),
                      f"{noise['start']['group'][g]['adv_noise']:.3f} / "
                      f"{noise['start']['group'][g]['adv_rmse']:.3f}",
                      f"{noise['start']['group'][g]['frac_zero_std']:.2f}"])
    table = _table(["G", "steps", "acc before %", "acc at half budget %", "acc after % (min-max)", "wall s",
                    "zero-std share", "adv noise / rms error (start model)",
                    "zero-std share (start pool)"], lines)
    return fig, table, {"noise": noise}


def report_graduation(sweep_dir, rows):
    history, G = _history(sweep_dir, rows), _group_size(sweep_dir, rows[0])
    last = max(r["steps"] for r in rows)
    windows = [(1, 10), (91, 100), (291, 300), (last - 9, last)]
    cats = [f"{k}/{G}" for k in range(G + 1)]
    hists = {f"steps {a}-{b}": pass_rate_histogram(history, steps=(a, b), group_size=G) for a, b in windows}
    quarters = [(1 + i * last // 4, (i + 1) * last // 4) for i in range(4)]
    shares = {f"steps {a}-{b}": gradient_share(history, steps=(a, b), group_size=G) for a, b in quarters}
    fig = Panels(title="Experiment 2: graduation over the demo run (3 seeds)", columns=2)
    for key, title in (("frac_graduated", "graduated (all right)"), ("frac_stuck", "stuck (all wrong)")):
        fig.curves(seed_bands(rows, sweep_dir, key, window=20),
                   title=f"share of groups {title}, 20-step mean", xlabel="step", ylabel="share")
    fig.bars(hists, categories=cats, title="pass-rate histogram of the groups sampled",
             ylabel="share of groups", xlabel="correct answers in the group")
    fig.bars(shares, categories=cats, title="gradient share: sum |A| x tokens by group pass rate",
             ylabel="share of the signal", xlabel="correct answers in the group")
    summaries = [json.loads((sweep_dir / r["folder"] / "prompt_summary.json").read_text()) for r in rows]
    lines = [[w, *(f"{v * 100:.0f}" for v in h)] for w, h in hists.items()]
    table = _table(["window", *cats], lines)
    table += "\n\n" + _table(["quarter", *cats],
                             [[w, *(f"{v * 100:.0f}" for v in s)] for w, s in shares.items()])
    counts = {k: [s[k] for s in summaries] for k in ("num_prompts", "graduated", "stuck", "learning")}
    return fig, table, {"histograms": hists, "gradient_share": shares, "prompt_status": counts}


def report_length(sweep_dir, rows):
    fig = Panels(title="Experiment 3: loss aggregation (loss_type), 3 seeds", columns=2)
    for key, title in (("completion_length_mean", "completion length"), ("completion_length_wrong",
                                                                          "length of wrong completions")):
        fig.curves(seed_bands(rows, sweep_dir, key, window=20),
                   title=f"{title} (20-step mean)", xlabel="step", ylabel="tokens")
    fig.curves(seed_bands(rows, sweep_dir, "eval/accuracy"), title="held-out greedy accuracy", xlabel="step",
               ylabel="accuracy", percent=True)
    fig.curves(seed_bands(rows, sweep_dir, "frac_truncated", window=20),
               title="share truncated (20-step mean)", xlabel="step", ylabel="share")
    def ends(members, key):
        series = [s for r in members if (s := cell_series(sweep_dir / r["folder"], key, window=20)[1])]
        if not series:                                   # e.g. no right answer in the whole run
            return "n/a"
        return (f"{_mean([s[min(19, len(s) - 1)] for s in series]):.1f} -> "
                f"{_mean([s[-1] for s in series]):.1f}")

    lines = []
    for label, members in by_label(rows).items():
        lines.append([label, _spread(members, "eval/accuracy", 100), ends(members, "completion_length_mean"),
                      ends(members, "completion_length_wrong"), ends(members, "completion_length_correct"),
                      _spread(members, "mean/frac_truncated", 1, ".3f")])
    table = _table(["loss", "acc after %", "length (steps 1-20 -> last 20)", "wrong length", "correct length",
                    "truncated share"], lines)
    return fig, table, {}


def prepare_length_chain() -> None:
    """The warm start length_chain trains: the demo's supervised recipe on three-term sums, stopped early."""
    if (CHAIN_MODEL / "config.json").is_file():
        return
    sft.main([*CHAIN_SFT, "--threads", str(torch.get_num_threads())])


def report_length_chain(sweep_dir, rows):
    fig, table, extra = report_length(sweep_dir, rows)
    fig.title = "Experiment 3b: loss aggregation on three-term sums (variable-length solutions), 3 seeds"
    spread = [cell_series(sweep_dir / r["folder"], "completion_length_max")[1] for r in rows]
    low = [cell_series(sweep_dir / r["folder"], "completion_length_min")[1] for r in rows]
    gaps = [mx - mn for a, b in zip(spread, low) for mx, mn in zip(a, b)]
    return fig, table, {**extra, "mean_length_range_in_batch": _mean(gaps)}


def report_std_scaling(sweep_dir, rows):
    G, last = _group_size(sweep_dir, rows[0]), max(r["steps"] for r in rows)
    cats = [f"{k}/{G}" for k in range(G + 1)]
    shares = {label: gradient_share(_history(sweep_dir, m), steps=(1, last), group_size=G)
              for label, m in by_label(rows).items()}
    weights = {label: group_weight(_history(sweep_dir, m), steps=(1, last), group_size=G)
               for label, m in by_label(rows).items()}
    fig = Panels(title="Experiment 4: std scaling (scale_rewards), 3 seeds", columns=3)
    fig.curves(seed_bands(rows, sweep_dir, "eval/accuracy"), title="held-out greedy accuracy", xlabel="step",
               ylabel="accuracy", percent=True)
    fig.bars(shares, categories=cats, title="gradient share by group pass rate (whole run)",
             ylabel="share of sum |A| x tokens", xlabel="correct answers in the group")
    fig.bars({k: v[1:G] for k, v in weights.items()}, categories=cats[1:G], ylabel=f"vs a {G // 2}/{G} group",
             title="signal of one group by pass rate", xlabel="correct answers in the group")
    lines = [[label, _spread(m, "eval/accuracy", 100), *(f"{v * 100:.1f}" for v in shares[label][1:G]),
              *(f"{v:.2f}" for v in weights[label][1:G])] for label, m in by_label(rows).items()]
    table = _table(["scale_rewards", "acc after %", *[f"share {c} %" for c in cats[1:G]],
                    *[f"weight {c}" for c in cats[1:G]]], lines)
    return fig, table, {"gradient_share": shares, "group_weight": weights}


def report_all_wrong(sweep_dir, rows):
    fig = Panels(title="Experiment 5: all-wrong groups, 3-digit sums for the 2-digit model (3 seeds)")
    fig.curves(seed_bands(rows, sweep_dir, "eval/accuracy", x="completions"),
               title="held-out greedy accuracy",
               xlabel="completions sampled (kept)", ylabel="accuracy", percent=True)
    fig.curves(seed_bands(rows, sweep_dir, "frac_zero_std", window=20),
               title="zero-std groups (20-step mean)", xlabel="step", ylabel="share")
    fig.curves(seed_bands(rows, sweep_dir, "frac_stuck", window=20), title="all-wrong groups (20-step mean)",
               xlabel="step", ylabel="share")
    lines = [[label, f"{_first_eval(m, sweep_dir) * 100:.1f}", _spread(m, "eval/accuracy", 100),
              _spread(m, "mean/frac_zero_std", 1, ".2f"), _spread(m, "mean/frac_stuck", 1, ".2f"),
              _spread(m, "mean/completion_tokens", 1, ".0f"), _spread(m, "wall_s", 1, ".0f")]
             for label, m in by_label(rows).items()]
    table = _table(["variant", "acc before %", "acc after %", "zero-std share", "stuck share",
                    "completion tokens a step", "wall s"], lines)
    return fig, table, {}


def _acc_at(folder, seconds):
    """Held-out accuracy at `seconds` of training, linear between evaluations (None past the run)."""
    xs, ys = cell_series(folder, "eval/accuracy", x="seconds")
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= seconds <= x1:
            return y0 + (y1 - y0) * (seconds - x0) / (x1 - x0 or 1)
    return None


def report_grpo_vs_ppo(sweep_dir, rows):
    groups = by_label(rows)
    phases = sorted({k for r in rows for k, v in r.items() if k.startswith("mean/time/")
                     and k != "mean/time/step"
                     and isinstance(v, float) and v >= 0.001})         # phases that take a millisecond
    budget = min(cell_series(sweep_dir / r["folder"], "eval/accuracy", x="seconds")[0][-1] for r in rows)
    fig = Panels(title="Experiment 6: GRPO vs PPO with a critic, same model, G, lengths, machine (3 seeds)",
                 columns=2)
    fig.curves(seed_bands(rows, sweep_dir, "eval/accuracy", x="seconds"), title="held-out accuracy",
               xlabel="training seconds", ylabel="accuracy", percent=True)
    fig.bars({label: [_mean([r.get(p) for r in m]) for p in phases] for label, m in groups.items()},
             categories=[p.split("/")[-1] for p in phases], title="seconds per step by phase", ylabel="s")
    fig.bars({label: [_mean([r.get("mean/peak_rss_mib") for r in m])] for label, m in groups.items()},
             categories=["peak RSS"], title="peak host memory (MiB)", ylabel="MiB")
    lines = []
    for label, m in groups.items():
        at = [_acc_at(sweep_dir / r["folder"], budget) for r in m]
        lines.append([label, _spread(m, "mean/time/step", 1, ".3f"),
                      *(_spread(m, p, 1, ".3f") for p in phases), _spread(m, "mean/peak_rss_mib", 1, ".0f"),
                      _spread(m, "eval/accuracy", 100), f"{_mean(at) * 100:.1f}"])
    table = _table(["algorithm", "s/step", *(p.split("/")[-1] + " s" for p in phases), "peak RSS MiB",
                    "acc after %", f"acc at {budget:.0f} training s %"], lines)
    return fig, table, {"budget_s": budget}


def run(name: str, report_only: bool) -> None:
    spec = Path("configs/sweeps") / f"{name}.yaml"
    if not spec.is_file():
        raise UserError(f"{spec} not found in {Path.cwd()}: run this script from the repository root")
    t0 = time.monotonic()
    if not report_only:
        if name == "length_chain":
            prepare_length_chain()
        sweep.main([str(spec)])
    spec_file, _ = sweep.prepare(spec)
    sweep_dir = spec_file.output_dir
    rows = sweep_rows(sweep_dir)
    FIGURES.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig, table, extra = globals()[f"report_{name}"](sweep_dir, rows)
    png = fig.save(FIGURES / f"{name}.png")
    wall = sum(r["wall_s"] for r in rows)
    (RESULTS / f"{name}.md").write_text(table + f"\n\nSum of cell wall times: {wall / 60:.1f} min.\n")
    (RESULTS / f"{name}.json").write_text(json.dumps({"rows": rows, **extra}, indent=1, default=str))
    print(table,
          f"\nfigure {png}; cells' wall time {wall / 60:.1f} min; this command {time.monotonic() - t0:.0f} s",
          flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="+", choices=[*EXPERIMENTS, "all"], metavar="NAME",
                   help=f"one or more of {', '.join(EXPERIMENTS)}, or all")
    p.add_argument("--report", action="store_true", help="figure and table only, from the finished sweep")
    args = p.parse_args(argv)
    for name in EXPERIMENTS if "all" in args.names else args.names:
        run(name, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:]))     # a user error: one `error:` line, exit 2
