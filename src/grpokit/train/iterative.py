"""Iterative GRPO with reward-model continual training (DeepSeekMath Algorithm 1, section 4.1.4).

    for iteration = 1 .. I:                                   run.iterations
        reference model <- policy                             (the reset)
        for step = 1 .. M:                                    run.steps_per_iteration
            sample G completions per prompt, score them with the learned RM, GRPO update
        continue training the RM on this iteration's samples, labeled by the verifier,
        mixed with a replay of historical samples (rm.replay_share of the mix, default 10%)

The RM is the one `rm:PATH` entry of reward.funcs; it is trained in place, so the next iteration's
rewards come from the updated model. The verifier (the task's answer checker, or the arithmetic
step checker for a process RM) labels samples for the RM only: it never scores the policy.

Before each RM update the loop measures the RM on the iteration's fresh samples, which it has not
been trained on (AUC, accuracy): how well the reward still ranks what the policy now writes, the
reward-hacking signal. One row per iteration goes to iterations.jsonl. With
``rm.continual_training=false`` the RM stays frozen (the comparison) and the rest is the same.

State kept across a kill (grpokit.train.checkpoint saves it with every checkpoint): the RM's weights,
its optimizer, the shuffling generator, the iteration counter, this iteration's samples and the
replay pool. On W ranks each rank holds its own samples of the iteration until the boundary's gather: a
checkpoint inside an iteration keeps every rank's share (gathered to rank 0 before it writes,
`share_for_checkpoint`), and each rank resumes its own.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from grpokit.rewards.rm_data import RMSample, label_samples
from grpokit.rewards.rm_train import evaluate_reward_model, make_rm_optimizer, train_reward_model
from grpokit.train.checkpoint import CheckpointError

log = logging.getLogger("grpokit")

RM_WEIGHTS = "reward_model.safetensors"
RM_STATE = "reward_loop.pt"
ITERATIONS_FILE = "iterations.jsonl"


def replay_count(new: int, history: int, share: float) -> int:
    """Historical samples to add to `new` fresh ones so they make `share` of the mix (at most `history`).

        replay / (new + replay) = share   =>   replay = share / (1 - share) * new
    """
    return min(history, round(share / (1.0 - share) * new)) if share > 0 else 0


def training_mix(current: list, history: list, share: float, generator: torch.Generator) -> tuple[list, int]:
    """This iteration's samples plus a uniform draw (without replacement) from the replay pool."""
    k = replay_count(len(current), len(history), share)
    picks = torch.randperm(len(history), generator=generator)[:k].tolist() if k else []
    return current + [history[i] for i in sorted(picks)], k


def _learned_rm(reward_funcs: list) -> tuple[str, Any]:
    for name, fn, _ in reward_funcs:
        if str(name).startswith("rm:"):
            return name, fn
    raise ValueError("run.iterations needs an 'rm:PATH' reward in reward.funcs")


