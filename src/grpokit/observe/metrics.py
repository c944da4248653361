"""What training is doing, in numbers: phase timers, per-step GRPO statistics, metrics.jsonl.

The statistics are pure functions of a step's tensors, so their definitions are testable on
hand-built batches; the trainer calls them once per step (one host sync, not one per micro-batch).
Every key of a metrics.jsonl row, its definition and how to read it: docs/observability.md.
Trackers (TensorBoard, wandb, ...) are in loggers.py, the completions log and prompt history in
tracking.py, figures in plots.py and the HTML page in report.py.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

# The top-level phases of one step, in the order they run: together they cover the "step" timer up to
# the untimed glue between them (see `finish_step_row`). Nested timers ("optimizer", inside "update")
# are reported too but are not phases of their own.
# accelerate: the speed-up switch swapping kernels in and out (grpokit.switch)
PHASES = ("accelerate", "generate", "reward", "ref_forward", "old_forward", "value_forward", "advantage",
          "update", "save", "log")


class PhaseTimer:
    """Named wall-clock timers, in the spirit of verl's `gen` / `reward` / `old_logprob` / `update`.

    `with timer("generate"): ...` adds the block's wall time to `time/generate`; the same name may be
    entered several times per step (e.g. generation rounds of dynamic sampling). cuda=True (a run on a
    GPU): the device is synchronized at both ends so asynchronous kernels are charged to the phase that
    launched them; a CPU run never synchronizes, even on a host with a GPU.
    """

    def __init__(self, cuda: bool = False) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._open: dict[str, float] = {}
        self.cuda = cuda

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = self._now()
        self._open[name] = start
        try:
            yield
        finally:
            self._open.pop(name, None)
            self.seconds[name] += self._now() - start

    def elapsed(self) -> dict[str, float]:
        """`time/<name>` so far, including the part of still-open timers (without closing them)."""
        now = self._now()
        out = {f"time/{k}": v for k, v in self.seconds.items()}
        for k, start in self._open.items():
            out[f"time/{k}"] = out.get(f"time/{k}", 0.0) + now - start
        return out

    def pop(self) -> dict[str, float]:
        """`time/<name>` of the closed timers, and reset them (call once per step)."""
        out = {f"time/{k}": v for k, v in self.seconds.items()}
        self.seconds = defaultdict(float)
        return out


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def reward_stats(rewards: torch.Tensor, correct: torch.Tensor | None, group_size: int) -> dict[str, float]:
    """Reward and group statistics.

    Args:
        rewards: [N] total rewards (NaN = excluded).
        correct: [N] 1.0 where the answer is right (NaN or None when unknown).
        group_size: G.

    Returns: reward_mean/std, reward_group_std_mean (mean within-group std), frac_zero_std (groups
    with all rewards equal: no gradient), frac_graduated (those where every answer is right),
    frac_stuck (those where every answer is wrong), accuracy.
    """
    r = rewards.float().view(-1, group_size)                              # [B, G]
    valid = ~torch.isnan(r)
    r0 = torch.where(valid, r, torch.zeros_like(r))
    n = valid.sum(-1).clamp(min=1)
    mean = r0.sum(-1) / n
    var = torch.where(valid, (r - mean[:, None]) ** 2, torch.zeros_like(r)).sum(-1) / (n - 1).clamp(min=1)
    std = var.sqrt()                                                      # [B]
    zero = std < 1e-8
    flat = rewards[~torch.isnan(rewards)]
    out = {
        "reward_mean": float(flat.mean()) if flat.numel() else float("nan"),
        "reward_std": float(flat.std()) if flat.numel() > 1 else 0.0,
        "reward_group_std_mean": float(std.mean()),
        "frac_zero_std": float(zero.float().mean()),
    }
    if correct is not None:
        c = correct.float().view(-1, group_size)
        out["accuracy"] = float(torch.nanmean(c))
        out["frac_graduated"] = float((zero & (c == 1).all(-1)).float().mean())
        out["frac_stuck"] = float((zero & (c == 0).all(-1)).float().mean())
    return out


def nan_std(x: torch.Tensor) -> float:
    """Bessel std over the non-NaN values (NaN with fewer than two)."""
    x = x.float().flatten()
    x = x[~torch.isnan(x)]
    return float(x.std()) if x.numel() > 1 else float("nan")


def tensor_stats(name: str, x: torch.Tensor) -> dict[str, float]:
    """`<name>_mean/_std/_min/_max` of a tensor (std with Bessel's correction; 0 for one element)."""
    x = x.float().flatten()
    return {f"{name}_mean": float(x.mean()), f"{name}_std": float(x.std()) if x.numel() > 1 else 0.0,
            f"{name}_min": float(x.min()), f"{name}_max": float(x.max())}


def length_stats(completion_mask: torch.Tensor, truncated: torch.Tensor,
                 correct: torch.Tensor | None = None) -> dict[str, float]:
    """Completion lengths |o_i| = sum_t mask[i, t] (EOS included): mean/min/max, and frac_truncated,
    the share of completions that hit max_completion_length without an EOS. With `correct` ([N], 1 right,
    0 wrong, NaN unknown) also completion_length_correct / _wrong, the mean over each (NaN when none):
    the length drift of wrong answers that Dr. GRPO attributes to the per-completion mean."""
    lengths = completion_mask.sum(-1).float()                             # [N]
    out = {"completion_length_mean": float(lengths.mean()), "completion_length_min": float(lengths.min()),
           "completion_length_max": float(lengths.max()), "frac_truncated": float(truncated.float().mean())}
    ended = lengths[~truncated.to(lengths.device).bool()]                 # completions that emitted EOS
    ended = ended if ended.numel() else torch.zeros(1)                    # none: 0, as TRL logs it
    out.update(completion_length_terminated_mean=float(ended.mean()),
               completion_length_terminated_min=float(ended.min()),
               completion_length_terminated_max=float(ended.max()))
    if correct is not None:
        c = correct.float().to(lengths.device)
        for name, pick in (("correct", c == 1), ("wrong", c == 0)):
            out[f"completion_length_{name}"] = float(lengths[pick].mean()) if pick.any() else float("nan")
    return out


def memory_stats() -> dict[str, float]:
    """Peak memory so far: host RSS (MiB), and CUDA allocated / reserved (MiB) when a GPU is in use."""
    out = {"peak_rss_mib": peak_rss_mib()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
        out["peak_cuda_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    return out


def finish_step_row(metrics: dict[str, Any], timer: PhaseTimer) -> dict[str, Any]:
    """Add the step's timings, throughput and memory to its metrics (in place) and return them.

    Called inside the "step" and "log" timers, just before the row is written: time/step and
    time/log are their values so far, so sum_p time/<p> over PHASES equals time/step up to the
    untimed glue between phases. Adds:
        tokens_per_s          = completion_tokens / time/step     (end-to-end training throughput)
        generate_tokens_per_s = completion_tokens / time/generate (sampling throughput)
    """
    metrics.update(timer.elapsed())
    tokens = float(metrics.get("completion_tokens", 0.0))
    metrics["tokens_per_s"] = tokens / max(metrics.get("time/step", 0.0), 1e-9)
    if metrics.get("time/generate"):
        metrics["generate_tokens_per_s"] = tokens / metrics["time/generate"]
    metrics.update(memory_stats())
    return metrics


# (key, short name, format) for the console: the signals that explain a GRPO step at a glance.
_CONSOLE = (("reward_mean", "reward", ".3g"), ("accuracy", "acc", ".2f"),
            ("frac_zero_std", "zero_std", ".2f"), ("frac_graduated", "grad", ".2f"),
            ("frac_stuck", "stuck", ".2f"), ("approx_kl", "kl", ".3g"),
            ("clip_ratio", "clip", ".3f"), ("entropy", "ent", ".3g"), ("loss", "loss", ".3g"),
            ("completion_length_mean", "len", ".1f"), ("grad_norm", "gnorm", ".3g"),
            ("time/step", "s/step", ".2f"), ("tokens_per_s", "tok/s", ".0f"))


def format_console(metrics: dict[str, Any], short: bool = False) -> str:
    """One console line; `short` keeps the first five fields (for a progress-bar postfix)."""
    fields = _CONSOLE[:5] if short else _CONSOLE
    return " ".join(f"{name}={metrics[k]:{fmt}}" for k, name, fmt in fields
                    if isinstance(metrics.get(k), (int, float)))


class MetricsWriter:
    """Appends one JSON object per row to a JSONL file (flushed and fsynced, so a kill loses nothing).

    Rows carry a "step"; on resume from step k, rows written after step k are dropped first.
    """

    def __init__(self, path: str | Path, start_step: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._truncate_after(start_step)
        self._file = open(self.path, "a", encoding="utf-8")

    def _truncate_after(self, step: int) -> None:
        """Drop lines for steps > step (written after the checkpoint we resume from)."""
        keep = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if row.get("step", 0) <= step:
                keep.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(k + "\n" for k in keep), encoding="utf-8")
        os.replace(tmp, self.path)

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (flushed and fsynced)."""
        self.write_many([row])

    def write_many(self, rows: list[dict[str, Any]]) -> None:
        """Append several rows with a single fsync."""
        if not rows:
            return
        self._file.write("".join(json.dumps(row, default=float) + "\n" for row in rows))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """All rows of a JSONL file (a run folder and the file `name` in it, or the file itself).

    A last line cut by a kill is skipped; NaN / Infinity (written by json for non-finite floats) load back.
    """
    p = Path(path)
    p = p / name if p.is_dir() else p
    rows = []
    for line in p.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows
