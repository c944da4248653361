"""docs/agents.md's tables and the README's agents rows, from benchmarks/results/agents_*
(rows written by benchmarks/agents_demo.py and benchmarks/agents_vs_trl.py); scripts/update_readme.py calls
`render_agents` and `agents_rows`."""

import json
import re

from docs_measured import RESULTS
from docs_measured import pct as _pct
from docs_measured import rows as _rows

AGENTS_START, AGENTS_END = "<!-- agents-results:start -->", "<!-- agents-results:end -->"
VS_TRL_START, VS_TRL_END = "<!-- agents-vs-trl:start -->", "<!-- agents-vs-trl:end -->"
SMOL_START, SMOL_END = "<!-- agents-smollm2:start -->", "<!-- agents-smollm2:end -->"


def _block(text: str, start: str, end: str, body: str) -> str:
    return re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{body}\n{end}", text,
                  flags=re.S)


def _agent_runs(name: str) -> list[tuple[dict, dict]]:
    return [(r["before"], r["after"]) for r in _agent_records(name)]


def _agent_records(name: str) -> list[dict]:
    """Each seed's run of one agents demonstration: its evaluations by tag, training seconds, wall row."""
    out = []
    for f in sorted(RESULTS.glob(f"{name}_seed*_eval.jsonl")):
        tag = f.name[:-len("_eval.jsonl")]
        evals = {r["tag"]: r for r in _rows(f.name)}
        train_s = sum(r.get("time/step", 0.0) for r in _rows(f"{tag}_metrics.jsonl"))
        out.append({**evals, "seed": int(tag.rsplit("seed", 1)[1]), "train_s": train_s,
                    "wall": json.loads((RESULTS / f"{tag}_wall.json").read_text())})
    return out


# each demonstration's runs, (label, file tag suffix): its config's rows first, then earlier recipes
RECIPES = {
    "calculator": (("with the tool", ""), ("without", "_notool")),
    "guess_number": (("with the tool (the config: beta 0.04)", ""),
                     ("with the tool, beta 0 (the config before)", "_beta0"),
                     ("with the tool, beta 0, plus a cost of 0.25 per guess after the yes", "_turncost"),
                     ("with the tool, beta 0, decayed over 300 steps", "_decay"),
                     ("with the tool, beta 0, constant learning rate, 10 minutes (the first recipe)",
                      "_constant")),
}
GUESS = "agents_guess_number"  # the config's runs (configs/agents_guess_number.yaml)


