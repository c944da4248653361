"""[G-H] GRPO training: `train_step` and `train_grpo` (DeepSeekMath, Shao et al. 2024, Algorithm 1).

Every step, with fresh generations from the current policy:

    1. [A] sample   : G completions per prompt                          sample_groups
    2. [B] score    : r_i = sum_k w_k * reward_k(prompt, completion_i)  score_responses
    3. [D] ref      : log pi_ref per token (frozen; skipped when beta=0) per_token_logprobs
    4. [C] advantage: A_i = (r_i - mean(r_group)) / std(r_group)       group_advantages
    5. [E-F] update : mu times, minimize -(clipped surrogate - beta * k3 KL), per token,
                      averaged per completion then over completions     grpo_objective_from_logprobs
    6. log          : one metrics.jsonl row per step

Choices, all from the config: the loss variants live in loss.py and advantages.py as named switches;
this file only wires the phases together, each inside a named timer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .advantages import group_advantages, process_advantages
from .config import GRPOConfig
from .data import PromptStream
from .logprobs import per_token_logprobs
from .loss import grpo_objective_from_logprobs, k3_kl
from .metrics import PhaseTimer, length_stats, peak_rss_mib, reward_stats, tensor_stats
from .models import frozen_reference, load_model_and_tokenizer, sync_reference
from .rollout import Rollout, concat_rollouts, sample_groups

log = logging.getLogger("grpokit")


@dataclass
class TrainState:
    """Everything a step reads and writes; a checkpoint is this plus the RNG states."""

    cfg: GRPOConfig
    model: torch.nn.Module
    tokenizer: Any
    ref_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    reward_funcs: list[tuple[str, Callable, float]]
    stream: PromptStream
    eval_examples: list = field(default_factory=list)
    step: int = 0
    bad_steps: int = 0


def make_optimizer(model: torch.nn.Module, cfg: GRPOConfig):
    """AdamW over trainable parameters and a constant / linear schedule with linear warm-up."""
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    if o.optim == "adamw_8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise ValueError("optim.optim=adamw_8bit needs bitsandbytes: pip install bitsandbytes, "
                             "or use optim.optim=adamw") from None
        opt = bnb.optim.AdamW8bit(params, lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2),
                                  weight_decay=o.weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2),
                                weight_decay=o.weight_decay)
    total = cfg.run.max_steps * cfg.loss.num_iterations

    def factor(update: int) -> float:
        if o.warmup_steps and update < o.warmup_steps:
            return (update + 1) / o.warmup_steps
        if o.lr_scheduler_type == "linear":
            return max(0.0, (total - update) / max(1, total - o.warmup_steps))
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def build_reward_funcs(cfg: GRPOConfig) -> list[tuple[str, Callable, float]]:
    from .rewards import get_reward_function

    funcs = [(name, get_reward_function(name), float(w)) for name, w in cfg.reward.funcs.items()]
    if cfg.reward.overlong_buffer > 0 and "overlong" not in cfg.reward.funcs:
        funcs.append(("overlong", get_reward_function("overlong"), 1.0))  # DAPO soft overlong punishment
    return funcs


def build_state(cfg: GRPOConfig, model=None, tokenizer=None, train_examples: list | None = None,
                eval_examples: list | None = None) -> TrainState:
    """Load the policy (or take the given one), its frozen reference (only when beta > 0), data, rewards.

    train_examples / eval_examples: objects with .prompt, .answer, .columns (grpokit.tasks.Example);
    when None they come from the configured task.
    """
    torch.manual_seed(cfg.run.seed)
    if model is None:
        model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    ref = frozen_reference(model) if cfg.loss.beta > 0 else None  # beta = 0: no reference at all
    optimizer, scheduler = make_optimizer(model, cfg)
    if train_examples is None or (eval_examples is None and cfg.run.eval_limit != 0):
        from .tasks import load_examples
    train = train_examples if train_examples is not None else load_examples(cfg.task, cfg.task.train_split)
    evals = eval_examples if eval_examples is not None else (
        load_examples(cfg.task, cfg.task.eval_split) if cfg.run.eval_limit != 0 else [])
    return TrainState(cfg, model, tokenizer, ref, optimizer, scheduler, build_reward_funcs(cfg),
                      PromptStream(train, cfg.run.seed), evals)


def _reward_columns(examples: list, group_size: int) -> dict[str, list]:
    keys = examples[0].columns.keys() if examples else []
    return {k: [ex.columns.get(k) for ex in examples for _ in range(group_size)] for k in keys}


def generate_and_score(state: TrainState, examples: list, timer: PhaseTimer):
    """[A] + [B] for one set of prompts: (rollout, reward batch, correctness [N] or None)."""
    from .rewards import REWARDS, score_responses, token_char_ends

    cfg, r = state.cfg, state.cfg.rollout
    with timer("generate"):
        rollout = sample_groups(state.model, state.tokenizer, [ex.prompt for ex in examples], r.num_generations,
                                r.max_completion_length, r.temperature, r.top_p, r.top_k, r.max_prompt_length,
                                r.truncate_prompt, r.backend, generation_batch_size=r.generation_batch_size)
    with timer("reward"):
        columns = _reward_columns(examples, r.num_generations)
        ids = [row[m.bool()].tolist() for row, m in zip(rollout.completion_ids, rollout.completion_mask)]
        extra: dict[str, Any] = dict(completion_ids=ids, max_completion_length=r.max_completion_length,
                                     overlong_buffer=cfg.reward.overlong_buffer,
                                     overlong_penalty=cfg.reward.overlong_penalty)
        if any(getattr(fn, "process", False) for _, fn, _ in state.reward_funcs):
            extra["completion_char_ends"] = [token_char_ends(state.tokenizer, row) for row in ids]
        scores = score_responses(state.reward_funcs, rollout.prompts, rollout.completions, columns,
                                 reward_errors=cfg.reward.reward_errors, **extra)
        correct = scores.per_func.get("accuracy")
        if correct is None and "answer" in columns:
            acc = REWARDS["accuracy"](rollout.prompts, rollout.completions, **columns)
            correct = torch.tensor([float("nan") if a is None else float(a) for a in acc])
    return rollout, scores, correct


def collect_batch(state: TrainState, timer: PhaseTimer):
    """Prompts for one step, sampled and scored; with dynamic sampling (DAPO), groups whose rewards
    are all equal are dropped and new prompts sampled, at most `max_resample_rounds` extra rounds."""
    cfg = state.cfg
    B, G = cfg.rollout.prompts_per_step, cfg.rollout.num_generations
    rollout, scores, correct = generate_and_score(state, state.stream.take(B), timer)
    info: dict[str, float] = {}
    if not cfg.rollout.dynamic_sampling:
        return rollout, scores, correct, info
    parts, dropped, extra_gens, rounds = [], 0, 0, 0
    while True:
        std = torch.nan_to_num(scores.total.view(-1, G), nan=0.0).std(-1)  # [groups]
        keep = (std > 1e-8).nonzero().squeeze(-1).tolist()
        dropped += (scores.total.numel() // G) - len(keep)
        parts.append((rollout, scores, correct, keep))
        have = sum(len(k) for *_, k in parts)
        if have >= B or rounds >= cfg.rollout.max_resample_rounds:
            break
        rounds += 1
        extra_gens += B * G
        rollout, scores, correct = generate_and_score(state, state.stream.take(B), timer)
    rollout, scores, correct = _merge_kept(parts, B, G, state.tokenizer.pad_token_id)
    info = {"dynamic/groups_dropped": float(dropped), "dynamic/extra_generations": float(extra_gens),
            "dynamic/groups_kept": float(rollout.group_ids.numel() // G)}
    return rollout, scores, correct, info


def _merge_kept(parts, B: int, G: int, pad_id: int):
    """The first B kept groups across rounds, as one rollout with matching rewards."""
    from .rewards import RewardBatch

    rolls, totals, per_func, corrects, steps, left = [], [], {}, [], [], B
    for rollout, scores, correct, keep in parts:
        keep = keep[:left]
        left -= len(keep)
        if not keep:
            continue
        rows = [g * G + j for g in keep for j in range(G)]
        rolls.append(rollout.select(rows))
        totals.append(scores.total[rows])
        for k, v in scores.per_func.items():
            per_func.setdefault(k, []).append(v[rows])
        corrects.append(correct[rows] if correct is not None else torch.full((len(rows),), float("nan")))
        if scores.step_rewards is not None:
            steps.extend(scores.step_rewards[i] for i in rows)
    if not rolls:  # every group was uniform in every round: keep the last round, it gives zero advantage
        rollout, scores, correct, _ = parts[-1]
        return rollout, scores, correct
    merged = RewardBatch(torch.cat(totals), {k: torch.cat(v) for k, v in per_func.items()},
                         sum(p[1].num_errors for p in parts), steps or None)
    return concat_rollouts(rolls, pad_id), merged, torch.cat(corrects)


def compute_advantages(cfg: GRPOConfig, rollout: Rollout, rewards: torch.Tensor,
                       step_rewards) -> torch.Tensor:
    """[C] outcome advantages [N], plus process advantages [N, T] when a process reward is configured."""
    G = rollout.group_size
    adv = group_advantages(rewards, G, scale_rewards=cfg.loss.scale_rewards)       # [N]
    if step_rewards is not None:
        T = rollout.completion_ids.shape[1]
        adv = adv[:, None] + process_advantages(step_rewards, G, T)                # [N, T]
    return adv.to(rollout.completion_ids.device)


def _rows_logprobs(model, rollout: Rollout, rows: slice, temperature: float, **kw):
    """Log-probs for a slice of rows, trimmed to the slice's longest prompt and completion."""
    mask = rollout.completion_mask[rows]
    T = int(mask.sum(-1).max()) if mask.numel() else 0
    T = max(T, 1)
    p_mask = rollout.prompt_mask[rows]
    P0 = int((p_mask.sum(0) > 0).nonzero()[0]) if p_mask.any() else 0   # drop all-pad prompt columns
    ids = torch.cat([rollout.prompt_ids[rows, P0:], rollout.completion_ids[rows, :T]], dim=1)
    att = torch.cat([p_mask[:, P0:], mask[:, :T]], dim=1)
    return per_token_logprobs(model, ids, att, T, temperature=temperature, **kw), T


