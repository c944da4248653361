"""[E-F] applied: the policy-update phase of a GRPO step, and the no-grad log-prob passes it needs.

`policy_update` runs mu optimizer updates over one generation batch: micro-batches of similar-length
rows, each loss normalized by whole-batch counts so that gradient accumulation (and data parallel
ranks) give the one-big-batch update; a non-finite loss or gradient skips the update and counts it.
The objective itself is the pure function `grpokit.core.loss.grpo_objective_from_logprobs`; the weights
change in `optimizer_step` (clip, `optimizer.step()`, schedule step), at the bottom of this file.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from grpokit.core.entropy import applied_entropy_coef, next_entropy_coef
from grpokit.core.loss import (
    Filters,
    Variants,
    grpo_objective_from_logprobs,
    logprob_mismatch,
    truncated_is_weights,
)
from grpokit.model import packing, speedups
from grpokit.model.buckets import micro_batches, token_budget_batches
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.precision import autocast_for
from grpokit.model.reference import weights_owner
from grpokit.model.shared_prompts import model_shares_prompts
from grpokit.observe.metrics import PhaseTimer
from grpokit.rollout.groups import Rollout
from grpokit.train.state import TrainState

if TYPE_CHECKING:
    from grpokit.config.schema import GRPOConfig


def rows_logprobs(model, rollout: Rollout, rows: slice | torch.Tensor, temperature: float, *,
                  fn=per_token_logprobs, record=None, consume: bool = False, **kw):
    """Log-probs for some rows (a slice or an index tensor), trimmed to their longest prompt and completion.

    record: the sampler's record of these weights (rows must be an index tensor; `speedups.Speedups`):
    the forward takes its projection outputs (`record.logprobs`) instead of `fn`; consume: its last use.
    """
    mask = rollout.completion_mask[rows]
    T = int(mask.sum(-1).max()) if mask.numel() else 0
    T = max(T, 1)
    p_mask = rollout.prompt_mask[rows]
    P0 = int((p_mask.sum(0) > 0).nonzero()[0]) if p_mask.any() else 0   # drop all-pad prompt columns
    ids = torch.cat([rollout.prompt_ids[rows, P0:], rollout.completion_ids[rows, :T]], dim=1)
    att = torch.cat([p_mask[:, P0:], mask[:, :T]], dim=1)
    if record is not None:
        return record.logprobs(model, rows, ids, att, T, temperature=temperature, consume=consume, **kw), T
    return fn(model, ids, att, T, temperature=temperature, **kw), T  # fn: through DDP/FSDP when distributed


def forward_logprobs(model, rollout: Rollout, cfg: GRPOConfig, fn=per_token_logprobs) -> torch.Tensor:
    """[N, T] log-probs with no autograd state (reference model, or the old policy when mu > 1)."""
    N, T = rollout.completion_ids.shape
    mb = cfg.optim.micro_batch_size or N
    out = torch.zeros(N, T, device=rollout.completion_ids.device)
    n_params = sum(p.numel() for p in weights_owner(model).parameters())   # LoRA's reference holds none
    shared = rollout.prompt_ids if model_shares_prompts(model) else None   # each prompt once per micro-batch
    packed = {"padding_free": True} if cfg.optim.padding_free else {}
    with torch.inference_mode():   # rows of similar length together: little padding (buckets.micro_batches)
        for rows in _plan(cfg, rollout, mb, n_params, shared, by_length=True):
            rows = rows.to(out.device)
            lp, t = rows_logprobs(model, rollout, rows, cfg.rollout.temperature, fn=fn, **packed)
            out[rows, :t] = lp
    return out.clone()  # leave inference mode: usable in autograd as a constant


def _plan(cfg: GRPOConfig, rollout: Rollout, max_rows: int, n_params: int, shared, by_length: bool):
    """The micro-batches: by optim.max_tokens_per_micro_batch (packed rows) when set, else by rows."""
    if cfg.optim.max_tokens_per_micro_batch:
        return token_budget_batches(rollout.prompt_mask, rollout.completion_mask,
                                    cfg.optim.max_tokens_per_micro_batch, max_rows, prompt_ids=shared)
    return micro_batches(rollout.prompt_mask, rollout.completion_mask, max_rows, n_params,
                         by_length=by_length, prompt_ids=shared)


def micro_batch_plan(state: TrainState, rollout: Rollout) -> list[torch.Tensor]:
    """The update's micro-batches (row indices each), optim.micro_batch_size rows at most: rows of similar
    length together (`buckets.micro_batches`), a group's prompt kept in one where the pass runs it once;
    bnpo normalizes per micro-batch, so it keeps the plain consecutive slices (its math does not depend
    on the lengths). With optim.max_tokens_per_micro_batch, by that token budget (`token_budget_batches`;
    bnpo's normalization then follows the budget's micro-batches)."""
    N = rollout.completion_ids.shape[0]
    n_params = sum(p.numel() for p in state.model.parameters())
    shared = rollout.prompt_ids if model_shares_prompts(state.model) else None
    return _plan(state.cfg, rollout, state.cfg.optim.micro_batch_size or N, n_params, shared,
                 by_length=state.cfg.loss.loss_type != "bnpo")


# How a micro-batch's metric joins the step's figure: token-weighted mean, completion-weighted mean, plain
# sum; every other metric is a share of a batch-normalized loss, summed (x 1/micro-batches for bnpo).
TOKEN_METRICS = ("approx_kl", "mean_ratio", "clip_ratio", "clip_ratio_low", "clip_ratio_high", "entropy",
                 "tis/mean_weight", "tis/clipped_frac", "mismatch/abs_logprob_diff_mean", "cispo_clip_ratio")
SEQ_METRICS = ("vespo/phi_seq_mean",)
SUM_METRICS = ("bonus_entropy_sum", "bonus_tokens")


def objective_options(cfg: GRPOConfig, entropy_coef: float | None) -> tuple[Variants, Filters]:
    """The loss types' constants and the token filters of `grpo_objective_from_logprobs`, from the config.

    entropy_coef: the bonus' coefficient this update (None: no bonus)."""
    lo = cfg.loss
    variants = Variants(lo.sapo_temperature_pos, lo.sapo_temperature_neg, lo.vespo_k_pos, lo.vespo_lambda_pos,
                        lo.vespo_k_neg, lo.vespo_lambda_neg)
    return variants, Filters(lo.top_entropy_quantile, lo.off_policy_mask_threshold, entropy_coef)


