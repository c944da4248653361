"""[G] One GRPO step: `train_step` (DeepSeekMath, Shao et al. 2024, section 4.1 and Algorithm 1's inner loop).

Every step, with fresh generations from the current policy (rollout.steps_per_generation = k > 1: steps 1-4
once every k steps on k times the prompts, then each step trains its own slice of B groups in step 5,
grpokit.train.generations):

    1. [A] sample   : G completions per prompt                          sample_groups
    2. [B] score    : r_i = sum_k w_k * reward_k(prompt, completion_i)  score_responses
    3. [D] ref      : log pi_ref per token (frozen; skipped when beta=0) per_token_logprobs
                      (reward.overlap: steps 2 and 3 at once, the rewards on a thread: collect.Scoring)
    4. [C] advantage: A_i = (r_i - mean(r_group)) / std(r_group)       group_advantages
    5. [E-F] update : mu times, minimize -(clipped surrogate - beta * k3 KL), per token,
                      averaged per completion then over completions     grpo_objective_from_logprobs
    6. log          : the step's metrics (written by the loop, grpokit.train.loop)

Choices, all from the config: the loss variants live in core/loss.py and core/advantages.py as named
switches; this file only wires the phases together, each inside a named timer. Steps 1-4 are `generate`
(steps 1-2: `collect_batch`, collect.py); step 5 is `policy_update` (update.py), and the weights move in
`update.optimizer_step` (clip, `optimizer.step()`, schedule step); the state a step reads and writes is
`TrainState` (state.py). The loop picks the step once (`step_function`): this GRPO step, or the PPO
baseline's `grpokit.train.ppo.ppo_train_step`. The optional CPU speed-ups are on for a step's passes
through one line, `with switch.accelerated(...)` (grpokit.switch).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import torch

from grpokit import switch
from grpokit.config.schema import GRPOConfig
from grpokit.core.advantages import (
    decoupled_advantages,
    group_advantages,
    process_advantages,
    tree_advantages,
)
from grpokit.core.loss import k3_kl
from grpokit.observe.agent_metrics import trajectory_stats
from grpokit.observe.metrics import PhaseTimer, length_stats, nan_std, reward_stats, tensor_stats
from grpokit.rollout.groups import Rollout
from grpokit.rollout.tree import decoded_tokens
from grpokit.train.collect import Scoring, collect_batch, collect_overlapped
from grpokit.train.distributed import Distributed
from grpokit.train.generations import Batch, Generation, take_slice
from grpokit.train.mcts_rollouts import mcts_stats
from grpokit.train.ppo import ppo_train_step
from grpokit.train.state import TrainState
from grpokit.train.update import forward_logprobs, micro_batch_plan, policy_update, skip_update

log = logging.getLogger("grpokit")


def compute_advantages(cfg: GRPOConfig, rollout: Rollout, rewards: torch.Tensor,
                       step_rewards, dist: Distributed | None = None,
                       per_func: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """[C] outcome advantages [N], plus process advantages [N, T] when a process reward is configured.

    With several ranks, groups are whole on each rank; the rewards of all ranks are gathered so that
    scale_rewards=batch divides by the whole batch's std, and this rank keeps its rows.
    per_func: (rewards [N, K] of each outcome function, weights [K]) for
    loss.multi_objective_aggregation=normalize_then_sum (GDPO).
    """
    G = rollout.group_size
    dist = dist or Distributed()
    if cfg.loss.multi_objective_aggregation == "normalize_then_sum" and per_func is not None:
        full, mine = dist.gather_rows(per_func[0])                                 # [N_all, K]
        adv = decoupled_advantages(full, per_func[1], G)[mine]                     # [N]
    else:
        full, mine = dist.gather_rows(rewards)                                     # [N_all], this rank's rows
        adv = group_advantages(full, G, scale_rewards=cfg.loss.scale_rewards)[mine]  # [N]
    T = rollout.completion_ids.shape[1]
    if step_rewards is not None:
        adv = adv[:, None] + process_advantages(step_rewards, G, T)                # [N, T]
    tree = rollout.tree
    if tree is not None:   # tree rollouts: each segment's node value against its parent's
        seg = tree_advantages(full, tree.widths, tree.branch_at, T,
                              scale_rewards=cfg.loss.scale_rewards)[mine]                  # [N, T]
        adv = (adv if adv.dim() == 2 else adv[:, None]) + cfg.rollout.tree_segment_weight * seg  # [N, T]
    return adv.to(rollout.completion_ids.device)


def train_step(state: TrainState, timer: PhaseTimer | None = None, tracker=None) -> dict[str, float]:
    """[G] One GRPO step; returns this step's metrics. On fresh generations, or with
    rollout.steps_per_generation = k > 1 on the next slice of the generation batch sampled at most k - 1
    steps ago (grpokit.train.generations: slices, pi_old, resume).

    tracker: an optional `grpokit.observe.tracking.Tracker` (completions log, per-prompt history).
    """
    cfg, lo = state.cfg, state.cfg.loss
    if lo.algorithm == "ppo":
        raise ValueError("loss.algorithm=ppo: run grpokit.train.ppo.ppo_train_step on this state "
                         "(train_grpo picks it: step_function)")
    timer = timer or PhaseTimer(cuda=next(state.model.parameters()).is_cuda)
    k = cfg.rollout.steps_per_generation
    # Every optional CPU speed-up (decode kernels, activation reuse: grpokit.switch) is on for this
    # step's passes only; outside this block, and with it left out, the step is plain PyTorch. k > 1:
    # no activation record (it holds the sampling weights' projections, stale after the first slice).
    with switch.accelerated(state.model, cfg, world_size=state.dist.world_size, timer=timer,
                            buffers=state.speedup_buffers, record=False if k > 1 else None) as speedups:
        if state.generation is None:   # [A] [B] [D] [C] on k * B prompts (k = 1: this step's own)
            state.generation = generate(state, timer, speedups)
        j = state.generation.slice_index(state.step)
        batch = take_slice(state.generation, j)
        if j + 1 >= state.generation.slices:   # its last slice: the next step samples again
            state.generation = None
        skipped_before = state.skipped_updates
        with timer("update"):
            if state.dist.all_true(bool(torch.isfinite(batch.advantages).all())):  # every rank, or none
                upd = policy_update(state, batch.rollout, batch.advantages, old_lp=batch.old_lp,
                                    ref_lp=batch.ref_lp, loss_mask=batch.loss_mask, timer=timer)
            else:  # checked before the update: NaN advantages would poison every weight
                upd = {"grad_norm": skip_update(state)}
    if state.skipped_updates > skipped_before:
        _log_bad_batch(state, batch.rollout, "loss or gradient" if "loss" in upd else "advantages")
    if (lo.ref_model_sync_steps and state.ref_model is not None
            and (state.step + 1) % lo.ref_model_sync_steps == 0):
        state.dist.sync_reference(state.ref_model, state.model, lo.ref_model_mixup_alpha)
    state.step += 1
    with timer("log"):
        metrics = _step_metrics(state, batch, upd, first=j == 0, tracker=tracker)
        if k > 1:   # which slice of its generation this step trained (0: the step that sampled it)
            metrics["generation/slice"] = float(j)
    return metrics


def generate(state: TrainState, timer: PhaseTimer, speedups) -> Generation:
    """Steps 1-4 on rollout.steps_per_generation x B prompts: sample, score, the reference's log-probs,
    pi_old (the sampling policy's log-probs, when mu > 1 or k > 1), advantages on whole groups."""
    cfg, lo = state.cfg, state.cfg.loss
    if cfg.reward.overlap:   # [B] scored on a thread while the passes below run (collect.Scoring)
        rollout, scoring, info = collect_overlapped(state, timer)
    else:
        rollout, scores, correct, info = collect_batch(state, timer)
        scoring = Scoring.finished(scores, correct)
    # the tokens the policy sampled (multi-turn: tool / environment tokens are attended, not trained)
    loss_mask = rollout.loss_mask.float()
    if lo.mask_truncated_completions:
        loss_mask = loss_mask * (~rollout.truncated).float()[:, None]  # no EOS: no loss
    ref_lp = old_lp = None
    with scoring:   # a pass that raises leaves only once the reward thread is joined
        # the update's micro-batch plan: reuse the sampler's record? decided once, here,
        # so a record that won't pay is freed before the passes
        with timer("update"):
            speedups.decide_reuse(state, rollout, micro_batch_plan)
        if state.ref_model is not None:
            with timer("ref_forward"):
                ref_lp = forward_logprobs(state.ref_model, rollout, cfg,
                                          state.dist.logprobs_fn(state.ref_model))
        if lo.num_iterations > 1 or cfg.rollout.steps_per_generation > 1:
            with timer("old_forward"):
                old_lp = forward_logprobs(state.model, rollout, cfg,
                                          state.dist.logprobs_fn(state.model))  # once per generation batch
    scores, correct = scoring.result()   # waited for in time/reward_wait; a reward's error raises here
    rewards = scores.total
    with timer("advantage"):
        if lo.kl_in_reward and ref_lp is not None:
            base = old_lp if old_lp is not None else forward_logprobs(state.model, rollout, cfg,
                                                                      state.dist.logprobs_fn(state.model))
            seq_kl = (k3_kl(base, ref_lp) * rollout.loss_mask).sum(-1)  # [N]
            rewards = rewards - lo.beta * seq_kl.to(rewards.device)
        if torch.isinf(rewards).any():  # NaN marks a skipped score; inf is a broken reward function
            raise FloatingPointError("rewards contain inf: check the reward functions")
        advantages = compute_advantages(cfg, rollout, rewards.cpu(), scores.step_rewards, state.dist,
                                        per_func=outcome_rewards(state.reward_funcs, scores))
    batch = Batch(rollout, scores, correct, info, advantages, loss_mask, old_lp, ref_lp)
    return Generation(batch, first_step=state.step, slices=cfg.rollout.steps_per_generation)


def _step_metrics(state: TrainState, batch: Batch, upd: dict[str, float], *, first: bool,
                  tracker) -> dict[str, float]:
    """The step's metrics.jsonl row over its batch (all ranks); first: the generation's first slice, which
    reports the search's figures (MCTS)."""
    rollout, scores, correct, advantages = batch.rollout, batch.scores, batch.correct, batch.advantages
    loss_mask = batch.loss_mask
    adv_flat = (advantages if advantages.dim() == 1
                else (advantages * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1))
    g = state.dist.gather  # several ranks: per-completion values of all ranks, so figures are global
    mask, correct_all = g(rollout.completion_mask), None if correct is None else g(correct)
    metrics = {"step": state.step, **reward_stats(g(scores.total), correct_all, rollout.group_size),
               **{f"rewards/{k}": float(torch.nanmean(g(v))) for k, v in scores.per_func.items()},
               **{f"rewards/{k}/std": nan_std(g(v)) for k, v in scores.per_func.items()},
               **tensor_stats("advantage", g(adv_flat)),
               **length_stats(mask, g(rollout.truncated), correct_all),
               **upd, **state.dist.reduce_sums({**batch.info, **scores.metrics}),   # code/...: the sandbox
               "reward_errors": state.dist.sum(scores.num_errors),
               "bad_steps": float(state.bad_steps), "skipped_updates": float(state.skipped_updates),
               "learning_rate": state.scheduler.get_last_lr()[0], "completion_tokens": float(mask.sum()),
               "input_tokens_seen": state.count_input_tokens(rollout),
               **trajectory_stats(rollout, g),   # tools / environments only: turns, calls, errors
               **tree_stats(rollout, state.dist),   # tree rollouts only: tokens decoded
               **(mcts_stats(rollout, state.dist) if first else {})}   # MCTS only: tokens, nodes, values
    if tracker is not None:
        tracker.observe(state.step, rollout, scores, adv_flat, correct)
    return metrics


def outcome_rewards(reward_funcs: list, scores) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(raw scores [N, K], weights [K]) of the outcome reward functions (process ones score steps), or
    None when there is none."""
    outcome = [(name, w) for name, fn, w in reward_funcs
               if not getattr(fn, "process", False) and name in scores.per_func]
    if not outcome:
        return None
    return (torch.stack([scores.per_func[n].float().cpu() for n, _ in outcome], -1),
            torch.tensor([float(w) for _, w in outcome]))


def step_function(cfg: GRPOConfig) -> Callable[..., dict[str, float]]:
    """The step the loop runs: GRPO's `train_step`, or `grpokit.train.ppo.ppo_train_step` for
    loss.algorithm=ppo."""
    return ppo_train_step if cfg.loss.algorithm == "ppo" else train_step


def _log_bad_batch(state: TrainState, rollout: Rollout, what: str) -> None:
    """Warn about a skipped update, naming the batch's prompts (to find the data that caused it)."""
    prompts = [" ".join(str(p).split())[:80] for p in rollout.prompts[::rollout.group_size]]
    log.warning("step %d: non-finite %s, update skipped (%d in a row, run.max_bad_steps=%d); prompts: %s",
                state.step + 1, what, state.bad_steps, state.cfg.run.max_bad_steps, json.dumps(prompts))


def tree_stats(rollout: Rollout, dist: Distributed) -> dict[str, float]:
    """Tree rollouts: tokens decoded (each node's once) and what flat sampling of the same leaves decodes."""
    tree = rollout.tree
    if tree is None:
        return {}
    decoded = dist.sum(decoded_tokens(rollout.completion_mask, tree))
    flat = dist.sum(int(rollout.completion_mask.sum()))
    return {"tree/decoded_tokens": float(decoded), "tree/flat_tokens": float(flat),
            "tree/decoded_share": decoded / max(flat, 1)}
