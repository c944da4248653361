"""[E-F] applied: the policy-update phase of a GRPO step, and the no-grad log-prob passes it needs.

`policy_update` runs mu optimizer updates over one generation batch: micro-batches of similar-length
rows, each loss normalized by whole-batch counts so that gradient accumulation (and data parallel
ranks) give the one-big-batch update; a non-finite loss or gradient skips the update and counts it.
The objective itself is the pure function `grpokit.core.loss.grpo_objective_from_logprobs`; the weights
change in `optimizer_step` (clip, `optimizer.step()`, schedule step), at the bottom of this file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from grpokit import fast
from grpokit.core.loss import grpo_objective_from_logprobs, logprob_mismatch, truncated_is_weights
from grpokit.model.buckets import micro_batches
from grpokit.model.logprobs import model_shares_prompts, per_token_logprobs
from grpokit.model.precision import autocast_for
from grpokit.model.reference import weights_owner
from grpokit.observe.metrics import PhaseTimer
from grpokit.rollout.groups import Rollout
from grpokit.train.state import TrainState

if TYPE_CHECKING:
    from grpokit.config.schema import GRPOConfig


def rows_logprobs(model, rollout: Rollout, rows: slice | torch.Tensor, temperature: float, *,
                  fn=per_token_logprobs, record=None, consume: bool = False, **kw):
    """Log-probs for some rows (a slice or an index tensor), trimmed to their longest prompt and completion.

    record: the sampler's `ActivationRecord` of these weights (rows must be an index tensor): the forward
    takes its projection outputs (`grpokit.fast.reuse.reused_logprobs`) instead of `fn`; consume: its last
    use.
    """
    mask = rollout.completion_mask[rows]
    T = int(mask.sum(-1).max()) if mask.numel() else 0
    T = max(T, 1)
    p_mask = rollout.prompt_mask[rows]
    P0 = int((p_mask.sum(0) > 0).nonzero()[0]) if p_mask.any() else 0   # drop all-pad prompt columns
    ids = torch.cat([rollout.prompt_ids[rows, P0:], rollout.completion_ids[rows, :T]], dim=1)
    att = torch.cat([p_mask[:, P0:], mask[:, :T]], dim=1)
    if record is not None:
        return fast.reused_logprobs(model, record, rows, ids, att, T, temperature=temperature,
                                    consume=consume, **kw), T
    return fn(model, ids, att, T, temperature=temperature, **kw), T  # fn: through DDP/FSDP when distributed


def forward_logprobs(model, rollout: Rollout, cfg: GRPOConfig, fn=per_token_logprobs) -> torch.Tensor:
    """[N, T] log-probs with no autograd state (reference model, or the old policy when mu > 1)."""
    N, T = rollout.completion_ids.shape
    mb = cfg.optim.micro_batch_size or N
    out = torch.zeros(N, T, device=rollout.completion_ids.device)
    n_params = sum(p.numel() for p in weights_owner(model).parameters())   # LoRA's reference holds none
    shared = rollout.prompt_ids if model_shares_prompts(model) else None   # each prompt once per micro-batch
    with torch.inference_mode():   # rows of similar length together: little padding (buckets.micro_batches)
        for rows in micro_batches(rollout.prompt_mask, rollout.completion_mask, mb, n_params,
                                  prompt_ids=shared):
            rows = rows.to(out.device)
            lp, t = rows_logprobs(model, rollout, rows, cfg.rollout.temperature, fn=fn)
            out[rows, :t] = lp
    return out.clone()  # leave inference mode: usable in autograd as a constant


def policy_update(state: TrainState, rollout: Rollout, advantages: torch.Tensor, *, old_lp, ref_lp,
                  loss_mask: torch.Tensor, timer: PhaseTimer) -> dict[str, float]:
    """[E-F] mu optimizer updates over the generation batch, micro-batched with gradient accumulation."""
    cfg, lo, dist = state.cfg, state.cfg.loss, state.dist
    N = rollout.completion_ids.shape[0]                                   # this rank's completions
    groups, record, last_use = fast.update_plan(state, rollout)          # length buckets; the reuse decision
    n_micro = len(groups)
    # Normalizers over the whole generation batch, all ranks (grpokit.train.distributed); one process:
    # N, tokens
    total = dist.reduce_sums({"seqs": N, "tokens": loss_mask.sum(), "micro": n_micro})
    num_seqs, num_tokens = total["seqs"], total["tokens"]
    beta = 0.0 if lo.kl_in_reward else lo.beta
    bnpo_scale = 1.0 / total["micro"] if lo.loss_type == "bnpo" else 1.0  # bnpo normalizes per micro-batch
    other_sampler = cfg.rollout.backend == "vllm" and rollout.sampling_logprobs is not None
    use_tis = other_sampler and lo.tis_level != "none"
    token_metrics = ("approx_kl", "mean_ratio", "clip_ratio", "clip_ratio_low", "clip_ratio_high", "entropy",
                     "tis/mean_weight", "tis/clipped_frac", "mismatch/abs_logprob_diff_mean")
    mismatch_max = torch.zeros(())                       # max |logp_old - logp_sampler| over the batch
    logprobs_fn = dist.logprobs_fn(state.model)
    out: dict[str, float] = {}
    for it in range(lo.num_iterations):
        use = record if it == 0 else None                 # later iterations run on updated weights
        sums: dict[str, torch.Tensor] = {}
        loss_finite = torch.tensor(True)
        # one autocast scope for all micro-batches: in bf16 each fp32 weight is cast once per update
        with autocast_for(state.model):
            for g, rows in enumerate(groups):
                rows = rows.to(loss_mask.device)
                dist.sync_grads(state.model, g == n_micro - 1)   # reduce over ranks on the last one only
                (new_lp, entropy), T = rows_logprobs(state.model, rollout, rows, cfg.rollout.temperature,
                                                      fn=logprobs_fn, record=use, consume=last_use,
                                                      return_entropy=True)
                m = loss_mask[rows, :T]
                a = advantages[rows] if advantages.dim() == 1 else advantages[rows, :T]
                tis, tis_mets = None, {}
                if other_sampler:  # pi_old (the trainer) vs the engine that sampled: measure, then correct
                    base = new_lp.detach() if old_lp is None else old_lp[rows, :T]
                    sampled = rollout.sampling_logprobs[rows, :T].to(base.device)
                    if it == 0:
                        tis_mets = logprob_mismatch(base, sampled, m)
                        worst = tis_mets.pop("mismatch/abs_logprob_diff_max").cpu()
                        mismatch_max = torch.maximum(mismatch_max, worst)
                if use_tis:  # weight by min(pi_old / pi_sampler, cap) (loss.truncated_is_weights)
                    tis, weight_mets = truncated_is_weights(base, sampled, m, lo.tis_level, lo.tis_cap)
                    tis_mets.update(weight_mets)
                loss, mets = grpo_objective_from_logprobs(
                    new_lp, None if old_lp is None else old_lp[rows, :T],
                    None if ref_lp is None else ref_lp[rows, :T], m, a, lo.epsilon, beta,
                    clip_eps_high=cfg.epsilon_high, delta=lo.delta, loss_type=lo.loss_type,
                    importance_sampling_level=lo.importance_sampling_level, num_sequences=num_seqs,
                    num_tokens=num_tokens, max_completion_length=cfg.rollout.max_completion_length,
                    tis_weights=tis,
                    kl_bias_correction=lo.use_bias_correction_kl)
                mets.update(tis_mets)
                loss_finite = loss_finite & torch.isfinite(loss.detach()).cpu()  # one sync per update, below
                (loss * bnpo_scale * dist.grad_scale).backward()  # DDP averages over ranks: x W, the sum
                # Micro-batch losses are normalized by whole-batch counts, so they add up to the batch loss;
                # token-level metrics are averaged with token weights.
                mets["entropy"] = (entropy * m).sum() / m.sum().clamp(min=1.0)
                for k, v in mets.items():
                    add = v * m.sum() if k in token_metrics else v * bnpo_scale
                    sums[k] = sums.get(k, 0.0) + add
        if use is not None:
            use.release()
        with timer("optimizer"):
            # the weights move here: clip, AdamW step, LR schedule step (optimizer_step, below)
            grad_norm = optimizer_step(state) if dist.all_true(bool(loss_finite)) else skip_update(state)
        sums = dist.reduce_sums(sums)                    # one all-reduce: figures over the whole batch
        suffix = "" if it == 0 else f"/iter{it}"
        for k, v in sums.items():
            out[k + suffix] = float(v / max(num_tokens, 1.0)) if k in token_metrics else float(v)
        out["grad_norm" + suffix] = grad_norm
    if other_sampler:
        out["mismatch/abs_logprob_diff_max"] = float(dist.gather(mismatch_max.view(1)).max())
    return out


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
