"""`grpokit report RUN_DIR`: one self-contained HTML page about a run (opens in a browser, no server).

    grpokit report runs/demo                    # -> runs/demo/report.html
    grpokit report runs/demo --out demo.html --smooth 0.8

The page holds, with every image embedded as base64 PNG (no external file, script or font):
a summary (steps, wall time, reward and accuracy at the start and the end), the before/after held-out
evaluation (eval.jsonl rows tagged before / stepN / after), the figures of `grpokit plot`, sample
completions (completions.jsonl: the first and the last logged step), the per-prompt summary (with
run.track_prompts), the last step's metrics, and the config with the keys that differ from the defaults
in bold.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import json
from pathlib import Path
from typing import Any

from grpokit import __version__
from grpokit.config.schema import GRPOConfig
from grpokit.errors import UserError, check_out_file, write_text_aside
from grpokit.observe.metrics import read_metrics
from grpokit.observe.plots import DEFAULT_SMOOTH, figures, load_runs
from grpokit.observe.tracking import short_name, summarize_prompts

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px auto; \
max-width: 1180px;
       color: #222; line-height: 1.4; padding: 0 12px; }
h1 { margin-bottom: 4px; } h2 { border-bottom: 2px solid #ddd; padding-bottom: 4px; margin-top: 32px; }
.muted { color: #777; font-size: 0.9em; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.card { border: 1px solid #ddd; border-radius: 8px; padding: 10px 14px; min-width: 150px; \
background: #fafafa; }
.card .v { font-size: 1.4em; font-weight: 600; } .card .k { color: #666; font-size: 0.85em; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: right; vertical-align: top; }
th { background: #f0f0f0; } td.text { text-align: left; font-family: ui-monospace, Menlo, monospace;
     white-space: pre-wrap; max-width: 640px; word-break: break-word; }
td.pos { background: #e6f4ea; } td.neg { background: #fce8e6; }
img.fig { max-width: 100%; height: auto; border: 1px solid #eee; margin: 8px 0; display: block; }
.prompt { font-family: ui-monospace, Menlo, monospace; background: #f6f8fa; padding: 6px 8px; \
white-space: pre-wrap; }
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _num(v: Any, digits: int = 4) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return _e("-" if v is None else v)
    return f"{v:.{digits}g}"


def _table(header: list[str], rows: list[list[str]], raw: bool = False) -> str:
    """An HTML table; cells are escaped unless raw (then they are already <td> elements)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + ("".join(r) if raw else "".join(f"<td>{_e(c)}</td>" for c in r)) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def png_data_uri(fig) -> str:
    """A matplotlib Figure as a data: URI (base64 PNG)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _window_mean(rows: list[dict[str, Any]], key: str, last: bool) -> float | None:
    """Mean of `key` over the first (or last) 10% of steps (at least one row)."""
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    if not vals:
        return None
    n = max(1, len(vals) // 10)
    part = vals[-n:] if last else vals[:n]
    return sum(part) / len(part)


def summary_cards(metrics: list[dict[str, Any]], evals: list[dict[str, Any]]) -> str:
    """Headline numbers: steps, wall time, reward / accuracy start -> end, held-out before -> after."""
    cards = [("steps", str(metrics[-1].get("step", len(metrics))))]
    total = sum(r.get("time/step", 0.0) for r in metrics)
    cards.append(("training wall time", f"{total / 60:.1f} min" if total >= 60 else f"{total:.1f} s"))
    for key, label in (("reward_mean", "reward"), ("accuracy", "train accuracy"),
                       ("frac_zero_std", "zero-std groups")):
        a, b = _window_mean(metrics, key, False), _window_mean(metrics, key, True)
        if a is not None:
            cards.append((f"{label} (first → last 10% of steps)", f"{a:.3g} → {b:.3g}"))
    by_tag = {e.get("tag"): e for e in evals}
    if "before" in by_tag and "after" in by_tag and "accuracy" in by_tag["before"]:
        cards.append(("held-out accuracy (before → after)",
                      f"{by_tag['before']['accuracy']:.3g} → {by_tag['after']['accuracy']:.3g}"))
    for key, label, unit in (("approx_kl", "final KL", ""), ("peak_rss_mib", "peak RSS", " MiB"),
                             ("peak_cuda_mib", "peak CUDA", " MiB")):
        if isinstance(metrics[-1].get(key), (int, float)):
            cards.append((label, f"{metrics[-1][key]:.4g}{unit}"))
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="v">{_e(v)}</div><div class="k">{_e(k)}</div></div>'
        for k, v in cards) + "</div>"


def eval_section(evals: list[dict[str, Any]]) -> str:
    """Held-out evaluations (one row per tag) and, with before and after, the change."""
    if not evals:
        return "<p class='muted'>No eval.jsonl in this run (run.eval_limit was 0).</p>"
    keys = [k for k in evals[0] if k not in ("tag", "step") and isinstance(evals[0][k], (int, float))]
    rows = [[e.get("tag", ""), str(e.get("step", ""))] + [_num(e.get(k)) for k in keys] for e in evals]
    by_tag = {e.get("tag"): e for e in evals}
    if "before" in by_tag and "after" in by_tag:
        b, a = by_tag["before"], by_tag["after"]
        rows.append(["after − before", ""] + [
            f"{a[k] - b[k]:+.4g}" if isinstance(a.get(k), (int, float)) and isinstance(b.get(k), (int, float))
            else "-" for k in keys])
    return _table(["tag", "step", *keys], rows)


def completions_section(entries: list[dict[str, Any]]) -> str:
    """The first and the last logged step's completions, rewards (green > 0 > red advantages)."""
    if not entries:
        return "<p class='muted'>No completions.jsonl in this run (set run.log_completions_steps).</p>"
    steps = sorted({e["step"] for e in entries})
    parts = []
    for step in dict.fromkeys([steps[0], steps[-1]]):
        for e in [e for e in entries if e["step"] == step]:
            answer = f" — answer: <b>{_e(e['answer'])}</b>" if e.get("answer") is not None else ""
            parts.append(f"<h3>step {step}{answer} — group reward mean {_num(e.get('reward_mean'), 3)}, "
                         f"std {_num(e.get('reward_std'), 3)}</h3>"
                         f"<div class='prompt'>{_e(e['prompt'])}</div>")
            funcs = list(e["completions"][0]["rewards"]) if e["completions"] else []
            rows = []
            for i, c in enumerate(e["completions"]):
                cls = "pos" if c["advantage"] > 1e-9 else "neg" if c["advantage"] < -1e-9 else ""
                calls = "".join(f"\n  {x['tool']}({_e(json.dumps(x['arguments']))}) -> "
                                f"{_e(x['error'] or x['result'])}" for x in c.get("calls", []))
                cells = [f"<td>{i}</td>", f"<td class='text'>{_e(c['text'])}"
                         f"{'<br><i>tool calls:</i>' + calls if calls else ''}</td>",
                         f"<td>{_num(c['reward'], 3)}</td>", f"<td class='{cls}'>{c['advantage']:+.3f}</td>"]
                cells += [f"<td>{_num(c['rewards'].get(f), 3)}</td>" for f in funcs]
                cells.append(f"<td>{c['length']}{' (cut)' if c['truncated'] else ''}</td>")
                rows.append(cells)
            parts.append(_table(["#", "completion", "reward", "advantage", *map(short_name, funcs), "tokens"],
                                rows, raw=True))
    return "".join(parts)


