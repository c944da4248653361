"""Generation reuse (rollout.steps_per_generation = k): one generation batch, k optimizer steps on its slices.

TRL 1.16's `steps_per_generation` / `generation_batch_size` in grpokit's terms (B = rollout.prompts_per_step,
G = rollout.num_generations, mu = loss.num_iterations):

    generation batch   k * B prompts x G completions, sampled at the first of k steps (TRL:
                       generation_batch_size = per_device_train_batch_size x ranks x steps_per_generation,
                       k = steps_per_generation / gradient_accumulation_steps)
    once, on all of it rewards, group advantages (scale_rewards=batch: over the whole generation batch), the
                       reference's log-probs, and pi_old: the sampling policy's log-probs (computed whenever
                       k > 1 or mu > 1; k = mu = 1 needs none, the ratio is exp(lp - sg(lp)) = 1)
    step j of k        trains slice j (`take_slice`): groups [j B, (j+1) B), whole groups in sampling order,
                       one slice per step, none twice; the ratio pi_theta / pi_old is against the sampling
                       policy, so slice j > 0 trains j optimizer steps off-policy and the clip bounds it
    with mu > 1        each step makes mu updates of its slice, so a generation feeds k x mu optimizer
                       updates, TRL's count, every one against the same sampling-time pi_old, as in TRL. The
                       order differs: TRL cycles the k slices mu times (0..k-1, 0..k-1, ...), grpokit runs a
                       slice's mu updates back to back, so that a step stays one slice and one metrics.jsonl
                       row (its updates after the first under /iter<i>, as with k = 1)

k = 1 is the plain GRPO step, unchanged: the batch is its own only slice. Each step writes its row; with k > 1
the row carries `generation/slice` (j), and the sampling phase's figures (time/generate, time/reward and the
other phases of steps 1-4, the reward functions' batch figures such as code/..., reward_errors) are on the
slice-0 row only.

A checkpoint written between two slices holds the generation (generation.pt): regenerating it is not
possible, since the weights that sampled it have moved j steps since; the tensors are small (k B G rows of T).
The resumed run trains slices j+1..k-1 of the same batch, then samples the next from the restored RNG: the
uninterrupted run's numbers.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpokit.errors import ConfigError
from grpokit.rewards.scoring import RewardBatch
from grpokit.rollout.contract import from_plain, plain_fields
from grpokit.rollout.groups import Rollout
from grpokit.rollout.trajectory import ToolCall, Trajectory, Turn

GENERATION_FILE = "generation.pt"
_TEXT_FIELDS = ("prompts", "completions")      # text or chat messages: saved as JSON


@dataclass
class Batch:
    """What one step's update reads: a whole generation batch, or one slice of it (N rows, whole groups)."""

    rollout: Rollout
    scores: RewardBatch
    correct: torch.Tensor | None    # [N] 1 right / 0 wrong / NaN unknown; None: no answer check
    info: dict[str, float]          # the sampling phase's figures (dynamic/..., async/...)
    advantages: torch.Tensor        # [N] outcome, or [N, T] with process / tree advantages
    loss_mask: torch.Tensor         # [N, T] float: the tokens the loss trains
    old_lp: torch.Tensor | None     # [N, T] pi_old, the sampling policy's (None: k = mu = 1)
    ref_lp: torch.Tensor | None     # [N, T] pi_ref (None: beta = 0)


@dataclass
class Generation:
    """A generation batch of k slices and the step its first slice trains at."""

    batch: Batch
    first_step: int     # state.step before slice 0's update
    slices: int         # k

    def slice_index(self, step: int) -> int:
        """j: the slice the step after `step` trains (state.step before its update)."""
        return step - self.first_step


