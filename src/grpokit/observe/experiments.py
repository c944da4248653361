"""What a finished sweep shows beyond its results table: curves over training with the seeds as a band,
the pass-rate histograms and gradient share of the per-prompt history, and a group size's advantage noise.

    rows = sweep_rows("runs/sweeps/k")                          # results.json: a row per finished cell
    bands = seed_bands(rows, "runs/sweeps/k", "eval/accuracy", x="completions")
    hist = pass_rate_histogram(history, steps=(1, 10), group_size=8)    # history: prompt_history.jsonl rows
    share = gradient_share(history, steps=(1, 400), group_size=8)
    weight = group_weight(history, steps=(1, 400), group_size=8)     # one group's signal vs a 4/8 group's
    noise = advantage_noise(pool, group_sizes=(2, 4, 8), generator=torch.Generator().manual_seed(0))

Definitions (G = group size; a group's pass rate k/G, k its correct completions):

    pass-rate histogram   the share of the groups sampled in a step window with k = 0..G correct: the
                          chapter's "Episode 10 / 100 / 300" picture; k = 0 is stuck, k = G graduated
    gradient share        per k, the share of sum_i |A_i| * |o_i| (adv_abs_tokens of prompt_history.jsonl)
                          over the window: where the advantage-weighted tokens, so the gradient signal, go.
                          k = 0 and k = G hold 0 by construction (equal rewards: A = 0)
    advantage noise       from a pool of M completions per prompt: fix one completion j (the anchor), draw
                          its G - 1 group mates without replacement R times, compute j's group advantage
                          each time (`group_advantages`); the std over the R draws, averaged over anchors
                          and over the prompts whose pool is mixed. adv_rmse is the root mean square gap
                          to the pool's own advantage (r_j - mean) / std, the large-G limit

x for a curve: "step"; "completions" (step x B x G, the sampled completions; with dynamic sampling the
extra resampled rounds are not counted: see completion_tokens); "seconds" (training seconds, the sum of
time/step up to that step: evaluations and the model load excluded).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpokit.core.advantages import group_advantages
from grpokit.errors import UserError
from grpokit.observe.metrics import read_metrics
from grpokit.train.evaluate import decode_and_score

RESULT_KEYS = ("seed", "folder", "wall_s", "resumed", "steps")  # results-row keys that are not labels
X_KINDS = ("step", "completions", "seconds")


def sweep_rows(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The results rows of a sweep folder (results.json, written by `grpokit sweep`)."""
    path = Path(sweep_dir) / "results.json"
    if not path.is_file():
        raise UserError(f"{path} not found: run the sweep first (grpokit sweep SWEEP.yaml, or drop --report)")
    return json.loads(path.read_text(encoding="utf-8"))


def label_of(row: dict[str, Any]) -> str:
    """A row's cell name without the seed: 'num_generations=8', 'variant=dynamic', or 'all cells'."""
    keys = [k for k in row if k not in RESULT_KEYS and "/" not in k]
    return ", ".join(f"{k.split('.')[-1]}={row[k]}" for k in keys) or "all cells"


def by_label(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by their cell name (first-seen order): one list of seeds per cell."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(label_of(row), []).append(row)
    return out


def _x_of(folder: Path, kind: str) -> dict[int, float]:
    """step -> x for one cell folder (x in X_KINDS); step 0 maps to 0."""
    if kind not in X_KINDS:
        raise ValueError(f"x must be one of {X_KINDS}, got {kind!r}")
    steps = read_metrics(folder)
    if kind == "step":
        return {0: 0.0, **{int(r["step"]): float(r["step"]) for r in steps}}
    if kind == "completions":
        rollout = json.loads((folder / "config.json").read_text(encoding="utf-8"))["rollout"]
        per_step = rollout["prompts_per_step"] * rollout["num_generations"]
        return {0: 0.0, **{int(r["step"]): float(r["step"] * per_step) for r in steps}}
    out, total = {0: 0.0}, 0.0
    for r in sorted(steps, key=lambda r: r["step"]):
        total += float(r.get("time/step", 0.0))
        out[int(r["step"])] = total
    return out


def cell_series(folder: str | Path, metric: str, *, x: str = "step", window: int = 1) -> tuple[list, list]:
    """(xs, ys) of one cell: `eval/<key>` from eval.jsonl, any other key from metrics.jsonl, the latter
    as a trailing mean over `window` logged steps (NaN values skipped)."""
    folder = Path(folder)
    xmap = _x_of(folder, x)
    if metric.startswith("eval/"):
        rows, key = read_metrics(folder, "eval.jsonl"), metric[len("eval/"):]
    else:
        rows, key = read_metrics(folder), metric
    pts = [(int(r["step"]), float(r[key])) for r in sorted(rows, key=lambda r: r["step"])
           if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))
           and int(r["step"]) in xmap]
    xs, ys = [xmap[s] for s, _ in pts], [v for _, v in pts]
    if window > 1:
        ys = [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1])
              for i in range(len(ys))]
    return xs, ys


