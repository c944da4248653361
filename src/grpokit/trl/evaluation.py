"""Evaluation as TRL's GRPOTrainer does it: the GRPO loss and the reward metrics on sampled completions.

    metrics = evaluate_sets(run, eval_sets, "eval")   # {"eval_loss": ..., "eval_reward": ..., ...}

For each eval set, its prompts go in batches of `per_device_eval_batch_size` completions
(`num_generations_eval` sampled per prompt, with the training sampling settings); each batch is
scored by every reward function, gets group-relative advantages, and its loss is the objective
at the current weights (ratio 1, the KL to the reference when beta > 0) without any update. The
metrics are TRL's names averaged over the batches (reward, reward_std, rewards/<f>/mean and /std,
frac_reward_zero_std, completions/*, entropy, kl), the loss weighted by completions; HF's
runtime figures are added. One set is prefixed `eval_`, a dict of sets `eval_<name>_` (as
transformers' Trainer prefixes a dict of eval datasets).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.config.schema import ConfigError
from grpokit.config.schema import GRPOConfig as NestedConfig
from grpokit.core.loss import grpo_objective_from_logprobs
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.reference import eval_mode
from grpokit.observe.metrics import length_stats, nan_std, reward_stats
from grpokit.rewards.scoring import reward_kwargs, score_responses
from grpokit.rollout.groups import Rollout, sample_groups
from grpokit.train.step import compute_advantages, outcome_rewards
from grpokit.train.update import objective_options
from grpokit.trl.logs import trl_completion_metrics


@dataclass
class EvalRun:
    """What an evaluation reads: the model, its reference, the rewards and TRL's eval batch layout."""

    cfg: NestedConfig                 # grpokit's config (sampling, objective)
    model: torch.nn.Module
    tokenizer: Any
    reward_funcs: list                # (name, fn, weight) triples
    num_generations: int              # num_generations_eval (or num_generations)
    batch_size: int                   # per_device_eval_batch_size: completions per batch
    ref_model: Any = None             # with beta > 0
    entropy_coef: float | None = None  # the bonus applied (None: no bonus)
    reward_extra: dict = field(default_factory=dict)   # trainer_state, log_metric, log_extra
    agent: Any = None                 # tools / environments (grpokit.agents.agent.Agent): multi-turn

    def prompts_per_batch(self) -> int:
        if self.batch_size % self.num_generations:
            raise ConfigError(f"per_device_eval_batch_size ({self.batch_size}) must be a multiple of the "
                              f"completions per eval prompt (num_generations_eval or num_generations = "
                              f"{self.num_generations}): change one")
        return self.batch_size // self.num_generations


def _columns(examples: list, group_size: int) -> dict[str, list]:
    keys = examples[0].columns.keys() if examples else []
    return {k: [ex.columns.get(k) for ex in examples for _ in range(group_size)] for k in keys}


def _sample_and_score(run: EvalRun, examples: list):
    r = run.cfg.rollout
    if run.agent is not None:   # multi-turn episodes on the agent's evaluation pool
        rollout = run.agent.sample(run.model, run.tokenizer, examples, run.num_generations, run.cfg,
                                   evaluation=True)
    else:
        rollout = sample_groups(run.model, run.tokenizer, [ex.prompt for ex in examples], run.num_generations,
                                r.max_completion_length, temperature=r.temperature, top_p=r.top_p,
                                top_k=r.top_k, max_prompt_length=r.max_prompt_length,
                                truncate_prompt=r.truncate_prompt,
                                backend="auto" if r.backend == "vllm" else r.backend,
                                chat_template_kwargs=run.cfg.task.chat_template_kwargs)
    ids = [row[m.bool()].tolist() for row, m in zip(rollout.completion_ids, rollout.completion_mask)]
    scores = score_responses(run.reward_funcs, rollout.prompts, rollout.completions,
                             _columns(examples, run.num_generations),
                             reward_errors=run.cfg.reward.reward_errors,
                             completion_ids=ids, **reward_kwargs(run.cfg), **run.reward_extra,
                             **rollout.reward_kwargs)
    return rollout, scores


