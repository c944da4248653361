"""What the policy actually wrote, and which prompts it learned: the completions log and prompt history.

Two optional records, both JSONL in the run folder (truncated on resume like metrics.jsonl):

    completions.jsonl     every run.log_completions_steps steps: a few prompts with their G completions,
                          each with its reward, per-function scores and advantage (also printed as a table);
                          a multi-turn completion (tools) is its conversation as text, with its tool calls
                          (name, arguments, result, error, latency), turns and why it ended
    prompt_history.jsonl  with run.track_prompts: one row per prompt each time it is sampled, with the
                          group's reward mean and std (and accuracy), so a user can see which questions
                          "graduated" (the whole group answers right) and when

At the end of training `Tracker.finish` writes prompt_summary.json: one entry per prompt with its
status, from the group statistics of every visit:

    graduated  the last visit's group was all correct (accuracy 1, zero reward std); graduated_at is the
               first step of that final all-correct streak
    stuck      every visit's group was all wrong (accuracy 0)
    learning   anything else (the group disagreed at least once: that is where GRPO has a gradient)

Without a correctness signal (no accuracy reward and no answer column) "all correct" / "all wrong"
read as "zero std at the highest / lowest group mean seen in the run".
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.observe.metrics import MetricsWriter, read_metrics

COMPLETIONS_PROMPTS = 2   # prompts (each with its G completions) per completions log entry
TEXT_LIMIT = 300          # characters of a prompt kept in the history / of a completion in the console


def prompt_text(prompt: Any) -> str:
    """A prompt as text: plain text as is, chat messages as their contents joined by newlines."""
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)
    return str(prompt)


def short_name(reward_name: str) -> str:
    """A reward function's display name: 'path/to/file.py:fn' or 'package.module:fn' -> 'fn'."""
    return reward_name.rsplit(":", 1)[-1]


def prompt_id(prompt: Any) -> str:
    """A stable short id for a prompt (the same across runs and resumes): sha1 of its text, 10 hex digits."""
    return hashlib.sha1(prompt_text(prompt).encode("utf-8")).hexdigest()[:10]


def conversation_text(completion: Any) -> str:
    """A completion as readable text: as is, or chat messages one per line (calls and tool results shown)."""
    if not isinstance(completion, list):
        return str(completion)
    lines = []
    for m in completion:
        calls = [f"{c['function']['name']}({json.dumps(c['function'].get('arguments', {}))})"
                 for c in m.get("tool_calls") or []]
        who = f"tool {m.get('name', '')}".strip() if m.get("role") == "tool" else str(m.get("role", ""))
        lines.append(f"[{who}] {m.get('content', '')}" + (f" -> calls {', '.join(calls)}" if calls else ""))
    return "\n".join(lines)


def _calls(trajectory) -> dict[str, Any]:
    """A trajectory's tool calls, turns and stop, for completions.jsonl."""
    if trajectory is None:
        return {}
    return {"turns": len(trajectory.turns), "stop": trajectory.stop,
            "calls": [{"tool": c.name, "arguments": c.arguments, "result": c.result[:TEXT_LIMIT],
                       "error": c.error, "latency_s": round(c.latency_s, 6)} for c in trajectory.calls]}


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def group_rows(step: int, rollout, rewards: torch.Tensor, correct: torch.Tensor | None,
               advantages: torch.Tensor | None = None) -> list[dict[str, Any]]:
    """One prompt_history row per group: reward mean/std over its G completions (NaN rewards excluded).

    std is the sample std (Bessel), as in reward_stats and the group advantages. With `advantages`
    ([N], a completion's token mean for process supervision) a row also holds where the gradient
    signal goes: adv_abs = sum_i |A_i| and adv_abs_tokens = sum_i |A_i| * |o_i| over the group.
    """
    G = rollout.group_size
    r = rewards.detach().float().cpu().view(-1, G)                        # [B, G]
    c = None if correct is None else correct.detach().float().cpu().view(-1, G)
    if advantages is not None:
        a = advantages.detach().float().cpu().abs().view(-1, G)           # [B, G]
        tokens = rollout.completion_mask.detach().float().cpu().sum(-1).view(-1, G)  # [B, G]
    rows = []
    for g in range(r.shape[0]):
        vals = r[g][~torch.isnan(r[g])]
        row = {"step": step, "prompt_id": prompt_id(rollout.prompts[g * G]),
               "prompt": prompt_text(rollout.prompts[g * G])[:TEXT_LIMIT],
               "reward_mean": _num(float(vals.mean())) if vals.numel() else None,
               "reward_std": float(vals.std()) if vals.numel() > 1 else 0.0}
        if c is not None and not torch.isnan(c[g]).all():
            row["accuracy"] = float(torch.nanmean(c[g]))
        if advantages is not None:
            row["adv_abs"], row["adv_abs_tokens"] = float(a[g].sum()), float((a[g] * tokens[g]).sum())
        rows.append(row)
    return rows


