"""What training is doing, in numbers: phase timers, per-step GRPO statistics, metrics.jsonl.

The statistics are pure functions of a step's tensors, so their definitions are testable on
hand-built batches; the trainer calls them once per step (one host sync, not one per micro-batch).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch


class PhaseTimer:
    """Named wall-clock timers, in the spirit of verl's `gen` / `reward` / `old_logprob` / `update`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - start

    def pop(self) -> dict[str, float]:
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


def tensor_stats(name: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float().flatten()
    return {f"{name}_mean": float(x.mean()), f"{name}_std": float(x.std()) if x.numel() > 1 else 0.0,
            f"{name}_min": float(x.min()), f"{name}_max": float(x.max())}


def length_stats(completion_mask: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    lengths = completion_mask.sum(-1).float()                             # [N]
    return {"completion_length_mean": float(lengths.mean()), "completion_length_min": float(lengths.min()),
            "completion_length_max": float(lengths.max()), "frac_truncated": float(truncated.float().mean())}


class MetricsWriter:
    """Appends one JSON object per step to metrics.jsonl (flushed and fsynced, so a kill loses nothing)."""

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
        self._file.write(json.dumps(row, default=float) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl (a run folder or the file itself)."""
    p = Path(path)
    p = p / "metrics.jsonl" if p.is_dir() else p
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