def bonus_enabled(cfg: GRPOConfig) -> bool:
    """An entropy bonus is part of the loss (a coefficient, or adaptive control that may turn one on)."""
    return cfg.loss.entropy_coef != 0.0 or cfg.loss.use_adaptive_entropy


def off_sampler(cfg: GRPOConfig, rollout: Rollout) -> bool:
    """The tokens were sampled by another engine (vLLM) or by older weights (rollout.async, lag > 0),
    with their log-probs kept: the update corrects for the gap (truncated / masked IS)."""
    return rollout.sampling_logprobs is not None and (cfg.rollout.backend == "vllm" or rollout.policy_lag > 0)


def _sampler_weights(state: TrainState, rollout: Rollout, rows, new_lp, old_lp, m, T: int, first: bool):
    """The sampler correction of one micro-batch: (IS weights or None, their metrics, the sampler's
    log-probs or None). Only when another engine (vLLM) or older weights (rollout.async) sampled it."""
    cfg, lo = state.cfg, state.cfg.loss
    if not off_sampler(cfg, rollout):
        return None, {}, None
    base = new_lp.detach() if old_lp is None else old_lp[rows, :T]        # pi_old (the trainer)
    sampled = rollout.sampling_logprobs[rows, :T].to(base.device)
    mets = logprob_mismatch(base, sampled, m) if first else {}
    if lo.tis_level == "none":
        return None, mets, sampled
    weights, weight_mets = truncated_is_weights(base, sampled, m, lo.tis_level, lo.tis_cap, mode=lo.tis_mode,
                                                floor=lo.tis_min)
    return weights, {**mets, **weight_mets}, sampled


