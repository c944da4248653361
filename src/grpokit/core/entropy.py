"""[E] The entropy bonus and its adaptive coefficient, pure functions.

    L = L_policy - c * H,   H = sum_t H_t m_t / sum_t m_t      the mean per-token entropy of the tokens the
                                                               policy term trains on (m: the completion mask
                                                               times the high-entropy mask when one is used)

H is the same mean for every loss type (it is not rescaled like the policy term's aggregation), so c
means the same thing under grpo, dapo or luspo. With micro-batches, each one's mean is weighted by its
share of the batch (TRL: 1 / gradient_accumulation_steps).

Adaptive control (Skywork-OR1, He et al., arXiv 2505.22312), once per optimizer step, from the step's
token-weighted mean entropy H_step over the same tokens:

    c <- min(c + d, c_max)  if H_step <= H_target,   c <- max(c - d, c_min)  otherwise
    the bonus applied during a step is c if the previous step's H <= H_target, else 0 (no bonus before
    a first measurement)

TRL 1.16's entropy_coef, use_adaptive_entropy, entropy_coef_delta / _min / _max and entropy_target.
"""

from __future__ import annotations

import torch


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, coef: float, scale: float = 1.0) -> torch.Tensor:
    """c * H * scale: the term subtracted from the loss (module docstring), with H's gradient.

    Args:
        entropy: [N, T] per-token entropy of the policy, with gradient.
        mask: [N, T] the tokens the bonus acts on.
        coef: c (0 gives a zero tensor).
        scale: this call's share of the batch (1 / micro-batches).
    """
    m = mask.to(entropy.dtype)
    return coef * scale * (entropy * m).sum() / m.sum().clamp(min=1.0)


def applied_entropy_coef(coef: float, last_entropy: float, target: float, adaptive: bool) -> float:
    """The coefficient a step applies: c, or under adaptive control c only while H_prev <= H_target."""
    if not adaptive:
        return coef
    return coef if last_entropy <= target else 0.0


def next_entropy_coef(coef: float, step_entropy: float, *, target: float, delta: float, coef_min: float,
                      coef_max: float) -> float:
    """Adaptive control after an optimizer step: c + d up to c_max below the target, else c - d down to
    c_min."""
    if step_entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)