def forward_logprobs(model, rollout: Rollout, cfg: GRPOConfig) -> torch.Tensor:
    """[N, T] log-probs with no autograd state (reference model, or the old policy when mu > 1)."""
    N, T = rollout.completion_ids.shape
    mb = cfg.optim.micro_batch_size or N
    out = torch.zeros(N, T, device=rollout.completion_ids.device)
    with torch.inference_mode():
        for s in range(0, N, mb):
            lp, t = _rows_logprobs(model, rollout, slice(s, s + mb), cfg.rollout.temperature)
            out[s:s + mb, :t] = lp
    return out.clone()  # leave inference mode: usable in autograd as a constant


def policy_update(state: TrainState, rollout: Rollout, advantages: torch.Tensor, old_lp, ref_lp,
                  loss_mask: torch.Tensor, timer: PhaseTimer) -> dict[str, float]:
    """[E-F] mu optimizer updates over the generation batch, micro-batched with gradient accumulation."""
    cfg, lo = state.cfg, state.cfg.loss
    N = rollout.completion_ids.shape[0]
    mb = cfg.optim.micro_batch_size or N
    n_micro = (N + mb - 1) // mb
    num_tokens = float(loss_mask.sum())
    beta = 0.0 if lo.kl_in_reward else lo.beta
    bnpo_scale = 1.0 / n_micro if lo.loss_type == "bnpo" else 1.0  # bnpo normalizes per micro-batch
    token_metrics = ("approx_kl", "mean_ratio", "clip_ratio", "clip_ratio_low", "clip_ratio_high", "entropy")
    out: dict[str, float] = {}
    for it in range(lo.num_iterations):
        sums: dict[str, torch.Tensor] = {}
        for s in range(0, N, mb):
            rows = slice(s, s + mb)
            (new_lp, entropy), T = _rows_logprobs(state.model, rollout, rows, cfg.rollout.temperature,
                                                  return_entropy=True)
            m = loss_mask[rows, :T]
            a = advantages[rows] if advantages.dim() == 1 else advantages[rows, :T]
            loss, mets = grpo_objective_from_logprobs(
                new_lp, None if old_lp is None else old_lp[rows, :T], None if ref_lp is None else ref_lp[rows, :T],
                m, a, lo.epsilon, beta, clip_eps_high=cfg.epsilon_high, delta=lo.delta, loss_type=lo.loss_type,
                importance_sampling_level=lo.importance_sampling_level, num_sequences=N, num_tokens=num_tokens,
                max_completion_length=cfg.rollout.max_completion_length)
            (loss * bnpo_scale).backward()
            # Micro-batch losses are normalized by whole-batch counts, so they add up to the batch loss;
            # token-level metrics are averaged with token weights.
            mets["entropy"] = (entropy * m).sum() / m.sum().clamp(min=1.0)
            for k, v in mets.items():
                add = v * m.sum() if k in token_metrics else v * bnpo_scale
                sums[k] = sums.get(k, 0.0) + add
        grad_norm = _clip_and_step(state)
        suffix = "" if it == 0 else f"/iter{it}"
        for k, v in sums.items():
            out[k + suffix] = float(v / max(num_tokens, 1.0)) if k in token_metrics else float(v)
        out["grad_norm" + suffix] = grad_norm
    return out