def prompts_section(summary: dict[str, Any] | None) -> str:
    """Per-prompt outcome counts and the prompts that graduated, earliest first."""
    if not summary:
        return "<p class='muted'>No per-prompt history (set run.track_prompts: true).</p>"
    head = (f"<p>{summary['num_prompts']} prompts seen, {summary['num_visits']} group visits: "
            f"<b>{summary['graduated']}</b> graduated (all right on the last visit), "
            f"<b>{summary['stuck']}</b> stuck (all wrong on every visit), <b>{summary['learning']}</b> "
            "still learning.</p>")
    rows = [[p["status"], str(p["graduated_at"] or "-"), str(p["visits"]), p["prompt"][:120],
             " ".join(_num(m, 2) for m in p["reward_means"][-8:])] for p in summary["prompts"][:30]]
    return head + _table(["status", "graduated at", "visits", "prompt", "reward mean per visit (last 8)"],
                         rows)


def metrics_section(row: dict[str, Any]) -> str:
    """The last step's metrics, grouped by their prefix."""
    groups: dict[str, list[list[str]]] = {}
    for k, v in row.items():
        if "/iter" in k:  # mu > 1: the metrics of policy updates 2..mu
            group = f"update {int(k.rsplit('/iter', 1)[1]) + 1} of the batch"
        else:
            group = k.split("/")[0] if "/" in k else "train"
        groups.setdefault(group, []).append([k, _num(v)])
    cols = "".join(f"<div>{_table([name, 'value'], rows)}</div>" for name, rows in groups.items())
    return f"<div style='display:flex; flex-wrap:wrap; gap:16px'>{cols}</div>"


