"""[E] The per-token policy term of each loss type, before aggregation: the named switch `policy_term`.

With r the importance ratio exp(logp_new - logp_old) (per token [N, T], or one per completion [N, 1] at
importance_sampling_level "sequence"), A the advantage, logp = log pi_theta(o_t | q, o_<t) with its
gradient and sg[.] a stop-gradient:

    clip   (grpo, bnpo, dr_grpo, dapo, luspo)
           -min(r' A, clip(r, 1 - eps_low, 1 + eps_high) A),  r' = min(r, delta) when delta is set
           PPO's clipped surrogate, DeepSeekMath eq. 3; delta: INTELLECT-2 (arXiv 2505.07291). The loss
           types of this family differ only in how `aggregate_loss` averages the tokens.
    cispo  -sg[min(r, eps_max)] A logp
           CISPO, MiniMax-M1 (arXiv 2506.13585): the importance weight is clipped, not the update, so every
           token keeps a gradient (eps_max is `epsilon_high`, ScaleRL recommends 5).
    sapo   -(4 / tau) sigmoid(tau (r - 1)) A,   tau = tau_pos if A > 0 else tau_neg
           SAPO (arXiv 2511.20347): a smooth, temperature-controlled gate instead of the hard clip; its
           gradient 4 sigmoid'(tau (r - 1)) r A grad(logp) equals the unclipped one at r = 1 and fades away
           from it.
    vespo  -sg[phi(w)] A logp,   phi(w) = exp(lam + k log w - lam w)  (= w^k e^{lam (1 - w)}, phi(1) = 1)
           w = prod_t r_t over the completion (times the sampler correction when given), log w clamped to
           [log 1e-8, 20]; (k, lam) = (k_pos, lam_pos) if A >= 0 else (k_neg, lam_neg).
           VESPO (arXiv 2602.10693): a Gamma-shaped weight on the sequence ratio replaces the clip.

Every function is pure; the constants' defaults are TRL 1.16's.
"""

from __future__ import annotations

import math
import typing

import torch

from grpokit.config.choices import LossType

LOSS_TYPES = typing.get_args(LossType)  # declared once in grpokit.config.choices (the config field's type)
CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")   # the clipped surrogate; they differ in aggregation
LOG_W_MIN, LOG_W_MAX = math.log(1e-8), 20.0               # VESPO's clamp of the sequence log-ratio


class Variants(typing.NamedTuple):
    """The constants of the non-clipped loss types (TRL 1.16's defaults)."""

    sapo_temperature_pos: float = 1.0   # tau for A > 0
    sapo_temperature_neg: float = 1.05  # tau for A <= 0
    vespo_k_pos: float = 2.0            # power of w for A >= 0
    vespo_lambda_pos: float = 3.0       # decay of w for A >= 0
    vespo_k_neg: float = 3.0            # power of w for A < 0
    vespo_lambda_neg: float = 2.0       # decay of w for A < 0


def clipped_term(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float,
                 delta: float | None = None) -> torch.Tensor:
    """-min(r' A, clip(r, 1 - eps_low, 1 + eps_high) A); ratio [N, T] or [N, 1], adv [N, 1] or [N, T]."""
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    unclipped = torch.clamp(ratio, max=delta) if delta is not None else ratio
    return -torch.min(unclipped * adv, clipped * adv)


def cispo_term(ratio: torch.Tensor, adv: torch.Tensor, logprobs: torch.Tensor,
               eps_max: float) -> torch.Tensor:
    """-sg[min(r, eps_max)] A logp: REINFORCE on logp weighted by the clipped, detached ratio. [N, T]"""
    return -torch.clamp(ratio, max=eps_max).detach() * adv * logprobs


def sapo_term(ratio: torch.Tensor, adv: torch.Tensor, tau_pos: float, tau_neg: float) -> torch.Tensor:
    """-(4 / tau) sigmoid(tau (r - 1)) A with tau chosen by the sign of A (A > 0: tau_pos)."""
    tau = torch.where(adv > 0, tau_pos, tau_neg)
    return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv


@torch.no_grad()
def vespo_weights(adv: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor,
                  sampler_ratio: torch.Tensor | None, v: Variants) -> torch.Tensor:
    """phi(w) of VESPO (module docstring), detached. [N, 1] for outcome advantages [N, 1].

    Args:
        adv: [N, 1] (or [N, T]) advantages; their sign picks (k, lam).
        log_ratio: [N, T] per-token logp_new - logp_old (clamped to [-20, 20] before the sum).
        mask: [N, T] valid tokens.
        sampler_ratio: [N, T] per-token pi_old / pi_sampler weights (vLLM token modes), or None.
        v: the constants.
    """
    log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)            # [N, 1]
    if sampler_ratio is not None:
        log_w = log_w + torch.clamp(torch.log(sampler_ratio), LOG_W_MIN, LOG_W_MAX).sum(-1, keepdim=True)
    log_w = torch.clamp(log_w, LOG_W_MIN, LOG_W_MAX)
    nonneg = adv >= 0
    k = torch.where(nonneg, v.vespo_k_pos, v.vespo_k_neg)
    lam = torch.where(nonneg, v.vespo_lambda_pos, v.vespo_lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def policy_term(loss_type: str, ratio: torch.Tensor, adv: torch.Tensor, logprobs: torch.Tensor,
                log_ratio: torch.Tensor, mask: torch.Tensor, *, eps_low: float, eps_high: float,
                delta: float | None = None, variants: Variants = Variants(),
                sampler_ratio: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The named switch: the per-token policy loss of `loss_type` (module docstring) and its own metrics.

    Args:
        ratio: [N, T] or [N, 1] importance ratio at the chosen level, with gradient.
        adv: [N, 1] or [N, T] advantages.
        logprobs: [N, T] log pi_theta with gradient (cispo, vespo).
        log_ratio: [N, T] per-token logp_new - logp_old (vespo's sequence weight).
        mask: [N, T] valid tokens.
        eps_low, eps_high: the clip range (cispo: eps_high is its eps_max).
        delta: the clip family's bound on the unclipped ratio.
        variants: sapo and vespo constants.
        sampler_ratio: vespo only: [N, T] per-token sampler weights folded into w.

    Returns:
        (per-token loss [N, T] or [N, 1], metrics): cispo_clip_ratio (share of valid tokens with
        r > eps_max and A > 0) for cispo; vespo/phi_seq_mean (mean of phi over completions) for vespo;
        detached 0-d tensors.
    """
    if loss_type in CLIPPED:
        return clipped_term(ratio, adv, eps_low, eps_high, delta), {}
    if loss_type == "cispo":
        with torch.no_grad():
            hit = ((ratio > eps_high) & (adv > 0)).to(mask.dtype).expand_as(mask)
            share = (hit * mask).sum() / mask.sum().clamp(min=1.0)
        return cispo_term(ratio, adv, logprobs, eps_high), {"cispo_clip_ratio": share}
    if loss_type == "sapo":
        return sapo_term(ratio, adv, variants.sapo_temperature_pos, variants.sapo_temperature_neg), {}
    if loss_type == "vespo":
        phi = vespo_weights(adv, log_ratio, mask, sampler_ratio, variants)                # [N, 1]
        phi_mean = phi.mean() if phi.shape[-1] == 1 else (phi * mask).sum() / mask.sum().clamp(min=1.0)
        return -phi * adv * logprobs, {"vespo/phi_seq_mean": phi_mean}
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