def _clip_and_step(state: TrainState) -> float:
    """Clip, then step, unless the gradient is non-finite (the update is skipped and counted)."""
    params = [p for p in state.model.parameters() if p.requires_grad]
    max_norm = state.cfg.optim.max_grad_norm or float("inf")
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if not torch.isfinite(torch.tensor(norm)):
        state.optimizer.zero_grad(set_to_none=True)
        state.bad_steps += 1
        return norm
    state.optimizer.step()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.bad_steps = 0
    return norm


def train_step(state: TrainState, timer: PhaseTimer | None = None) -> dict[str, float]:
    """[G] One GRPO step on fresh generations; returns this step's metrics."""
    cfg, lo = state.cfg, state.cfg.loss
    timer = timer or PhaseTimer()
    rollout, scores, correct, info = collect_batch(state, timer)
    loss_mask = rollout.completion_mask.float()
    if lo.mask_truncated_completions:
        loss_mask = loss_mask * (~rollout.truncated).float()[:, None]     # no EOS: no loss
    ref_lp = old_lp = None
    if state.ref_model is not None:
        with timer("ref_forward"):
            ref_lp = forward_logprobs(state.ref_model, rollout, cfg)
    if lo.num_iterations > 1:
        with timer("old_forward"):
            old_lp = forward_logprobs(state.model, rollout, cfg)         # once per generation batch
    rewards = scores.total
    with timer("advantage"):
        if lo.kl_in_reward and ref_lp is not None:
            base = old_lp if old_lp is not None else forward_logprobs(state.model, rollout, cfg)
            seq_kl = (k3_kl(base, ref_lp) * rollout.completion_mask).sum(-1)  # [N]
            rewards = rewards - lo.beta * seq_kl.to(rewards.device)
        if not torch.isfinite(torch.nan_to_num(rewards, nan=0.0)).all():
            raise FloatingPointError("rewards contain inf: check the reward functions")
        advantages = compute_advantages(cfg, rollout, rewards.cpu(), scores.step_rewards)
    with timer("update"):
        upd = policy_update(state, rollout, advantages, old_lp, ref_lp, loss_mask, timer)
    if lo.ref_model_sync_steps and state.ref_model is not None and (state.step + 1) % lo.ref_model_sync_steps == 0:
        sync_reference(state.ref_model, state.model, lo.ref_model_mixup_alpha)
    state.step += 1
    adv_flat = advantages if advantages.dim() == 1 else (advantages * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)
    metrics = {"step": state.step, **reward_stats(scores.total, correct, rollout.group_size),
               **{f"rewards/{k}": float(torch.nanmean(v)) for k, v in scores.per_func.items()},
               **tensor_stats("advantage", adv_flat), **length_stats(rollout.completion_mask, rollout.truncated),
               **upd, **info, "reward_errors": float(scores.num_errors), "bad_steps": float(state.bad_steps),
               "learning_rate": state.scheduler.get_last_lr()[0], "completion_tokens": float(rollout.completion_mask.sum())}
    return metrics