def policy_update(state: TrainState, rollout: Rollout, advantages: torch.Tensor, *, old_lp, ref_lp,
                  loss_mask: torch.Tensor, timer: PhaseTimer) -> dict[str, float]:
    """[E-F] mu optimizer updates over the generation batch, micro-batched with gradient accumulation."""
    cfg, lo, dist = state.cfg, state.cfg.loss, state.dist
    N = rollout.completion_ids.shape[0]                                   # this rank's completions
    # length buckets; inside the switch, the decision to reuse the sampler's record
    groups, record, last_use = speedups.active().update_plan(state, rollout, micro_batch_plan)
    bonus = bonus_enabled(cfg)
    if (bonus or cfg.optim.padding_free) and record is not None:   # the entropy needs its gradient, packed
        record.release()                                           # rows are not the record's: plain pass
        record, last_use = None, False
        groups = micro_batch_plan(state, rollout)
    pass_kw = {"entropy_grad": True} if bonus else {}
    if cfg.optim.padding_free:
        pass_kw["padding_free"] = True
    n_micro = len(groups)
    # Normalizers over the whole generation batch, all ranks (grpokit.train.distributed); one process:
    # N, tokens
    total = dist.reduce_sums({"seqs": N, "tokens": loss_mask.sum(), "micro": n_micro})
    num_seqs, num_tokens = total["seqs"], total["tokens"]
    beta = 0.0 if lo.kl_in_reward else lo.beta
    bnpo_scale = 1.0 / total["micro"] if lo.loss_type == "bnpo" else 1.0  # bnpo normalizes per micro-batch
    mismatch_max = torch.zeros(())                       # max |logp_old - logp_sampler| over the batch
    logprobs_fn = dist.logprobs_fn(state.model)
    out: dict[str, float] = {}
    for it in range(lo.num_iterations):
        use = record if it == 0 else None                 # later iterations run on updated weights
        coef = entropy_coef_now(state) if bonus else None
        variants, filters = objective_options(cfg, coef)
        # the bonus is a mean per micro-batch, each weighted by its share (TRL: 1 / accumulation steps)
        filters = filters._replace(entropy_scale=1.0 if lo.loss_type == "bnpo" else 1.0 / total["micro"])
        sums: dict[str, torch.Tensor] = {}
        loss_finite = torch.tensor(True)
        # one autocast scope for all micro-batches: in bf16 each fp32 weight is cast once per update; packed
        # attention in force through backward (a checkpointed layer's recompute needs it)
        packed_scope = packing.installed(state.model) if cfg.optim.padding_free else contextlib.nullcontext()
        with autocast_for(state.model), packed_scope:
            for g, rows in enumerate(groups):
                rows = rows.to(loss_mask.device)
                dist.sync_grads(state.model, g == n_micro - 1)   # reduce over ranks on the last one only
                (new_lp, entropy), T = rows_logprobs(state.model, rollout, rows, cfg.rollout.temperature,
                                                      fn=logprobs_fn, record=use, consume=last_use,
                                                      return_entropy=True, **pass_kw)
                m = loss_mask[rows, :T]
                a = advantages[rows] if advantages.dim() == 1 else advantages[rows, :T]
                tis, tis_mets, sampled = _sampler_weights(state, rollout, rows, new_lp, old_lp, m, T, it == 0)
                if "mismatch/abs_logprob_diff_max" in tis_mets:
                    worst = tis_mets.pop("mismatch/abs_logprob_diff_max").cpu()
                    mismatch_max = torch.maximum(mismatch_max, worst)
                loss, mets = grpo_objective_from_logprobs(
                    new_lp, None if old_lp is None else old_lp[rows, :T],
                    None if ref_lp is None else ref_lp[rows, :T], m, a, lo.epsilon, beta,
                    clip_eps_high=cfg.epsilon_high, delta=lo.delta, loss_type=lo.loss_type,
                    importance_sampling_level=lo.importance_sampling_level, num_sequences=num_seqs,
                    num_tokens=num_tokens, max_completion_length=cfg.rollout.max_completion_length,
                    tis_weights=tis, kl_bias_correction=lo.use_bias_correction_kl, variants=variants,
                    filters=filters, entropy=entropy, sampler_logprobs=sampled)
                mets.update(tis_mets)
                loss_finite = loss_finite & torch.isfinite(loss.detach()).cpu()  # one sync per update, below
                (loss * bnpo_scale * dist.grad_scale).backward()  # DDP averages over ranks: x W, the sum
                mets["entropy"] = (entropy.detach() * m).sum() / m.sum().clamp(min=1.0)
                _accumulate(sums, mets, m, bnpo_scale)
        if use is not None:
            use.release()
        with timer("optimizer"):
            # the weights move here: clip, AdamW step, LR schedule step (optimizer_step, below)
            grad_norm = optimizer_step(state) if dist.all_true(bool(loss_finite)) else skip_update(state)
        sums = dist.reduce_sums(sums)                    # one all-reduce: figures over the whole batch
        suffix = "" if it == 0 else f"/iter{it}"
        out.update(_step_figures(state, sums, num_tokens, num_seqs, suffix))
        out["grad_norm" + suffix] = grad_norm
    if off_sampler(cfg, rollout):
        out["mismatch/abs_logprob_diff_max"] = float(dist.gather(mismatch_max.view(1)).max())
    return out


