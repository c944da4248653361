"""[E] Which tokens the policy term trains on, beyond the completion mask: two optional filters.

    high_entropy_mask   keep a token iff H_t >= q-quantile of H over the valid tokens, q = 1 - rho
                        "Beyond the 80/20 rule" (Wang et al., arXiv 2506.01939): the policy gradient of the
                        top-rho highest-entropy ("forking") tokens carries the learning; rho = 0.2
                        recommended.
                        (TRL's top_entropy_quantile is rho.)
    off_policy_mask     drop completion i iff A_i < 0 and 1/|o_i| sum_t (logp_sampler - logp_new) > delta
                        DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556): a negative sample that
                        the current policy has drifted far from teaches noise, not a correction.

Both are pure, return masks (bool [N, T] and float [N, 1]) and take no gradient.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """Tokens whose entropy is at least the `quantile` quantile of the valid tokens' entropies.

    Args:
        entropy: [N, T] per-token entropy of the policy (>= 0).
        mask: [N, T] 1 on valid completion tokens.
        quantile: q in [0, 1] (1 - top_entropy_quantile): 0 keeps every valid token, 1 only the highest.

    Returns:
        bool [N, T], never True on a padding token; all False when there is no valid token.
    """
    valid = mask.bool()
    values = entropy[valid].float()
    if values.numel() == 0:
        return torch.zeros_like(entropy, dtype=torch.bool)
    threshold = torch.quantile(values, quantile)                         # linear interpolation, as numpy
    return ((entropy * mask.to(entropy.dtype)) >= threshold) & valid


@torch.no_grad()
def off_policy_mask(advantages: torch.Tensor, new_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                    mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (module docstring): 1 keep, 0 drop. [N, 1]

    Args:
        advantages: [N, 1] (or [N]) advantages.
        new_logprobs: [N, T] log pi_theta (its gradient is not used).
        sampler_logprobs: [N, T] log-probs of the policy that sampled the tokens (the vLLM engine's, else
            the old policy's); NaN (a token the sampler could not score) counts as no drift.
        mask: [N, T] valid tokens.
        threshold: delta, the largest mean per-token drift a negative sample may have.
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    drift = torch.nan_to_num(sampler_logprobs - new_logprobs.detach(), nan=0.0)          # [N, T]
    m = mask.to(drift.dtype)
    mean_drift = (drift * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)  # [N, 1]
    return ((adv >= 0) | (mean_drift <= threshold)).to(m.dtype)
