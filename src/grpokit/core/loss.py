"""[E-F] The GRPO objective, per token, as pure functions over tensors.

DeepSeekMath eq. (3), for completion i of a group and its token t:

    r_{i,t}   = exp(logp_new - logp_old)                                 (per-token ratio)
    L^clip    = min(r_{i,t} * A_{i,t}, clip(r_{i,t}, 1 - eps_low, 1 + eps_high) * A_{i,t})
    KL_{i,t}  = exp(ref - new) - (ref - new) - 1                         (k3, eq. 4; >= 0)
    J_{i,t}   = L^clip - beta * KL_{i,t}
    loss      = - 1/G sum_i 1/|o_i| sum_t J_{i,t}                        (loss_type "grpo")

Variants, one named switch each (`aggregate_loss`, `importance_weights`, `policy_terms.policy_term`):

    loss_type "grpo"     - sum_i (1/|o_i|) sum_t J_{i,t} / N_seq             per-completion token mean (eq. 3)
    loss_type "bnpo"     - sum_{i,t} J_{i,t} / sum_i |o_i|   (this micro-batch)  masked token mean
    loss_type "dr_grpo"  - sum_{i,t} J_{i,t} / (N_seq * T_max)                Dr. GRPO: constant normalizer
    loss_type "dapo"     - sum_{i,t} J_{i,t} / N_tok                          DAPO: tokens of the whole batch
    loss_type "luspo"    - sum_i sum_t J_{i,t} / N_seq                        LUSPO (arXiv 2602.05261): GSPO's
                                                                          sequence term weighted by |o_i|
    loss_type "cispo", "vespo"  aggregated as dapo; "sapo" as grpo; their policy terms replace L^clip
                         (grpokit.core.policy_terms: CISPO, SAPO, VESPO)

    importance_sampling_level "token"    r_{i,t} as above (eq. 3)
    importance_sampling_level "sequence" s_i = exp( 1/|o_i| sum_t (logp_new - logp_old) ), one ratio per
                                         completion, clipped once (GSPO)
    delta (optional)                     r_{i,t} <- min(r_{i,t}, delta) in the unclipped branch (bounds the
                                         ratio for negative advantages, two-sided clipping)
    kl_bias_correction (optional)        KL_{i,t} <- r_{i,t} * KL_{i,t}, r with its gradient (TRL's
                                         use_bias_correction_kl, DeepSeek-V3.2): the unbiased gradient of
                                         the reverse KL; at mu = 1 the value is unchanged, the gradient not

Token filters on the policy term (grpokit.core.token_masks), then the sampler correction, then the KL:

    top_entropy_quantile rho < 1         policy term only on the top-rho tokens by entropy ("80/20 rule")
    off_policy_threshold delta           negative-advantage completions that drifted past delta are dropped
    tis_weights w                        the policy term becomes w * term (no gradient through w; the KL
                                         term is unweighted; vespo folds w into its sequence weight instead)
    entropy_coef c                       loss <- loss - c * mean_t H_t (grpokit.core.entropy)

Importance sampling for a sampler that is not the trainer (vLLM), `truncated_is_weights`:

    tis_level "token"    w_{i,t} = exp(logp_old - logp_sampler)               per token
    tis_level "sequence" w_i     = exp(sum_t (logp_old - logp_sampler))       one weight per completion
    tis_mode "truncate"  w <- clamp(w, C_min, C_max)          (truncated IS)
    tis_mode "mask"      w <- 0 where w < C_min or w > C_max  (masked IS: the outliers are dropped)
    the mismatch itself (`logprob_mismatch`): mean and max over valid tokens of |logp_old - logp_sampler|

N_seq and N_tok default to this call's completions and valid tokens; passing the whole generation
batch's counts makes micro-batch losses sum to the big-batch loss for every loss type but bnpo (it
normalizes per micro-batch, as TRL does).
"""

from __future__ import annotations

import typing

import torch

from grpokit.config.choices import ImportanceSamplingLevel
from grpokit.core.entropy import entropy_bonus
from grpokit.core.policy_terms import LOSS_TYPES, Variants, policy_term
from grpokit.core.token_masks import high_entropy_mask, off_policy_mask

