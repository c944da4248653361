"""[E-F] The GRPO objective, per token, as pure functions over tensors.

DeepSeekMath eq. (3), for completion i of a group and its token t:

    r_{i,t}   = exp(logp_new - logp_old)                                 (per-token ratio)
    L^clip    = min(r_{i,t} * A_{i,t}, clip(r_{i,t}, 1 - eps_low, 1 + eps_high) * A_{i,t})
    KL_{i,t}  = exp(ref - new) - (ref - new) - 1                         (k3, eq. 4; >= 0)
    J_{i,t}   = L^clip - beta * KL_{i,t}
    loss      = - 1/G sum_i 1/|o_i| sum_t J_{i,t}                        (loss_type "grpo")

Variants, one named switch each (`aggregate_loss`, `importance_weights`):

    loss_type "grpo"     - sum_i (1/|o_i|) sum_t J_{i,t} / N_seq             per-completion token mean (eq. 3)
    loss_type "bnpo"     - sum_{i,t} J_{i,t} / sum_i |o_i|   (this micro-batch)  masked token mean
    loss_type "dr_grpo"  - sum_{i,t} J_{i,t} / (N_seq * T_max)                Dr. GRPO: constant normalizer
    loss_type "dapo"     - sum_{i,t} J_{i,t} / N_tok                          DAPO: tokens of the whole batch

    importance_sampling_level "token"    r_{i,t} as above (eq. 3)
    importance_sampling_level "sequence" s_i = exp( 1/|o_i| sum_t (logp_new - logp_old) ), one ratio per
                                         completion, clipped once (GSPO)
    delta (optional)                     r_{i,t} <- min(r_{i,t}, delta) in the unclipped branch (bounds the
                                         ratio for negative advantages, two-sided clipping)
    kl_bias_correction (optional)        KL_{i,t} <- r_{i,t} * KL_{i,t}, r with its gradient (TRL's
                                         use_bias_correction_kl, DeepSeek-V3.2): the unbiased gradient of
                                         the reverse KL; at mu = 1 the value is unchanged, the gradient not

Truncated importance sampling (`truncated_is_weights`), for a sampler that is not the trainer (vLLM):

    tis_level "token"    w_{i,t} = min(exp(logp_old - logp_sampler), C)          per token
    tis_level "sequence" w_i     = min(exp(sum_t (logp_old - logp_sampler)), C)  one weight per completion
                         the policy term becomes w * L^clip (no gradient through w; KL term unweighted)
    the mismatch itself (`logprob_mismatch`): mean and max over valid tokens of |logp_old - logp_sampler|

N_seq and N_tok default to this call's completions and valid tokens; passing the whole generation
batch's counts makes micro-batch losses sum to the big-batch loss for grpo, dr_grpo and dapo
(gradient accumulation gives the same update). bnpo normalizes per micro-batch, so it does not.
"""

from __future__ import annotations

import typing

import torch

from grpokit.config.choices import ImportanceSamplingLevel, LossType