@dataclass
class Band:
    """One cell name's curve over its seeds: the mean and min-max at the x values all seeds share,
    and each seed's own (xs, ys) (x = seconds differs between seeds)."""
    label: str
    xs: list[float]
    mean: list[float]
    lo: list[float]
    hi: list[float]
    seeds: list[tuple[list[float], list[float]]]


def seed_bands(rows: Sequence[dict[str, Any]], sweep_dir: str | Path, metric: str, *, x: str = "step",
               window: int = 1) -> list[Band]:
    """A Band per cell name of `rows` for `metric` (see `cell_series`); the mean and min-max are over
    the seeds at the x positions (by step index) every seed logged."""
    bands = []
    for label, members in by_label(rows).items():
        series = [cell_series(Path(sweep_dir) / r["folder"], metric, x=x, window=window) for r in members]
        series = [s for s in series if s[0]]
        if not series:
            continue
        n = min(len(s[0]) for s in series)
        cols = [[s[1][i] for s in series] for i in range(n)]
        xs = [sum(s[0][i] for s in series) / len(series) for i in range(n)]
        bands.append(Band(label, xs, [sum(c) / len(c) for c in cols], [min(c) for c in cols],
                          [max(c) for c in cols], series))
    return bands


def _window(history: Sequence[dict[str, Any]], steps: tuple[int, int]) -> list[dict[str, Any]]:
    lo, hi = steps
    return [r for r in history if lo <= int(r["step"]) <= hi and r.get("accuracy") is not None]


def pass_rate_histogram(history: Sequence[dict[str, Any]], *, steps: tuple[int, int],
                        group_size: int) -> list[float]:
    """[G + 1] share of the groups sampled in steps lo..hi (inclusive) with k = 0..G correct answers."""
    rows = _window(history, steps)
    counts = [0] * (group_size + 1)
    for r in rows:
        counts[round(float(r["accuracy"]) * group_size)] += 1
    return [c / len(rows) if rows else float("nan") for c in counts]


def gradient_share(history: Sequence[dict[str, Any]], *, steps: tuple[int, int], group_size: int,
                   key: str = "adv_abs_tokens") -> list[float]:
    """[G + 1] share of sum |A_i| * |o_i| (or `key`: adv_abs for sum |A_i|) over the groups of steps lo..hi
    that went to groups with k = 0..G correct answers; NaN when the window holds no signal."""
    rows = [r for r in _window(history, steps) if key in r]
    mass = [0.0] * (group_size + 1)
    for r in rows:
        mass[round(float(r["accuracy"]) * group_size)] += float(r[key])
    total = sum(mass)
    return [m / total if total > 0 else float("nan") for m in mass]