IS_LEVELS = typing.get_args(ImportanceSamplingLevel)
__all__ = ["IS_LEVELS", "LOSS_TYPES", "Filters", "Variants", "aggregate_loss", "grpo_objective_from_logprobs",
           "importance_weights", "k3_kl", "logprob_mismatch", "truncated_is_weights"]


def k3_kl(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi_new || pi_ref): exp(ref - new) - (ref - new) - 1 >= 0. [N, T]"""
    delta = ref_logprobs - new_logprobs                                   # [N, T]
    return torch.exp(delta) - delta - 1.0


def importance_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Log importance weights at the chosen level: token [N, T], or sequence [N, 1] (GSPO)."""
    if level == "token":
        return log_ratio
    if level == "sequence":
        lengths = mask.sum(-1).clamp(min=1.0)                             # [N]
        return ((log_ratio * mask).sum(-1) / lengths).unsqueeze(-1)       # [N, 1]
    raise ValueError(f"importance_sampling_level must be one of {IS_LEVELS}, got {level!r}")


def aggregate_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str,
                   num_sequences: float | None = None, num_tokens: float | None = None,
                   max_completion_length: int | None = None) -> torch.Tensor:
    """Reduce a [N, T] (or [N, 1]) per-token loss to a scalar with the named normalization (module
    docstring)."""
    n_seq = float(mask.shape[0]) if num_sequences is None else float(num_sequences)
    masked = per_token_loss * mask                                        # [N, T]
    if loss_type in ("grpo", "sapo"):
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)            # [N]; all-masked rows give 0
        return per_seq.sum() / n_seq
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        t_max = mask.shape[1] if max_completion_length is None else max_completion_length
        return masked.sum() / (n_seq * t_max)
    if loss_type in ("dapo", "cispo", "vespo"):
        n_tok = mask.sum().clamp(min=1.0) if num_tokens is None else max(float(num_tokens), 1.0)
        return masked.sum() / n_tok
    if loss_type == "luspo":
        return masked.sum() / n_seq                                       # sum_i |o_i| * (token mean)_i / N
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


class Filters(typing.NamedTuple):
    """The optional token filters and the entropy bonus (module docstring); defaults: all off."""

    top_entropy_quantile: float = 1.0          # rho: train on the top-rho tokens by entropy (1 = all)
    off_policy_threshold: float | None = None  # delta of the off-policy sequence mask (None = off)
    entropy_coef: float | None = None          # c of the entropy bonus applied this step (None: no bonus;
                                               # 0.0: an adaptive bonus whose gate is closed)
    entropy_scale: float = 1.0                 # this call's share of the batch in the bonus' mean