def config_section(config: dict[str, Any] | None) -> str:
    """Every config value; the ones that differ from the GRPOConfig defaults in bold."""
    if not config:
        return "<p class='muted'>No config.json in this run.</p>"
    default = GRPOConfig().to_dict()
    rows = []
    for section, values in config.items():
        if not isinstance(values, dict):
            rows.append([f"<td class='text'>{_e(section)}</td>", f"<td class='text'>{_e(values)}</td>"])
            continue
        for k, v in values.items():
            changed = default.get(section, {}).get(k, object()) != v
            val = f"<b>{_e(json.dumps(v))}</b>" if changed else _e(json.dumps(v))
            rows.append([f"<td class='text'>{_e(section)}.{_e(k)}</td>", f"<td class='text'>{val}</td>"])
    return _table(["key", "value (bold: not the default)"], rows, raw=True)


def build_report(run_dir: str | Path, smooth: float = DEFAULT_SMOOTH) -> str:
    """The HTML page of one run folder, as a string."""
    run_dir = Path(run_dir)
    run = load_runs([run_dir])[0]
    optional = {name: read_metrics(run_dir, name) if (run_dir / name).is_file() else []
                for name in ("completions.jsonl",)}
    config = _read_json(run_dir / "config.json")
    summary = _read_json(run_dir / "prompt_summary.json")
    if summary is None and (run_dir / "prompt_history.jsonl").is_file():
        summary = summarize_prompts(read_metrics(run_dir, "prompt_history.jsonl"))
    images = "".join(f"<img class='fig' alt='{_e(name)}' src='{png_data_uri(fig)}'>"
                     for name, fig in figures([run], smooth).items())
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    sections = [
        ("Summary", summary_cards(run.metrics, run.evals)),
        ("Held-out evaluation", eval_section(run.evals)),
        ("Training curves", images),
        ("Sample completions", completions_section(optional["completions.jsonl"])),
        ("Prompts", prompts_section(summary)),
        (f"Metrics at step {run.metrics[-1].get('step', '')}", metrics_section(run.metrics[-1])),
        ("Config", config_section(config)),
    ]
    body = "".join(f"<h2>{_e(title)}</h2>{content}" for title, content in sections)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>grpokit report: {_e(run.name)}"
            f"</title><style>{CSS}</style></head><body><h1>GRPO run: {_e(run.name)}</h1>"
            f"<div class='muted'>{_e(run_dir.resolve())} · generated {when} by grpokit {__version__}</div>"
            f"{body}</body></html>")


def _read_json(path: Path) -> Any:
    """A run's JSON file, None when absent; one that does not parse names itself."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError is a ValueError
        raise UserError(f"{path} is unreadable (not JSON): delete it or restore it from the run") from None


def write_report(run_dir: str | Path, out: str | Path | None = None, smooth: float = DEFAULT_SMOOTH) -> Path:
    """Write the report of run_dir to `out` (default run_dir/report.html) and return its path.

    The page is written beside `out` and renamed onto it, so a failure leaves an older report whole.
    """
    load_runs([run_dir])  # a folder without a readable metrics.jsonl fails first, naming it
    path = check_out_file(Path(out) if out is not None else Path(run_dir) / "report.html", "--out")
    write_text_aside(path, build_report(run_dir, smooth))
    return path
