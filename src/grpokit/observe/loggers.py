"""Experiment trackers behind one small interface: TensorBoard, Weights & Biases, MLflow, Trackio.

    run.report_to: [tensorboard]          # or [wandb, mlflow], [none] / [] (metrics.jsonl only)

Each tracker is an optional extra (`pip install grpokit[tensorboard]`, `[wandb]`, `[mlflow]`, `[trackio]`);
none is needed for training, and asking for one whose package is missing fails at start-up with a
one-line ConfigError that says what to install. metrics.jsonl is always written, whatever report_to says.

Every tracker gets the same scalars, under the same tags: a metric whose name has no "/" goes under
"train/" (train/reward_mean, train/approx_kl), one with a group keeps it (time/generate, rewards/rule),
and evaluation rows go under "eval/" (eval/accuracy). Completion tables go to each tracker's
text/table form (TensorBoard text, a wandb/trackio Table, an MLflow text artifact).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from grpokit.errors import ConfigError, suggest

# report_to name -> the package it needs
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}


def tag(key: str) -> str:
    """The tracker tag of a metrics.jsonl key: 'train/<key>' unless the key already has a group."""
    return key if "/" in key else f"train/{key}"


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a row (bools and the step counter dropped), under their tags."""
    return {tag(k): float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def resolve_report_to(report_to: Sequence[str] | str | None) -> list[str]:
    """Validate run.report_to: the tracker names to use, in order. 'none' or [] -> [].

    Raises:
        ConfigError: an unknown name, or a tracker whose package is not installed.
    """
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    names = [str(n).strip().lower() for n in names if str(n).strip()]
    if names in ([], ["none"]):
        return []
    if "all" in names:
        return [n for n, pkg in PACKAGES.items() if importlib.util.find_spec(pkg) is not None]
    out = []
    for name in names:
        if name not in PACKAGES:
            raise ConfigError(f"run.report_to: unknown logger '{name}'{suggest(name, PACKAGES)}: use any of "
                              f"{', '.join(PACKAGES)}, all, or none")
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(f"run.report_to includes {name} but the {PACKAGES[name]} package is not "
                              f"installed: pip install 'grpokit[{name}]', or remove {name} from "
                              "run.report_to")
        if name not in out:
            out.append(name)
    return out


def completions_markdown(entries: list[dict[str, Any]]) -> str:
    """Completion entries (tracking.completion_entries) as Markdown tables, one per prompt."""
    parts = []
    for e in entries:
        parts.append(f"**prompt:** `{e['prompt'][:300]}`"
                     + (f" — **answer:** `{e['answer']}`" if e.get("answer") else ""))
        parts.append("\n| # | completion | reward | advantage | length |\n|---|---|---|---|---|")
        for i, c in enumerate(e["completions"]):
            text = c["text"].replace("|", "\\|").replace("\n", " ⏎ ")[:300]
            reward = "-" if c["reward"] is None else f"{c['reward']:.3f}"
            parts.append(f"| {i} | {text} | {reward} | {c['advantage']:+.3f} | {c['length']} |")
        parts.append("")
    return "\n".join(parts)


def completions_table(entries: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Completion entries as (columns, rows) for wandb / trackio tables."""
    cols = ["step", "prompt", "answer", "completion", "reward", "advantage", "length", "truncated"]
    rows = [[e["step"], e["prompt"], e.get("answer"), c["text"], c["reward"], c["advantage"], c["length"],
             c["truncated"]] for e in entries for c in e["completions"]]
    return cols, rows


def run_name(out_dir: Path, config: dict[str, Any]) -> str:
    """The trackers' name for the run: run.run_name (TRL's run_name), else the output folder's name."""
    return str(config.get("run", {}).get("run_name") or out_dir.name)


class TensorBoardLogger:
    """Scalars and text in out_dir/tensorboard (torch's SummaryWriter; needs the tensorboard package)."""

    def __init__(self, out_dir: Path, config: dict[str, Any], start_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: on resume from step k, TensorBoard hides the old events of steps >= k + 1
        # (rewritten now)
        self.writer = SummaryWriter(str(out_dir / "tensorboard"),
                                    purge_step=start_step + 1 if start_step else None, flush_secs=10)
        if not start_step:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def log(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def log_completions(self, entries: list[dict[str, Any]], step: int) -> None:
        self.writer.add_text("completions", completions_markdown(entries), step)

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Weights & Biases (project from WANDB_PROJECT, default 'grpokit'; offline with WANDB_MODE=offline)."""

    def __init__(self, out_dir: Path, config: dict[str, Any], start_step: int = 0) -> None:
        import wandb

        self.wandb = wandb
        id_file = out_dir / "wandb_run_id"  # resume the same wandb run when the training run resumes
        run_id = id_file.read_text().strip() if start_step and id_file.exists() else None
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "grpokit"),
                              name=run_name(out_dir, config), config=config, dir=str(out_dir), id=run_id,
                              resume="allow" if run_id else None)
        if getattr(self.run, "id", None):
            id_file.write_text(str(self.run.id))

    def log(self, values: dict[str, float], step: int) -> None:
        self.wandb.log(values, step=step)

    def log_completions(self, entries: list[dict[str, Any]], step: int) -> None:
        cols, rows = completions_table(entries)
        self.wandb.log({"completions": self.wandb.Table(columns=cols, data=rows)}, step=step)

    def close(self) -> None:
        self.wandb.finish()


class MlflowLogger:
    """MLflow: MLFLOW_TRACKING_URI when set, else a SQLite store out_dir/mlflow.db with artifacts in
    out_dir/mlartifacts (MLflow 3 retired the plain-file store; SQLite needs the full `mlflow` package)."""

    def __init__(self, out_dir: Path, config: dict[str, Any], start_step: int = 0) -> None:
        import mlflow

        self.mlflow = mlflow
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "grpokit")
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri(f"sqlite:///{(out_dir / 'mlflow.db').resolve()}")
            if mlflow.get_experiment_by_name(name) is None:
                mlflow.create_experiment(name, artifact_location=(out_dir / "mlartifacts").resolve().as_uri())
        mlflow.set_experiment(name)
        mlflow.start_run(run_name=run_name(out_dir, config))
        if not start_step:
            flat = {f"{s}.{k}": v for s, sec in config.items() if isinstance(sec, dict)
                    for k, v in sec.items()}
            mlflow.log_params({k: str(v)[:500] for k, v in flat.items()})

    def log(self, values: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({k: v for k, v in values.items() if math.isfinite(v)}, step=step)

    def log_completions(self, entries: list[dict[str, Any]], step: int) -> None:
        self.mlflow.log_text(completions_markdown(entries), f"completions/step_{step:06d}.md")

    def close(self) -> None:
        self.mlflow.end_run()


class TrackioLogger:
    """Trackio (local-first, wandb-like API; project from TRACKIO_PROJECT, default 'grpokit')."""

    def __init__(self, out_dir: Path, config: dict[str, Any], start_step: int = 0) -> None:
        import trackio

        self.trackio = trackio
        trackio.init(project=os.environ.get("TRACKIO_PROJECT", "grpokit"), name=run_name(out_dir, config),
                     config=config, resume="allow" if start_step else "never")

    def log(self, values: dict[str, float], step: int) -> None:
        self.trackio.log(values, step=step)

    def log_completions(self, entries: list[dict[str, Any]], step: int) -> None:
        table_cls = getattr(self.trackio, "Table", None)
        if table_cls is not None:  # older trackio releases have no tables
            cols, rows = completions_table(entries)
            self.trackio.log({"completions": table_cls(columns=cols, data=rows)}, step=step)

    def close(self) -> None:
        self.trackio.finish()


LOGGERS = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger, "mlflow": MlflowLogger,
           "trackio": TrackioLogger}


class Loggers:
    """The trackers named in run.report_to, called together; with none it does nothing."""

    def __init__(self, loggers: Sequence[Any] = ()) -> None:
        self.loggers = list(loggers)

    def __len__(self) -> int:
        return len(self.loggers)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """One training row (a metrics.jsonl row): every numeric value, under its tag."""
        if self.loggers:
            values = scalars(metrics)
            for lg in self.loggers:
                lg.log(values, step)

    def log_eval(self, row: dict[str, Any]) -> None:
        """One eval.jsonl row: its numeric values under eval/<key>, at its step."""
        values = {f"eval/{k}": float(v) for k, v in row.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        for lg in self.loggers:
            lg.log(values, int(row.get("step", 0)))

    def log_completions(self, entries: list[dict[str, Any]], step: int) -> None:
        for lg in self.loggers:
            lg.log_completions(entries, step)

    def close(self) -> None:
        """Flush and close every tracker (safe to call twice)."""
        loggers, self.loggers = self.loggers, []
        for lg in loggers:
            lg.close()


def build_loggers(report_to: Sequence[str] | str | None, out_dir: str | Path, config: dict[str, Any],
                  start_step: int = 0) -> Loggers:
    """Start the trackers named in report_to for a run in out_dir (validated by resolve_report_to).

    Args:
        report_to: run.report_to.
        out_dir: the run folder (TensorBoard events go to out_dir/tensorboard).
        config: the run's config as a dict (recorded by each tracker).
        start_step: the step training resumes from (0 for a fresh run).
    """
    out = Path(out_dir)
    names = resolve_report_to(report_to)
    if names:
        out.mkdir(parents=True, exist_ok=True)
    return Loggers([LOGGERS[name](out, config, start_step) for name in names])