class RewardLoop:
    """Algorithm 1's outer loop around `train_step`: samples in, RM updates and reference resets out."""

    def __init__(self, cfg, reward_funcs: list, rank: int = 0, world_size: int = 1) -> None:
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.name, self.rm = _learned_rm(reward_funcs)
        self.rm.model.requires_grad_(True)
        self.optimizer = make_rm_optimizer(self.rm.model, cfg.rm.learning_rate)
        self.generator = torch.Generator().manual_seed(cfg.run.seed + 7919)  # the RM's own stream
        self.iteration = 0
        self.current: list = []   # RMSample of this iteration, verifier-labeled (this rank's own)
        self.shares: list | None = None   # every rank's `current`, gathered for rank 0's checkpoint
        self.history: list = []   # every earlier iteration's samples: the replay pool

    @property
    def kind(self) -> str:
        return getattr(self.rm, "kind", "outcome")

    def record(self, rollout, columns: dict[str, list]) -> None:
        """Keep one sampling batch of the policy, labeled by the verifier (for the RM only)."""
        answers = columns.get("answer") or [None] * len(rollout.prompts)
        groups = [str(p) for p in rollout.prompts]  # one group per prompt: held-out splits and pairs
        sep = getattr(self.rm, "step_separator", self.cfg.rm.step_separator)
        self.current += label_samples(rollout.prompts, rollout.completions, answers, groups, kind=self.kind,
                                      step_labels="verifier", step_separator=sep)

    def at_boundary(self, step: int) -> bool:
        return step > 0 and step % self.cfg.run.steps_per_iteration == 0

    def end_iteration(self, state, out_dir: Path | None = None) -> dict[str, float]:
        """Measure the RM on the iteration's samples, train it on them plus replay, reset the reference;
        the row is appended to out_dir/iterations.jsonl (None: not written, as on ranks > 0).

        Several ranks: one reward model. Every rank's samples are gathered (rank order) so all ranks hold
        the same sample lists; rank 0 measures and trains the RM, then its weights go to every rank."""
        dist = state.dist
        self.current = [s for part in dist.gather_object(self.current) for s in part]
        row = dist.on_main(lambda: self._update_rm(state))
        dist.broadcast_module(self.rm.model)
        self.history += self.current
        self.current = []
        self.iteration += 1
        if state.ref_model is not None:  # the next iteration's reference is the policy as it is now
            state.dist.sync_reference(state.ref_model, state.model, 1.0)
        if out_dir is not None:
            with open(Path(out_dir) / ITERATIONS_FILE, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        log.info("iteration %d (step %d): rm auc %.3f on the policy's samples, verified accuracy %.3f",
                 self.iteration, state.step, row["rm_auc"], row["verified_accuracy"])
        return row

    def _update_rm(self, state) -> dict[str, float]:
        """The RM measured on this iteration's samples, then (rm.continual_training) trained on them plus
        the replay draw; the iteration's row."""
        c = self.cfg.rm
        model, tok = self.rm.model, self.rm.tokenizer
        sep = getattr(self.rm, "step_separator", c.step_separator)
        before = evaluate_reward_model(model, tok, self.current, kind=self.kind, batch_size=c.batch_size,
                                       step_separator=sep)
        row: dict[str, float] = {"iteration": float(self.iteration + 1), "step": float(state.step),
                                 "rm_auc": float(before["auc"]), "rm_accuracy": float(before["accuracy"]),
                                 "rm_group_auc": float(before.get("group_auc", math.nan)),
                                 "samples": float(len(self.current)),
                                 "verified_accuracy": _mean([s.label for s in self.current])}
        if c.continual_training:
            mix, k = training_mix(self.current, self.history, c.replay_share, self.generator)
            stats = train_reward_model(model, tok, mix, kind=self.kind, objective=c.objective,
                                       optimizer=self.optimizer, epochs=c.epochs,
                                       batch_size=c.train_batch_size, generator=self.generator,
                                       step_separator=sep, max_length=c.max_length)
            row.update({"rm_train_loss": float(stats.get("loss", math.nan)), "replay_samples": float(k),
                        "mix_samples": float(len(mix))})
        return row

    # -- checkpoint --------------------------------------------------------------------------------

    def share_for_checkpoint(self, dist) -> None:
        """Every rank, before rank 0 writes a checkpoint: every rank's samples of this iteration, in rank
        order, for `save` (the RM, its optimizer and the replay pool are the same on every rank)."""
        self.shares = dist.gather_object(self.current)

    def save(self, folder: Path) -> None:
        """The RM's weights, and reward_loop.pt: its optimizer, the generator, the iteration, each rank's
        samples of this iteration (current_by_rank) and the replay pool."""
        shares, self.shares = (self.shares if self.shares is not None else [self.current]), None
        save_model(self.rm.model, str(folder / RM_WEIGHTS))
        torch.save({"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
                    "iteration": self.iteration,
                    "current_by_rank": [[dataclasses.asdict(s) for s in share] for share in shares],
                    "history": [dataclasses.asdict(s) for s in self.history]}, folder / RM_STATE)

    def load(self, folder: Path) -> None:
        if not (folder / RM_WEIGHTS).exists():
            raise CheckpointError(f"{folder} has no {RM_WEIGHTS}: it was not written by an iterative run "
                                    "(run.iterations > 0); resume with the checkpoint's run.iterations")
        load_model(self.rm.model, str(folder / RM_WEIGHTS))
        blob = torch.load(folder / RM_STATE, weights_only=True, map_location="cpu")
        self.optimizer.load_state_dict(blob["optimizer"])
        self.generator.set_state(blob["generator"])
        self.iteration = blob["iteration"]
        shares = blob["current_by_rank"] if "current_by_rank" in blob else [blob["current"]]  # one process
        if len(shares) != self.world_size:   # another rank count: rank 0 takes them all, none is lost
            log.warning("%s was written by %d ranks, resumed on %d: rank 0 takes this iteration's samples "
                        "so far", folder.name, len(shares), self.world_size)
            shares = [[d for share in shares for d in share]] + [[]] * (self.world_size - 1)
        self.current = [RMSample(**d) for d in shares[self.rank]]
        self.history = [RMSample(**d) for d in blob["history"]]


def _mean(values: list) -> float:
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(vals) / len(vals) if vals else math.nan