def save_final(state: TrainState, out_dir: str | Path) -> Path:
    """save_pretrained folder (model + tokenizer + grpokit_config.json) that plain transformers loads."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state.model.save_pretrained(out)
    state.tokenizer.save_pretrained(out)
    (out / "grpokit_config.json").write_text(json.dumps(state.cfg.to_dict(), indent=2))
    return out


def _console(metrics: dict[str, float]) -> str:
    keys = (("reward_mean", "reward"), ("accuracy", "acc"), ("approx_kl", "kl"), ("loss", "loss"),
            ("completion_length_mean", "len"))
    return " ".join(f"{short}={metrics[k]:.3g}" for k, short in keys if k in metrics)


def train_grpo(cfg: GRPOConfig, model=None, tokenizer=None, train_examples: list | None = None,
               eval_examples: list | None = None, hooks: dict[str, Callable] | None = None) -> TrainState:
    """[H] The GRPO loop: fresh samples every step, one metrics.jsonl row per step, evaluation before
    and after (when run.eval_limit != 0), checkpoints every run.save_steps, the final model saved with
    save_pretrained into run.output_dir/final.

    hooks (tests only): {"after_step": fn(state, metrics)}.
    """
    from tqdm import tqdm

    from . import checkpoint
    from .metrics import MetricsWriter

    hooks = hooks or {}
    out_dir = Path(cfg.run.output_dir)
    checkpoint.prepare_output_dir(cfg)
    state = build_state(cfg, model, tokenizer, train_examples, eval_examples)
    resumed = checkpoint.resume_if_requested(state, out_dir)
    (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    writer = MetricsWriter(out_dir / "metrics.jsonl", start_step=state.step)
    if not resumed and state.eval_examples:
        _evaluate_and_log(state, writer, "before")
    timer = PhaseTimer()
    bar = tqdm(total=cfg.run.max_steps, initial=state.step, disable=not cfg.run.progress, desc="grpo",
               dynamic_ncols=True)
    try:
        while state.step < cfg.run.max_steps:
            with timer("step"):
                metrics = train_step(state, timer)
            metrics.update(timer.pop())
            metrics["tokens_per_s"] = metrics["completion_tokens"] / max(metrics["time/step"], 1e-9)
            metrics["peak_rss_mib"] = peak_rss_mib()
            if torch.cuda.is_available():
                metrics["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
            writer.write(metrics)
            bar.update(1)
            bar.set_postfix_str(_console(metrics))
            if not cfg.run.progress and state.step % cfg.run.logging_steps == 0:
                log.info("step %d %s", state.step, _console(metrics))
            if "after_step" in hooks:
                hooks["after_step"](state, metrics)
            if state.bad_steps >= cfg.run.max_bad_steps:
                raise FloatingPointError(
                    f"{state.bad_steps} non-finite updates in a row (run.max_bad_steps): lower "
                    f"optim.learning_rate or check the rewards; last good checkpoint in {out_dir}")
            if cfg.run.save_steps and state.step % cfg.run.save_steps == 0:
                checkpoint.save_checkpoint(state, out_dir)
            if cfg.run.eval_steps and state.step % cfg.run.eval_steps == 0 and state.step < cfg.run.max_steps:
                _evaluate_and_log(state, writer, f"step{state.step}")
    finally:
        bar.close()
    if state.eval_examples:
        _evaluate_and_log(state, writer, "after")
    writer.close()
    save_final(state, out_dir / "final")
    return state


def _evaluate_and_log(state: TrainState, writer, tag: str) -> dict[str, float]:
    """Greedy held-out evaluation; appended to eval.jsonl and logged."""
    from .evaluate import evaluate

    cfg = state.cfg
    result = evaluate(state.model, state.tokenizer, state.eval_examples, cfg, limit=cfg.run.eval_limit)
    row = {"tag": tag, "step": state.step, **result}
    with open(Path(cfg.run.output_dir) / "eval.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    log.info("eval %s (step %d): %s", tag, state.step,
             " ".join(f"{k}={v:.4g}" for k, v in result.items() if isinstance(v, float)))
    return row