def agents_table(name: str, key: str, label: str) -> str:
    """One row per run of an agents demonstration (with the tool and, where run, without)."""
    lines = [f"| run | seed | {label} before | {label} after | change | turns | tool calls per problem | "
             "steps | training s | wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for kind, suffix in RECIPES.get(name, (("with the tool", ""),)):
        for r in _agent_records(f"agents_{name}{suffix}"):
            b, a = r["before"], r["after"]
            lines.append(f"| {kind} | {r['seed']} | {_pct(b[key])} | {_pct(a[key])} | "
                         f"{100 * (a[key] - b[key]):+.1f} pt | {b.get('turns_mean', 1):.2f} -> "
                         f"{a.get('turns_mean', 1):.2f} | {b.get('tool_calls_mean', 0):.2f} -> "
                         f"{a.get('tool_calls_mean', 0):.2f} | {a['step']} | {r['train_s']:.0f} | "
                         f"{r['wall']['wall_seconds']:.0f} |")
    return "\n".join(lines)


def agents_results() -> str:
    """docs/agents.md's measured tables."""
    n_calc = int(_agent_runs("agents_calculator")[0][0]["num_problems"])
    n_guess = int(_agent_runs(GUESS)[0][0]["num_problems"])
    return (f"Calculator, 3-digit products (held-out greedy accuracy, {n_calc} problems):\n\n"
            f"{agents_table('calculator', 'accuracy', 'accuracy')}\n\n"
            f"Guess the number (success rate over {n_guess} held-out episodes, greedy):\n\n"
            f"{agents_table('guess_number', 'rewards/GuessNumber', 'success')}")


def agents_rows() -> list[str]:
    calc, bare = _agent_runs("agents_calculator"), _agent_runs("agents_calculator_notool")
    guess = _agent_runs(GUESS)
    key = "rewards/GuessNumber"
    calc_txt = " / ".join(f"{100 * a['accuracy']:.1f}" for _, a in calc)
    bare_txt = " / ".join(f"{100 * a['accuracy']:.1f}" for _, a in bare)
    guess_txt = " / ".join(f"{100 * a[key]:.1f}" for _, a in guess)
    turns = " / ".join(f"{a['turns_mean']:.2f}" for _, a in guess)
    return [
        "| agents: the calculator tool, 3-digit products (demo-size model, tool-call warm start, 10 min of "
        f"GRPO on one core) | {_pct(calc[0][0]['accuracy'])} -> {calc_txt}% with the tool "
        f"({len(calc)} seeds); "
        f"without it {_pct(bare[0][0]['accuracy'])} -> {bare_txt}% | [agents](docs/agents.md), "
        "`benchmarks/results/agents_calculator_*` |",
        "| agents: guess the number, higher / lower feedback (multi-turn, 600 GRPO steps on one core, "
        "beta 0.04) "
        "| success "
        f"{_pct(guess[0][0][key])} -> {guess_txt}% ({len(guess)} seeds), turns "
        f"{guess[0][0]['turns_mean']:.2f} "
        f"-> {turns} | [agents](docs/agents.md), `benchmarks/results/agents_guess_number_*` |",
        smollm2_calculator_row(), agents_vs_trl_row()]


def smollm2_calculator_row() -> str:
    rows = {r["tag"]: r for r in _rows("agents_calculator_smollm2_seed0_eval.jsonl")}
    b, a = rows["before"], rows["after"]
    train_s = sum(r.get("time/step", 0.0) for r in _rows("agents_calculator_smollm2_seed0_metrics.jsonl"))
    return ("| agents: SmolLM2-135M-Instruct with the calculator, 3-digit products (5-step sft warm start, "
            f"{train_s / 60:.0f} min of GRPO on one core, seed 0) | {_pct(b['accuracy'])} -> "
            f"{_pct(a['accuracy'])} held-out, tool calls per problem {b['tool_calls_mean']:.2f} -> "
            f"{a['tool_calls_mean']:.2f} ({a['step']} steps) | [agents](docs/agents.md), "
            "`benchmarks/results/agents_calculator_smollm2_*` |")


def agents_vs_trl_row() -> str:
    c = [r for r in _rows("agents_vs_trl.jsonl") if r.get("kind") == "compare"][-1]
    return ("| one TRL agent program (a tool, G 4, B 4) on TRL 1.16 and on grpokit.trl, only the import "
            "changed (tiny tool-calling model, one core) | "
            f"{c['trl_over_grpokit_seconds_per_step']:.2f}x faster a step "
            f"({c['trl_over_grpokit_cpu_seconds_per_step']:.2f}x in CPU seconds) | [agents](docs/agents.md), "
            "`benchmarks/results/agents_vs_trl.jsonl` |")


def agents_vs_trl() -> str:
    """docs/agents.md's side-by-side table: the last compare row of benchmarks/results/agents_vs_trl.jsonl."""
    c = [r for r in _rows("agents_vs_trl.jsonl") if r.get("kind") == "compare"][-1]
    t, g = c["trl"], c["grpokit"]
    return "\n".join([
        "| | TRL 1.16 | grpokit.trl | TRL / grpokit |", "|---|---|---|---|",
        f"| seconds per step (wall) | {t['median_seconds_per_step']:.2f} | "
        f"{g['median_seconds_per_step']:.2f} | {c['trl_over_grpokit_seconds_per_step']:.2f}x |",
        f"| CPU seconds per step | {t['median_cpu_seconds_per_step']:.3f} | "
        f"{g['median_cpu_seconds_per_step']:.3f} | {c['trl_over_grpokit_cpu_seconds_per_step']:.2f}x |",
        f"| a whole run, CPU seconds (imports, model, {c['steps']} steps, children) | "
        f"{t['mean_process_tree_cpu_seconds']:.1f} | {g['mean_process_tree_cpu_seconds']:.1f} | "
        f"{t['mean_process_tree_cpu_seconds'] / g['mean_process_tree_cpu_seconds']:.2f}x |",
        f"| reward per step (mean of {t['rounds'] * c['steps']} steps) | {t['mean_reward']:.3f} | "
        f"{g['mean_reward']:.3f} | |",
        f"| tool calls per trajectory (mean) | {t['mean_tool_calls_per_trajectory']:.2f} | "
        f"{g['mean_tool_calls_per_trajectory']:.2f} | |",
        f"| peak RSS | {t['peak_rss_mb']:.0f} MB | {g['peak_rss_mb']:.0f} MB | |"])


def agents_smollm2() -> str:
    """docs/agents.md's SmolLM2 calculator table: every evaluation of its raw rows."""
    lines = ["| evaluation | step | accuracy | tool calls per problem | turns | truncated |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['tag']} | {r['step']} | {_pct(r['accuracy'])} | {r['tool_calls_mean']:.2f} | "
              f"{r['turns_mean']:.2f} | {r['frac_truncated']:.2f} |"
              for r in _rows("agents_calculator_smollm2_seed0_eval.jsonl")]
    return "\n".join(lines)


def render_agents(text: str) -> str:
    text = _block(text, SMOL_START, SMOL_END, agents_smollm2())
    text = _block(text, VS_TRL_START, VS_TRL_END, agents_vs_trl())
    return _block(text, AGENTS_START, AGENTS_END, agents_results())