def _accumulate(sums: dict[str, torch.Tensor], mets: dict[str, torch.Tensor], m: torch.Tensor,
                bnpo_scale: float) -> None:
    """Add one micro-batch's metrics to the step's sums (TOKEN_METRICS / SEQ_METRICS / SUM_METRICS)."""
    for k, v in mets.items():
        if k in TOKEN_METRICS:
            add = v * m.sum()
        elif k in SEQ_METRICS:
            add = v * m.shape[0]
        elif k in SUM_METRICS:
            add = v
        else:
            add = v * bnpo_scale
        sums[k] = sums.get(k, 0.0) + add


def _step_figures(state: TrainState, sums: dict, num_tokens: float, num_seqs: float,
                  suffix: str) -> dict[str, float]:
    """The update's metrics from the summed micro-batch figures; with an entropy bonus, adaptive control
    steps here (once per optimizer step) and the coefficient is reported."""
    out: dict[str, float] = {}
    for k, v in sums.items():
        if k in SUM_METRICS:
            continue
        norm = num_tokens if k in TOKEN_METRICS else num_seqs if k in SEQ_METRICS else 1.0
        out[k + suffix] = float(v / max(norm, 1.0)) if norm != 1.0 else float(v)
    if "bonus_tokens" in sums:
        step_entropy = float(sums["bonus_entropy_sum"] / max(float(sums["bonus_tokens"]), 1.0))
        lo = state.cfg.loss
        if lo.use_adaptive_entropy:
            state.entropy_coef = next_entropy_coef(entropy_coef_value(state), step_entropy,
                                                   target=lo.entropy_target, delta=lo.entropy_coef_delta,
                                                   coef_min=lo.entropy_coef_min, coef_max=lo.entropy_coef_max)
            state.last_entropy = step_entropy
        out["entropy_coef" + suffix] = entropy_coef_value(state)
    return out


def entropy_coef_value(state: TrainState) -> float:
    """The entropy coefficient c now (adaptive control moves it; else loss.entropy_coef)."""
    return state.cfg.loss.entropy_coef if state.entropy_coef is None else state.entropy_coef


def entropy_coef_now(state: TrainState) -> float:
    """The coefficient the next update applies (grpokit.core.entropy.applied_entropy_coef)."""
    lo = state.cfg.loss
    return applied_entropy_coef(entropy_coef_value(state), state.last_entropy, lo.entropy_target,
                                lo.use_adaptive_entropy)


def optimizer_step(state: TrainState) -> float:
    """Clip, then AdamW step and schedule step, unless the gradient is non-finite (then the update is
    skipped and counted). Returns the gradient norm before clipping."""
    params = [p for p in state.model.parameters() if p.requires_grad]
    max_norm = state.cfg.optim.max_grad_norm or float("inf")
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if not torch.isfinite(torch.tensor(norm)):
        skip_update(state)
        return norm
    state.optimizer.step()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.bad_steps = 0
    return norm


def skip_update(state: TrainState) -> float:
    """Drop this update (weights, optimizer moments and LR schedule untouched); count it. Returns NaN."""
    state.optimizer.zero_grad(set_to_none=True)
    state.bad_steps += 1
    state.skipped_updates += 1
    return float("nan")


def grpo_loss(model, rollout, advantages: torch.Tensor, ref_model=None,
              old_logprobs: torch.Tensor | None = None, clip_eps: float = 0.2, kl_coef: float = 0.04,
              temperature: float = 1.0, **objective_kw) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """[E-F] with the forward passes: the GRPO loss of a `Rollout` under `model` (no micro-batches, no
    speed-ups: the textbook form of what `policy_update` computes).

    new log-probs carry gradients; the reference's are computed under inference mode. Extra keyword
    arguments (loss_type, clip_eps_high, importance_sampling_level, ...) go to
    `grpo_objective_from_logprobs`.
    """
    T = rollout.completion_ids.shape[1]
    new = per_token_logprobs(model, rollout.input_ids, rollout.attention_mask, T, temperature=temperature)
    ref = None
    if ref_model is not None and kl_coef != 0.0:
        with torch.inference_mode():
            ref = per_token_logprobs(ref_model, rollout.input_ids, rollout.attention_mask, T,
                                     temperature=temperature)
        ref = ref.clone()
    return grpo_objective_from_logprobs(new, old_logprobs, ref, rollout.loss_mask, advantages,
                                        clip_eps, kl_coef, **objective_kw)