def completion_entries(step: int, rollout, scores, advantages: torch.Tensor, answers: dict[str, Any],
                       num_prompts: int = COMPLETIONS_PROMPTS) -> list[dict[str, Any]]:
    """completions.jsonl rows: the first `num_prompts` groups of the batch with all their completions."""
    G = rollout.group_size
    adv = advantages.detach().float().cpu()
    total = scores.total.detach().float().cpu()
    per_func = {k: v.detach().float().cpu() for k, v in scores.per_func.items()}
    lengths = rollout.completion_mask.sum(-1).cpu()
    trajs = getattr(rollout, "trajectories", None)   # multi-turn: tool calls per completion
    entries = []
    for g in range(min(num_prompts, len(rollout.prompts) // G)):
        rows = range(g * G, (g + 1) * G)
        group = total[g * G:(g + 1) * G]
        valid = group[~torch.isnan(group)]
        entries.append({
            "step": step, "prompt_id": prompt_id(rollout.prompts[g * G]),
            "prompt": prompt_text(rollout.prompts[g * G]),
            "answer": answers.get(prompt_text(rollout.prompts[g * G])),
            "reward_mean": _num(float(valid.mean())) if valid.numel() else None,
            "reward_std": float(valid.std()) if valid.numel() > 1 else 0.0,
            "completions": [{"text": conversation_text(rollout.completions[i]),
                             "reward": _num(float(total[i])), "advantage": float(adv[i]),
                             "rewards": {k: _num(float(v[i])) for k, v in per_func.items()},
                             "length": int(lengths[i]), "truncated": bool(rollout.truncated[i]),
                             **_calls(trajs[i] if trajs else None)}
                            for i in rows]})
    return entries


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:+.3f}" if isinstance(x, float) else str(x)


def _cell(text: str, limit: int = 80) -> str:
    flat = text.replace("\n", "⏎ ")
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def render_completions(entry: dict[str, Any], use_rich: bool | None = None) -> str:
    """One completions entry as a console table (rich when installed, plain text otherwise)."""
    funcs = list(entry["completions"][0]["rewards"]) if entry["completions"] else []
    title = (f"step {entry['step']} | prompt: {_cell(entry['prompt'], 60)!r}"
             + (f" | answer: {entry['answer']}" if entry.get("answer") is not None else "")
             + f" | reward mean {_fmt(entry['reward_mean'])} std {entry['reward_std']:.3f}")
    header = ["#", "completion", "reward", "advantage", *map(short_name, funcs), "len"]
    body = [[str(i), _cell(c["text"]), _fmt(c["reward"]), _fmt(c["advantage"]),
             *(_fmt(c["rewards"][f]) for f in funcs), f"{c['length']}{'+' if c['truncated'] else ''}"]
            for i, c in enumerate(entry["completions"])]
    if use_rich is None:
        use_rich = importlib.util.find_spec("rich") is not None
    if use_rich:
        from rich.console import Console
        from rich.table import Table

        table = Table(show_lines=False)
        for h in header:
            table.add_column(h, justify="left" if h == "completion" else "right", overflow="fold")
        for row in body:
            table.add_row(*row)
        buf = io.StringIO()
        console = Console(file=buf, width=140, force_terminal=sys.stdout.isatty(), highlight=False)
        console.print(title, markup=False)
        console.print(table)
        return buf.getvalue().rstrip("\n")
    widths = [max(len(h), *(len(r[j]) for r in body)) for j, h in enumerate(header)]
    def line(cells):
        return "  ".join(c.ljust(w) if j == 1 else c.rjust(w)
                         for j, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([title, line(header), "  ".join("-" * w for w in widths), *(line(r) for r in body)])


class Tracker:
    """The completions log and the per-prompt history of one training run (both optional).

    Args:
        out_dir: the run folder.
        log_completions_steps: log completions every N steps (0 = never).
        track_prompts: record each sampled group in prompt_history.jsonl.
        start_step: the step training resumes from (later rows are dropped from the files).
        examples: the training examples (`.prompt`, `.answer`), to show each prompt's reference answer.
        loggers: an optional `grpokit.observe.loggers.Loggers`; completion tables are sent to it too.
        echo: print the completion tables on the console.
    """

    def __init__(self, out_dir: str | Path, log_completions_steps: int = 0, track_prompts: bool = False,
                 start_step: int = 0, examples: Sequence[Any] = (), loggers=None, echo: bool = True) -> None:
        self.out_dir = Path(out_dir)
        self.every = log_completions_steps
        self.loggers, self.echo = loggers, echo
        self._examples = examples
        self._answers: dict[str, Any] | None = None
        self.completions = (MetricsWriter(self.out_dir / "completions.jsonl", start_step)
                            if self.every else None)
        self.history = (MetricsWriter(self.out_dir / "prompt_history.jsonl", start_step)
                        if track_prompts else None)

    @classmethod
    def from_config(cls, cfg, out_dir: str | Path, start_step: int, examples: Sequence[Any] = (),
                    loggers=None) -> Tracker:
        """A Tracker for run.log_completions_steps / run.track_prompts of a GRPOConfig."""
        return cls(out_dir, cfg.run.log_completions_steps, cfg.run.track_prompts, start_step, examples,
                   loggers)

    @property
    def answers(self) -> dict[str, Any]:
        """prompt text -> reference answer, built on first use."""
        if self._answers is None:
            self._answers = {prompt_text(ex.prompt): getattr(ex, "answer", None) for ex in self._examples}
        return self._answers

    def observe(self, step: int, rollout, scores, advantages: torch.Tensor,
                correct: torch.Tensor | None = None) -> None:
        """Record one step's batch.

        Args:
            step: the step number (after the update, as in metrics.jsonl).
            rollout: the step's Rollout (N = B * G completions, groups contiguous).
            scores: its RewardBatch (`.total` [N], `.per_func` name -> [N]).
            advantages: [N] advantage per completion (token mean for process supervision).
            correct: [N] 1.0 where the answer is right (NaN / None when unknown).
        """
        if self.history is not None:
            self.history.write_many(group_rows(step, rollout, scores.total, correct, advantages))
        if self.completions is not None and step % self.every == 0:
            entries = completion_entries(step, rollout, scores, advantages, self.answers)
            self.completions.write_many(entries)
            if self.echo:
                from tqdm import tqdm

                for entry in entries:
                    tqdm.write(render_completions(entry))
            if self.loggers is not None:
                self.loggers.log_completions(entries, step)

    def finish(self) -> dict[str, Any] | None:
        """Close the files; with prompt tracking, write prompt_summary.json and print its headline."""
        for w in (self.completions, self.history):
            if w is not None:
                w.close()
        if self.history is None:
            return None
        summary = summarize_prompts(read_metrics(self.out_dir / "prompt_history.jsonl"))
        (self.out_dir / "prompt_summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        if self.echo:
            from tqdm import tqdm

            tqdm.write(summary_headline(summary))
        return summary


def _all(row: dict[str, Any], correct: bool, hi: float, lo: float) -> bool:
    """Whether this visit's group was all correct (correct=True) or all wrong (False)."""
    if "accuracy" in row:
        return row["accuracy"] == (1.0 if correct else 0.0)
    mean = row.get("reward_mean")
    return mean is not None and row["reward_std"] < 1e-8 and math.isclose(mean, hi if correct else lo)


def summarize_prompts(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-prompt status (graduated / stuck / learning, see the module docstring) from history rows."""
    means = [r["reward_mean"] for r in history if r.get("reward_mean") is not None]
    hi, lo = (max(means), min(means)) if means else (0.0, 0.0)
    visits: dict[str, list[dict[str, Any]]] = {}
    for row in history:
        visits.setdefault(row["prompt_id"], []).append(row)
    prompts = []
    for pid, rows in visits.items():
        rows.sort(key=lambda r: r["step"])
        right = [_all(r, True, hi, lo) for r in rows]
        start = len(rows)                                     # first visit of the final all-correct streak
        while start > 0 and right[start - 1]:
            start -= 1
        status = ("graduated" if right[-1] else
                  "stuck" if all(_all(r, False, hi, lo) for r in rows) else "learning")
        prompts.append({"prompt_id": pid, "prompt": rows[0]["prompt"], "status": status, "visits": len(rows),
                        "first_step": rows[0]["step"], "last_step": rows[-1]["step"],
                        "graduated_at": rows[start]["step"] if status == "graduated" else None,
                        "reward_means": [r["reward_mean"] for r in rows],
                        "accuracies": [r.get("accuracy") for r in rows]})
    prompts.sort(key=lambda p: (p["status"] != "graduated", p["graduated_at"] or 0, -p["visits"]))
    counts = {s: sum(p["status"] == s for p in prompts) for s in ("graduated", "stuck", "learning")}
    return {"num_prompts": len(prompts), "num_visits": len(history), **counts, "prompts": prompts}


def summary_headline(summary: dict[str, Any]) -> str:
    """A few console lines: counts, then the first prompts to graduate."""
    n = max(summary["num_prompts"], 1)
    lines = [f"prompts: {summary['num_prompts']} seen ({summary['num_visits'] / n:.1f} visits each); "
             f"graduated {summary['graduated']}, stuck {summary['stuck']}, learning {summary['learning']}"]
    for p in [p for p in summary["prompts"] if p["status"] == "graduated"][:5]:
        lines.append(f"  graduated at step {p['graduated_at']} after {p['visits']} visit(s): "
                     f"{_cell(p['prompt'], 70)!r}")
    return "\n".join(lines)