def take_slice(gen: Generation, j: int) -> Batch:
    """Slice j of the generation's k: its rows [j n, (j+1) n) with n = N / k = B * G, i.e. groups
    [j B, (j+1) B), whole groups (group ids renumbered 0..B-1); k = 1: the batch itself.

    Rewards, correctness and advantages are the generation's own (computed on whole groups of the whole
    batch); the sampling phase's figures (info, reward_errors, the reward functions' batch metrics) go
    with slice 0 only, so each is logged once."""
    b, k = gen.batch, gen.slices
    if k == 1:
        return b
    if not 0 <= j < k:
        raise IndexError(f"slice {j} of a generation of {k}")
    N = b.rollout.completion_ids.shape[0]
    n = N // k
    rows = list(range(j * n, (j + 1) * n))
    idx = torch.tensor(rows, dtype=torch.long)
    r = b.rollout.select(idx)
    r = dataclasses.replace(r, group_ids=r.group_ids - r.group_ids.min())     # 0..B-1, as a step's own
    s = b.scores
    first = j == 0
    scores = RewardBatch(s.total[idx.to(s.total.device)],
                         {name: v[idx.to(v.device)] for name, v in s.per_func.items()},
                         s.num_errors if first else 0,
                         None if s.step_rewards is None else [s.step_rewards[i] for i in rows],
                         dict(s.metrics) if first else {})

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[idx.to(t.device)]

    return Batch(r, scores, pick(b.correct), dict(b.info) if first else {}, pick(b.advantages),
                 pick(b.loss_mask), pick(b.old_lp), pick(b.ref_lp))


def check_ranks(cfg: Any, world_size: int) -> None:
    """Several ranks: a checkpoint holds rank 0's state only (DDP replicas are equal), so it may not fall
    between two slices of a generation, whose rows differ per rank."""
    k, run = cfg.rollout.steps_per_generation, cfg.run
    if k > 1 and world_size > 1 and (run.save_steps % k or run.save_on_interrupt):
        raise ConfigError(f"rollout.steps_per_generation={k} on {world_size} ranks: a checkpoint between two "
                          "steps of one generation would keep rank 0's slices only: set run.save_steps to a "
                          f"multiple of {k} and run.save_on_interrupt=false")


# ---- checkpoint ---------------------------------------------------------------------------------------
def _cpu(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().cpu()


def save_generation(gen: Generation, folder: Path) -> None:
    """generation.pt in a checkpoint folder: every tensor (CPU), the texts and trajectories as JSON,
    loadable with weights_only=True."""
    b, r = gen.batch, gen.batch.rollout
    rollout = {k: v for k, v in plain_fields(r).items() if k not in _TEXT_FIELDS}
    rollout = {k: _cpu(v) if isinstance(v, torch.Tensor) else v for k, v in rollout.items()}
    texts = {name: json.dumps(getattr(r, name), default=str) for name in _TEXT_FIELDS}
    trajectories = None if r.trajectories is None else json.dumps(
        [dataclasses.asdict(t) for t in r.trajectories], default=str)
    s = b.scores
    steps = None if s.step_rewards is None else [[list(p) for p in row] for row in s.step_rewards]
    scores = {"total": _cpu(s.total), "per_func": {k: _cpu(v) for k, v in s.per_func.items()},
              "num_errors": int(s.num_errors), "metrics": dict(s.metrics), "step_rewards": steps}
    torch.save({"first_step": gen.first_step, "slices": gen.slices, "rollout": rollout, "texts": texts,
                "trajectories": trajectories, "scores": scores, "correct": _cpu(b.correct),
                "info": dict(b.info), "advantages": _cpu(b.advantages), "loss_mask": _cpu(b.loss_mask),
                "old_lp": _cpu(b.old_lp), "ref_lp": _cpu(b.ref_lp)}, folder / GENERATION_FILE)


def _trajectory(d: dict[str, Any]) -> Trajectory:
    turns = [Turn(**{**t, "calls": [ToolCall(**c) for c in t["calls"]]}) for t in d["turns"]]
    return Trajectory(**{**d, "turns": turns})


def load_generation(folder: Path, device: torch.device | str | None) -> Generation | None:
    """The generation a checkpoint holds (its tensors on `device`), or None when it holds none."""
    path = folder / GENERATION_FILE
    if not path.is_file():
        return None
    blob = torch.load(path, weights_only=True, map_location="cpu")
    texts = {name: json.loads(text) for name, text in blob["texts"].items()}
    trajectories = None if blob["trajectories"] is None else [_trajectory(d)
                                                              for d in json.loads(blob["trajectories"])]
    rollout = from_plain(blob["rollout"], **texts, trajectories=trajectories).to(device)
    s = blob["scores"]
    steps = None if s["step_rewards"] is None else [[tuple(p) for p in row] for row in s["step_rewards"]]
    scores = RewardBatch(s["total"], s["per_func"], s["num_errors"], steps, s["metrics"])

    def on(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or device is None else t.to(device)

    batch = Batch(rollout, scores, blob["correct"], blob["info"], on(blob["advantages"]),
                  on(blob["loss_mask"]), on(blob["old_lp"]), on(blob["ref_lp"]))
    return Generation(batch, blob["first_step"], blob["slices"])