def group_weight(history: Sequence[dict[str, Any]], *, steps: tuple[int, int], group_size: int,
                 key: str = "adv_abs_tokens") -> list[float]:
    """[G + 1] the mean of sum |A_i| * |o_i| (or `key`) over the groups of steps lo..hi with k = 0..G right,
    divided by that of the groups with k = G // 2: how much one group of each pass rate weighs against a
    half-right one (std scaling amplifies the low-variance k = 1 and k = G - 1). NaN for an empty bucket."""
    rows = [r for r in _window(history, steps) if key in r]
    mass, count = [0.0] * (group_size + 1), [0] * (group_size + 1)
    for r in rows:
        k = round(float(r["accuracy"]) * group_size)
        mass[k] += float(r[key])
        count[k] += 1
    mean = [m / c if c else float("nan") for m, c in zip(mass, count)]
    mid = mean[group_size // 2]
    return [m / mid if mid and not math.isnan(mid) else float("nan") for m in mean]


def advantage_noise(pool: torch.Tensor, *, group_sizes: Sequence[int], anchors: int = 8, resamples: int = 32,
                    scale_rewards: str = "group",
                    generator: torch.Generator | None = None) -> dict[int, dict]:
    """The spread of one completion's group advantage over resampled group mates, per group size.

    Args:
        pool: [P, M] rewards of M sampled completions for each of P prompts (M > max(group_sizes)).
        group_sizes: the G values measured.
        anchors: completions per prompt whose advantage is followed (the first `anchors` of the pool).
        resamples: R, group-mate draws per anchor.
        scale_rewards: "group" ((r - mean) / std, the paper) or "none" (r - mean, Dr. GRPO).
        generator: the draws' random generator.

    Returns:
        G -> {"adv_noise": mean std over draws, "adv_rmse": rms gap to the pool advantage,
        "frac_zero_std": share of drawn groups with equal rewards, "mixed_prompts": prompts counted}.
    """
    P, M = pool.shape
    if scale_rewards not in ("group", "none"):
        raise ValueError(f"scale_rewards must be 'group' or 'none' here, got {scale_rewards!r}")
    if max(group_sizes) >= M or min(group_sizes) < 2:
        raise ValueError(f"group sizes must be in [2, M), M = {M} pooled completions; "
                         f"got {list(group_sizes)}")
    pool = pool.float()
    mixed = pool.std(-1) > 0                                                # [P]
    A = min(anchors, M)
    mu, sd = pool.mean(-1, keepdim=True), pool.std(-1, keepdim=True)
    ideal = (pool[:, :A] - mu) / (sd if scale_rewards != "none"
                                  else torch.ones_like(sd)).clamp(min=1e-8)        # [P, A]
    out = {}
    for G in group_sizes:
        keys = torch.rand(P, A, resamples, M, generator=generator)          # [P, A, R, M]
        idx = torch.arange(A)
        keys[:, idx, :, idx] = 2.0                                          # the anchor is never its own mate
        mates = keys.argsort(-1)[..., :G - 1]                               # [P, A, R, G-1]
        anchor = torch.arange(A).view(1, A, 1, 1).expand(P, A, resamples, 1)
        members = torch.cat([anchor, mates], -1)                            # [P, A, R, G], anchor first
        rewards = torch.gather(pool[:, None, None, :].expand(P, A, resamples, M), -1, members)
        adv = group_advantages(rewards.reshape(-1), G,
                               scale_rewards=scale_rewards).view(P, A, resamples, G)[..., 0]
        noise = adv.std(-1)                                                 # [P, A]
        rmse = ((adv - ideal[..., None]) ** 2).mean(-1).sqrt()              # [P, A]
        zero = (rewards.std(-1) == 0).float().mean((1, 2))                  # [P]
        n = int(mixed.sum())
        out[G] = {"adv_noise": float(noise[mixed].mean()) if n else 0.0,
                  "adv_rmse": float(rmse[mixed].mean()) if n else 0.0,
                  "frac_zero_std": float(zero.mean()), "mixed_prompts": n}
    return out


def sample_pool(model, tokenizer, examples: Sequence, cfg, *, size: int) -> dict[str, torch.Tensor]:
    """`size` sampled completions per example with the run's sampling settings and rewards:
    {"reward": [P, size], "correct": [P, size]} (the pool `advantage_noise` draws groups from)."""
    scored = decode_and_score(model, tokenizer, examples, cfg, size, greedy=False, progress=False,
                              desc="pool")
    return {"reward": scored["reward"].view(len(examples), size),
            "correct": scored["correct"].view(len(examples), size)}
