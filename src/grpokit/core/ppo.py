"""PPO's math, pure functions over tensors: GAE advantages, whitening and the clipped value loss.

The PPO baseline (`loss.algorithm: ppo`, the step in grpokit.train.ppo) computes, per token:

    r_t     = R_i * [t = last valid token]  (- beta * KL_t per token when loss.kl_in_reward)
    delta_t = r_t + gamma * V_{t+1} - V_t                      (V after the last token is 0)
    A_t     = delta_t + gamma * lam * A_{t+1}                  (GAE; gamma = lam = 1: A_t = R - V_t)
    ret_t   = A_t + V_t                                        (value targets)
    A_t    <- (A_t - mean A) / std A over the batch's valid tokens (whitening)
    L_V     = 1/2 max((V - ret)^2, (V_old + clip(V - V_old, -c, c) - ret)^2), aggregated like L_pi
"""

from __future__ import annotations

import torch

from grpokit.core.loss import aggregate_loss


def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Outcome reward placed on each completion's last valid token.

    rewards [N] (NaN = unscored, counted as 0), mask [N, T] (a prefix of ones) -> [N, T].
    """
    lengths = mask.sum(-1).long()                                         # [N]
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = (lengths > 0).nonzero().squeeze(-1)
    out[rows, lengths[rows] - 1] = torch.nan_to_num(rewards.float(), nan=0.0).to(mask.device)[rows]
    return out


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
       lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over each completion (module docstring).

    Args:
        token_rewards: [N, T] r_t.
        values: [N, T] V_t under the value model at sampling time.
        mask: [N, T] 1 on valid tokens (a prefix); V and A past the last valid token count as 0.
        gamma, lam: discount and GAE lambda.

    Returns:
        (advantages [N, T], returns [N, T] = A + V), both 0 on masked tokens.
    """
    mask = mask.to(values.dtype)
    N, T = values.shape
    adv = torch.zeros_like(values)                                        # [N, T]
    running = torch.zeros(N, dtype=values.dtype, device=values.device)    # A_{t+1}
    for t in reversed(range(T)):
        nxt = mask[:, t + 1] if t + 1 < T else torch.zeros_like(running)  # 1 where token t+1 is valid
        next_value = values[:, t + 1] * nxt if t + 1 < T else torch.zeros_like(running)
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * nxt * running
        adv[:, t] = running
    adv = adv * mask
    return adv, (adv + values) * mask


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the valid tokens of the whole batch; masked entries become 0. [N, T]"""
    m = mask.to(x.dtype)
    n = m.sum().clamp(min=1.0)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * m


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, cliprange_value: float, *, loss_type: str = "grpo",
                       num_sequences: float | None = None, num_tokens: float | None = None,
                       max_completion_length: int | None = None
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L_V = 1/2 max((V - ret)^2, (V_old + clip(V - V_old, -c, c) - ret)^2), aggregated by `loss_type`.

    values [N, T] (with grad), old_values / returns / mask [N, T]. Returns (loss, metrics) where
    metrics hold value_loss and value_clipfrac (share of valid tokens where the clipped branch wins).
    """
    clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped - returns) ** 2
    per_token = 0.5 * torch.max(loss_unclipped, loss_clipped)            # [N, T]
    loss = aggregate_loss(per_token, mask.to(values.dtype), loss_type, num_sequences, num_tokens,
                          max_completion_length)
    with torch.no_grad():
        m = mask.to(values.dtype)
        clipfrac = ((loss_clipped > loss_unclipped).to(m.dtype) * m).sum() / m.sum().clamp(min=1.0)
    return loss, {"value_loss": loss.detach(), "value_clipfrac": clipfrac}