def _filtered(term: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, new_logprobs: torch.Tensor,
              drift_logprobs: torch.Tensor, entropy: torch.Tensor | None,
              f: Filters) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy term times the off-policy and high-entropy masks; and the tokens the bonus acts on."""
    bonus_mask = mask
    if f.off_policy_threshold is not None:
        term = term * off_policy_mask(adv, new_logprobs, drift_logprobs, mask, f.off_policy_threshold)
    if f.top_entropy_quantile < 1.0:
        if entropy is None:
            raise ValueError("top_entropy_quantile < 1 needs the per-token entropy")
        keep = high_entropy_mask(entropy.detach(), mask, 1.0 - f.top_entropy_quantile).to(term.dtype)
        term, bonus_mask = term * keep, mask * keep
    return term, bonus_mask


def grpo_objective_from_logprobs(
    new_logprobs: torch.Tensor,               # [N, T] log pi_theta(o_t | q, o_<t), with grad
    old_logprobs: torch.Tensor | None,        # [N, T] log pi_theta_old; None = new.detach() (mu = 1)
    ref_logprobs: torch.Tensor | None,        # [N, T] log pi_ref; None skips the KL term
    completion_mask: torch.Tensor,            # [N, T] 1 for valid tokens (up to and incl. the first EOS)
    advantages: torch.Tensor,                 # [N] outcome, or [N, T] per-token (process supervision)
    clip_eps: float = 0.2,
    kl_coef: float = 0.04,
    *,
    clip_eps_high: float | None = None,
    delta: float | None = None,
    loss_type: str = "grpo",
    importance_sampling_level: str = "token",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    max_completion_length: int | None = None,
    tis_weights: torch.Tensor | None = None,  # [N, T] or [N, 1] sampler IS weights (vLLM), no grad
    kl_bias_correction: bool = False,
    variants: Variants = Variants(),          # sapo / vespo constants
    filters: Filters = Filters(),             # entropy / off-policy filters and the entropy bonus
    entropy: torch.Tensor | None = None,      # [N, T] policy entropy (with grad when the bonus is on)
    sampler_logprobs: torch.Tensor | None = None,  # [N, T] the sampler's log-probs (off-policy mask)
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss type's policy term minus the k3 KL penalty, per token, aggregated by `loss_type`.

    Returns:
        (loss, metrics): loss is a scalar to minimize (minus the objective). metrics are detached
        0-d tensors: loss, policy_loss (policy term only), approx_kl (mean k3 over valid tokens),
        mean_ratio, clip_ratio (share of valid tokens where the clip is active), clip_ratio_low,
        clip_ratio_high, the loss type's own (policy_terms.policy_term) and, with a bonus
        (filters.entropy_coef not None), entropy_bonus (c * H * scale), bonus_entropy_sum and bonus_tokens
        (sum of H and count over the bonus' tokens). Convert them once per step, not per micro-batch.
    """
    mask = completion_mask.to(new_logprobs.dtype)                         # [N, T]
    if old_logprobs is None:
        old_logprobs = new_logprobs.detach()
    adv = advantages.to(new_logprobs.dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv                    # [N, 1] or [N, T]
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    agg = dict(loss_type=loss_type, num_sequences=num_sequences, num_tokens=num_tokens,
               max_completion_length=max_completion_length)

    log_ratio = new_logprobs - old_logprobs                               # [N, T]
    ratio = torch.exp(importance_weights(log_ratio, mask, importance_sampling_level))  # [N, T] or [N, 1]
    vespo_w = tis_weights if loss_type == "vespo" else None                 # folded into its sequence weight
    term, extra = policy_term(loss_type, ratio, adv, new_logprobs, log_ratio, mask, eps_low=clip_eps,
                              eps_high=eps_high, delta=delta, variants=variants, sampler_ratio=vespo_w)
    drift = old_logprobs if sampler_logprobs is None else sampler_logprobs
    per_token_loss, bonus_mask = _filtered(term, mask, adv, new_logprobs, drift, entropy, filters)
    if tis_weights is not None and loss_type != "vespo":                  # sampler != trainer: w * term
        per_token_loss = per_token_loss * tis_weights.detach().to(per_token_loss.dtype)
    with torch.no_grad():
        policy_loss = aggregate_loss(per_token_loss, mask, **agg)

    if ref_logprobs is not None and kl_coef != 0.0:
        kl = k3_kl(new_logprobs, ref_logprobs)                            # [N, T]
        kl_term = kl * ratio if kl_bias_correction else kl                # ratio [N, T] or [N, 1]
        per_token_loss = per_token_loss + kl_coef * kl_term
        approx_kl = _masked_mean(kl.detach(), mask)
    else:
        approx_kl = torch.zeros((), dtype=new_logprobs.dtype)
    loss = aggregate_loss(per_token_loss, mask, **agg)
    if filters.entropy_coef is not None:
        if entropy is None:
            raise ValueError("an entropy bonus (filters.entropy_coef) needs the per-token entropy")
        bonus = entropy_bonus(entropy, bonus_mask, filters.entropy_coef, filters.entropy_scale)
        loss = loss - bonus
        with torch.no_grad():   # the bonus' tokens and their entropy sum: adaptive control's measurement
            extra.update(entropy_bonus=bonus.detach(), bonus_entropy_sum=(entropy * bonus_mask).sum(),
                         bonus_tokens=bonus_mask.sum())
    return loss, {**_ratio_metrics(ratio, adv, mask, clip_eps, eps_high), **extra, "loss": loss.detach(),
                  "policy_loss": policy_loss, "approx_kl": approx_kl}


@torch.no_grad()
def _ratio_metrics(ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, eps_low: float,
                   eps_high: float) -> dict[str, torch.Tensor]:
    """mean_ratio and the shares of valid tokens where the clip is active (low side, high side, either)."""
    r, a = ratio.expand_as(mask), adv.expand_as(mask)
    low = ((r < 1.0 - eps_low) & (a < 0)).to(mask.dtype)
    high = ((r > 1.0 + eps_high) & (a > 0)).to(mask.dtype)
    return {"mean_ratio": _masked_mean(r, mask), "clip_ratio_low": _masked_mean(low, mask),
            "clip_ratio_high": _masked_mean(high, mask), "clip_ratio": _masked_mean(low + high, mask)}


def truncated_is_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                         level: str = "token", cap: float | None = 2.0, *, mode: str = "truncate",
                         floor: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights that correct for sampling with another engine, truncated or masked (module
    docstring); TRL's vllm_importance_sampling_mode is f"{level}_{mode}".

    The tokens were drawn from pi_sampler (e.g. vLLM, other kernels and precision), but the surrogate
    assumes pi_old. Weighting each token's policy term by pi_old / pi_sampler removes that bias; truncating
    the weight to [C_min, C_max] bounds its variance, masking drops the tokens (or completions) outside it.

    Args:
        old_logprobs: [N, T] log pi_old under the trainer (no grad).
        sampler_logprobs: [N, T] log-probs the sampler returned with the tokens (NaN: not scored, weight 1).
        mask: [N, T] 1 on valid completion tokens.
        level: "token" (one weight per token) or "sequence" (the product over the completion, one weight).
        cap: C_max (None: no upper bound).
        mode: "truncate" (clamp to [C_min, C_max]) or "mask" (0 outside it).
        floor: C_min (None: no lower bound).

    Returns:
        (weights [N, T] for token or [N, 1] for sequence, metrics): tis/mean_weight is the mean weight
        over valid tokens, tis/clipped_frac the share of valid tokens whose weight left [C_min, C_max].
    """
    mask = mask.to(old_logprobs.dtype)
    log_ratio = (old_logprobs.detach() - sampler_logprobs.to(old_logprobs.dtype)) * mask   # [N, T]
    log_ratio = torch.nan_to_num(log_ratio, nan=0.0)
    if level == "token":
        raw = torch.exp(log_ratio)                                                        # [N, T]
    elif level == "sequence":
        raw = torch.exp(log_ratio.sum(-1, keepdim=True))                                  # [N, 1]
    else:
        raise ValueError(f"tis_level must be token or sequence, got {level!r}")
    lo = -float("inf") if floor is None else floor
    hi = float("inf") if cap is None else cap
    outside = (raw < lo) | (raw > hi)
    if mode == "truncate":
        weights = torch.clamp(raw, min=floor, max=cap)
    elif mode == "mask":
        weights = raw.masked_fill(outside, 0.0)
    else:
        raise ValueError(f"tis_mode must be truncate or mask, got {mode!r}")
    with torch.no_grad():
        metrics = {"tis/mean_weight": _masked_mean(weights.expand_as(mask), mask),
                   "tis/clipped_frac": _masked_mean(outside.to(mask.dtype).expand_as(mask), mask)}
    return weights, metrics


def logprob_mismatch(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the sampler's log-probs are from the trainer's, over valid completion tokens.

    Args:
        old_logprobs: [N, T] log pi_old under the trainer; sampler_logprobs: [N, T] the sampler's.
        mask: [N, T] 1 on valid completion tokens.

    Returns:
        mismatch/abs_logprob_diff_mean (token mean) and mismatch/abs_logprob_diff_max of
        |logp_old - logp_sampler|; 0 when there is no valid token.
    """
    mask = mask.to(old_logprobs.dtype)
    diff = (old_logprobs.detach() - sampler_logprobs.to(old_logprobs.dtype)).abs() * mask    # [N, T]
    return {"mismatch/abs_logprob_diff_mean": _masked_mean(diff, mask),
            "mismatch/abs_logprob_diff_max": diff.max() if diff.numel() else diff.new_zeros(())}