@torch.no_grad()
def _batch_loss(run: EvalRun, rollout: Rollout, advantages: torch.Tensor) -> tuple[float, dict[str, float]]:
    """The objective at the current weights (old = new: ratio 1) and its entropy / KL figures."""
    cfg, lo = run.cfg, run.cfg.loss
    T = rollout.completion_ids.shape[1]
    with eval_mode(run.model):
        new, entropy = per_token_logprobs(run.model, rollout.input_ids, rollout.attention_mask, T,
                                          temperature=cfg.rollout.temperature, return_entropy=True)
        ref = None if run.ref_model is None or lo.beta == 0 else per_token_logprobs(
            run.ref_model, rollout.input_ids, rollout.attention_mask, T, temperature=cfg.rollout.temperature)
    mask = rollout.loss_mask.float()   # the sampled tokens (multi-turn: not the tools' tokens)
    if lo.mask_truncated_completions:
        mask = mask * (~rollout.truncated).float()[:, None]
    variants, filters = objective_options(cfg, run.entropy_coef)
    loss, mets = grpo_objective_from_logprobs(
        new, None, ref, mask, advantages.to(new.device), lo.epsilon, lo.beta, clip_eps_high=cfg.epsilon_high,
        delta=lo.delta, loss_type=lo.loss_type, importance_sampling_level=lo.importance_sampling_level,
        max_completion_length=cfg.rollout.max_completion_length, kl_bias_correction=lo.use_bias_correction_kl,
        variants=variants, filters=filters, entropy=entropy)
    m = rollout.completion_mask.float()
    out = {"entropy": float((entropy * m).sum() / m.sum().clamp(min=1.0))}
    if lo.beta != 0:
        out["kl"] = float(mets["approx_kl"])
    return float(loss), out


def _batch_metrics(run: EvalRun, rollout: Rollout, scores) -> dict[str, float]:
    """TRL's per-batch reward and completion metrics."""
    out = {f"rewards/{k}/{stat}": v for k, t in scores.per_func.items()
           for stat, v in (("mean", float(torch.nanmean(t))), ("std", nan_std(t)))}
    stats = reward_stats(scores.total, None, rollout.group_size)
    out.update(reward=stats["reward_mean"], reward_std=stats["reward_std"],
               frac_reward_zero_std=stats["frac_zero_std"])
    return {**out, **trl_completion_metrics(length_stats(rollout.completion_mask, rollout.truncated))}


def evaluate_set(run: EvalRun, examples: list, prefix: str) -> dict[str, float]:
    """One eval set: TRL's eval metrics under `prefix` (eval_loss, eval_reward, ..., eval_runtime)."""
    if not examples:
        raise ConfigError("the eval dataset is empty: give it prompts or drop it")
    start, per = time.perf_counter(), run.prompts_per_batch()
    sums: dict[str, list[float]] = {}
    weighted_loss, completions = 0.0, 0
    for s in range(0, len(examples), per):
        rollout, scores = _sample_and_score(run, examples[s:s + per])
        adv = compute_advantages(run.cfg, rollout, scores.total.cpu(), scores.step_rewards,
                                 per_func=outcome_rewards(run.reward_funcs, scores))
        loss, mets = _batch_loss(run, rollout, adv)
        n = rollout.completion_ids.shape[0]
        weighted_loss, completions = weighted_loss + loss * n, completions + n
        for k, v in {**_batch_metrics(run, rollout, scores), **mets}.items():
            sums.setdefault(k, []).append(v)
    runtime = time.perf_counter() - start
    batches = math.ceil(len(examples) / per)
    out = {"loss": weighted_loss / completions}
    for k, vals in sums.items():   # TRL: the mean of each batch's value, NaN ignored (None when all NaN)
        finite = [v for v in vals if not math.isnan(v)]
        out[k] = sum(finite) / len(finite) if finite else None
    out.update(runtime=round(runtime, 4), samples_per_second=round(completions / runtime, 3),
               steps_per_second=round(batches / runtime, 3))
    return {f"{prefix}_{k}": v for k, v in out.items()}


def evaluate_sets(run: EvalRun, eval_sets: dict[str | None, list], prefix: str = "eval") -> dict[str, float]:
    """Every eval set: {None: examples} is prefixed `<prefix>_`, named sets `<prefix>_<name>_`."""
    out: dict[str, float] = {}
    for name, examples in eval_sets.items():
        out.update(evaluate_set(run, examples, prefix if name is None else f"{prefix}_{name}"))
    return out