LOSS_TYPES = typing.get_args(LossType)  # declared once in grpokit.config.choices (the config field's type)
IS_LEVELS = typing.get_args(ImportanceSamplingLevel)


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
    """Reduce a [N, T] per-token loss to a scalar with the named normalization (module docstring)."""
    n_seq = float(mask.shape[0]) if num_sequences is None else float(num_sequences)
    masked = per_token_loss * mask                                        # [N, T]
    if loss_type == "grpo":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)            # [N]; all-masked rows give 0
        return per_seq.sum() / n_seq
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        t_max = mask.shape[1] if max_completion_length is None else max_completion_length
        return masked.sum() / (n_seq * t_max)
    if loss_type == "dapo":
        n_tok = mask.sum().clamp(min=1.0) if num_tokens is None else max(float(num_tokens), 1.0)
        return masked.sum() / n_tok
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


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
    tis_weights: torch.Tensor | None = None,  # [N, T] or [N, 1] truncated IS weights (vLLM sampler), no grad
    kl_bias_correction: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped GRPO surrogate minus the k3 KL penalty, per token, aggregated by `loss_type`.

    Returns:
        (loss, metrics): loss is a scalar to minimize (minus the objective). metrics are detached
        0-d tensors: loss, policy_loss (clip term only), approx_kl (mean k3 over valid tokens),
        mean_ratio, clip_ratio (share of valid tokens where the clip is active), clip_ratio_low,
        clip_ratio_high. Convert them once per step, not per micro-batch.
    """
    mask = completion_mask.to(new_logprobs.dtype)                         # [N, T]
    if old_logprobs is None:
        old_logprobs = new_logprobs.detach()
    adv = advantages.to(new_logprobs.dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv                    # [N, 1] or [N, T]
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high

    log_w = importance_weights(new_logprobs - old_logprobs, mask, importance_sampling_level)
    ratio = torch.exp(log_w)                                              # [N, T] or [N, 1]
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    unclipped = torch.clamp(ratio, max=delta) if delta is not None else ratio
    surrogate = torch.min(unclipped * adv, clipped * adv)                 # [N, T]
    if tis_weights is not None:                                           # sampler != trainer: w * L^clip
        surrogate = surrogate * tis_weights.detach().to(surrogate.dtype)
    per_token_loss = -surrogate
    with torch.no_grad():
        policy_loss = aggregate_loss(per_token_loss, mask, loss_type, num_sequences, num_tokens,
                                     max_completion_length)

    if ref_logprobs is not None and kl_coef != 0.0:
        kl = k3_kl(new_logprobs, ref_logprobs)                            # [N, T]
        kl_term = kl * ratio if kl_bias_correction else kl                # ratio [N, T] or [N, 1]
        per_token_loss = per_token_loss + kl_coef * kl_term
        approx_kl = _masked_mean(kl.detach(), mask)
    else:
        approx_kl = torch.zeros((), dtype=new_logprobs.dtype)
    loss = aggregate_loss(per_token_loss, mask, loss_type, num_sequences, num_tokens, max_completion_length)

    with torch.no_grad():
        r = ratio.expand_as(mask)
        a = adv.expand_as(mask)
        low = ((r < 1.0 - clip_eps) & (a < 0)).to(mask.dtype)            # clip active on the low side
        high = ((r > 1.0 + eps_high) & (a > 0)).to(mask.dtype)           # clip active on the high side
        metrics = {
            "loss": loss.detach(),
            "policy_loss": policy_loss,
            "approx_kl": approx_kl,
            "mean_ratio": _masked_mean(r, mask),
            "clip_ratio_low": _masked_mean(low, mask),
            "clip_ratio_high": _masked_mean(high, mask),
            "clip_ratio": _masked_mean(low + high, mask),
        }
    return loss, metrics


def truncated_is_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                         level: str = "token",
                         cap: float = 2.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance weights that correct for sampling with another engine (module docstring).

    The tokens were drawn from pi_sampler (e.g. vLLM, other kernels and precision), but the surrogate
    assumes pi_old. Weighting each token's policy term by pi_old / pi_sampler removes that bias; capping
    the weight at C bounds its variance.

    Args:
        old_logprobs: [N, T] log pi_old under the trainer (no grad).
        sampler_logprobs: [N, T] log-probs the sampler returned with the tokens.
        mask: [N, T] 1 on valid completion tokens.
        level: "token" (one weight per token) or "sequence" (the product over the completion, one weight).
        cap: C >= 1.

    Returns:
        (weights [N, T] for token or [N, 1] for sequence, metrics): tis/mean_weight is the mean weight
        over valid tokens, tis/clipped_frac the share of valid tokens whose weight hit the cap.
    """
    mask = mask.to(old_logprobs.dtype)
    log_ratio = (old_logprobs.detach() - sampler_logprobs.to(old_logprobs.dtype)) * mask   # [N, T]
    if level == "token":
        raw = torch.exp(log_ratio)                                                        # [N, T]
    elif level == "sequence":
        raw = torch.exp(log_ratio.sum(-1, keepdim=True))                                  # [N, 1]
    else:
        raise ValueError(f"tis_level must be token or sequence, got {level!r}")
    weights = torch.clamp(raw, max=cap)
    with torch.no_grad():
        metrics = {"tis/mean_weight": _masked_mean(weights.expand_as(mask), mask),
                   "tis/clipped_frac": _masked_mean((raw > cap).to(mask.dtype).expand_as(mask), mask)}
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
