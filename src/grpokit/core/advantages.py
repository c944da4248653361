"""[C] Group-relative advantages: each completion is compared with its own group, no critic.

Outcome supervision (DeepSeekMath eq. 3 context):
    A_i = (r_i - mean(r_group)) / std(r_group)        scale_rewards = "group" (the paper)
    A_i = (r_i - mean(r_group)) / std(r_batch)        scale_rewards = "batch"
    A_i =  r_i - mean(r_group)                        scale_rewards = "none"  (Dr. GRPO)
std is Bessel-corrected (torch's default). A group whose std < eps gets advantage exactly 0: all its
answers are equally good, so it carries no learning signal.

Rewards that are NaN mark completions excluded from scoring (a reward function returned None for
every function, or raised under reward_errors=skip): they are left out of their group's mean and std
and get advantage 0.

Several reward functions (multi_objective_aggregation):
    sum_then_normalize   r_i = sum_k w_k r_{i,k}, then the formulas above          (`group_advantages`)
    normalize_then_sum   GDPO (arXiv 2601.05242), `decoupled_advantages`:
                         z_{i,k} = (r_{i,k} - mean_group(r_k)) / (std_group(r_k) + eps),
                         s_i = sum_k w_k z_{i,k},
                         A_i = (s_i - mean_batch(s)) / (std_batch(s) + eps)
                         each reward keeps its own scale inside the group, so one with a large range does not
                         drown the others.

Process supervision (DeepSeekMath section 4.1.3): see `process_advantages`. Tree rollouts: `tree_advantages`.
"""

from __future__ import annotations

import math
import typing
from typing import Sequence

import torch

from grpokit.config.choices import ScaleRewards

SCALE_MODES = typing.get_args(ScaleRewards)  # declared once in grpokit.config.choices


def _masked_group_stats(values: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and Bessel std per row of [num_groups, G] over the valid entries (std 0 if < 2 valid)."""
    n = valid.sum(-1)                                                     # [num_groups]
    v = torch.where(valid, values, torch.zeros_like(values))
    mean = v.sum(-1) / n.clamp(min=1)                                     # [num_groups]
    sq = torch.where(valid, (values - mean[:, None]) ** 2, torch.zeros_like(values)).sum(-1)
    std = torch.where(n > 1, (sq / (n - 1).clamp(min=1)).sqrt(), torch.zeros_like(mean))
    return mean, std


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-8,
                     scale_rewards: str = "group") -> torch.Tensor:
    """Group-normalized advantages.

    Args:
        rewards: [B*G] scalar reward per completion, the G completions of a prompt contiguous. NaN
            marks an excluded completion.
        group_size: G.
        eps: groups (or, for "batch", the batch) with std below eps get advantage 0.
        scale_rewards: "group" | "batch" | "none" (see the module docstring for the formulas).

    Returns:
        [B*G] advantages, 0 for excluded completions and for groups with std < eps.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
                         f"got shape {tuple(rewards.shape)}")
    if scale_rewards not in SCALE_MODES:
        raise ValueError(f"scale_rewards must be one of {SCALE_MODES}, got {scale_rewards!r}")
    r = rewards.float().view(-1, group_size)                              # [B, G]
    valid = ~torch.isnan(r)
    mean, std = _masked_group_stats(r, valid)                             # [B], [B]
    centred = r - mean[:, None]                                           # [B, G]
    group_std = std[:, None].expand_as(r)                                 # [B, G]
    if scale_rewards == "group":
        adv = centred / (group_std + eps)
    elif scale_rewards == "batch":
        _, batch_std = _masked_group_stats(r.reshape(1, -1), valid.reshape(1, -1))
        adv = centred / (batch_std + eps)
    else:
        adv = centred
    # A group of equal rewards has no signal: exact zeros, not eps-sized noise.
    adv = torch.where(valid & (group_std >= eps), adv, torch.zeros_like(adv))
    return adv.reshape(-1)


def _nan_mean_std(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and Bessel std over `dim` ignoring NaN (keepdim); std is NaN with fewer than 2 values."""
    n = (~torch.isnan(x)).sum(dim, keepdim=True)
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True) * n / (n - 1).clamp(min=1)
    return mean, torch.where(n > 1, var.sqrt(), torch.full_like(var, float("nan")))


def decoupled_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, group_size: int,
                         eps: float = 1e-4) -> torch.Tensor:
    """GDPO's normalize-then-sum advantages (module docstring), as TRL 1.16 computes them.

    Args:
        rewards_per_func: [B*G, K] raw score of each reward function, NaN where it returned None.
        weights: [K] reward weights.
        group_size: G.
        eps: added to both standard deviations (TRL's 1e-4).

    Returns:
        [B*G] advantages; 0 for a completion no function scored.
    """
    N, K = rewards_per_func.shape
    r = rewards_per_func.float().view(-1, group_size, K)                  # [B, G, K]
    mean_k, std_k = _nan_mean_std(r, dim=1)                               # [B, 1, K]
    z = (r - mean_k) / (std_k + eps)                                      # NaN where unscored
    summed = (z * weights.float().view(1, 1, K)).nansum(-1).view(N)       # [N]
    summed[torch.isnan(rewards_per_func).all(-1)] = float("nan")
    mean, std = _nan_mean_std(summed, dim=0)
    return torch.nan_to_num((summed - mean) / (std + eps), nan=0.0)


def process_advantages(step_rewards: Sequence[Sequence[tuple[int, float]]], group_size: int,
                       completion_length: int, eps: float = 1e-8) -> torch.Tensor:
    """Process-supervision advantages (DeepSeekMath section 4.1.3).

    Completion i has steps j ending at token index(j) with reward r_i^j. Every step reward of a group
    is normalized by the mean and std of all step rewards in that group:
        r~_i^j = (r_i^j - mean(R_group)) / std(R_group)
    and each token's advantage is the sum of the normalized rewards of the steps ending at or after it:
        A_{i,t} = sum_{index(j) >= t} r~_i^j

    Args:
        step_rewards: per completion (B*G of them), a list of (end_token_index, reward) pairs.
        group_size: G.
        completion_length: T, the width of the returned tensor.
        eps: a group whose step-reward std is below eps gets advantages 0.

    Returns:
        [B*G, T] per-token advantages.
    """
    n = len(step_rewards)
    if n % group_size:
        raise ValueError(f"got {n} completions, not a multiple of group_size={group_size}")
    adv = torch.zeros(n, completion_length)
    for g0 in range(0, n, group_size):
        rows = range(g0, g0 + group_size)
        values = torch.tensor([float(r) for i in rows for _, r in step_rewards[i]])
        if values.numel() < 2:
            continue
        mean, std = values.mean(), values.std()
        if std < eps:
            continue
        for i in rows:
            for end, r in step_rewards[i]:
                end = min(int(end), completion_length - 1)
                adv[i, : end + 1] += (float(r) - mean) / std
    return adv


def tree_advantages(rewards: torch.Tensor, widths: Sequence[int], branch_at: Sequence[int],
                    completion_length: int, eps: float = 1e-8, scale_rewards: str = "group") -> torch.Tensor:
    """The segment term of tree rollouts' advantages (`grpokit.rollout.tree`), added to the outcome one.

    A group's G leaves are the rows of a tree (widths w_0..w_D, G = prod w; leaves below a node
    contiguous); depth d's tokens are the columns [b_d, b_{d+1}) (b_0 = 0, b_{D+1} = T). A node's value
    is the mean reward of the leaves below it, V(n) = mean_{i under n} r_i. Leaf i's token t in depth
    d's segment (its node n_d, whose parent is n_{d-1}) gets

        A_{i,t} = A_i + (V(n_d) - V(n_{d-1})) / s        for d >= 1 (a branch inside the completion)
        A_{i,t} = A_i                                    for d = 0  (the root's split is the group itself)

    where A_i is the leaf's outcome advantage (`group_advantages`, the same s) and s the group's reward
    std (scale_rewards=group), the batch's (batch) or 1 (none); this function returns the second term,
    [B*G, T], for `train_step` to add to A_i as it adds process advantages (section 4.1.3). The segment
    term credits the choice made at a branch against its siblings: the w_d children of a node, sharing
    everything before it, differ only in their own segments. Summed over the leaves below a node it is
    |n_d| (V(n_d) - V(n_{d-1})) / s, zero over any node's children together. A tree of widths [G, 1, ...]
    (no branch inside a completion) has V(n_d) = V(n_{d-1}) = r_i for d >= 1: the term is 0, flat GRPO.
    NaN rewards (unscored) are left out of node means; a group with std < eps, or a node with no scored
    leaf, gets 0.
    """
    G = math.prod(widths)
    if rewards.dim() != 1 or rewards.numel() % G:
        raise ValueError(f"rewards must be 1-D with a multiple of the tree's {G} leaves, "
                         f"got shape {tuple(rewards.shape)}")
    r = rewards.float().view(-1, G)                                       # [B, G]
    valid = ~torch.isnan(r)
    _, std = _masked_group_stats(r, valid)                                # [B]
    if scale_rewards == "batch":
        _, batch_std = _masked_group_stats(r.reshape(1, -1), valid.reshape(1, -1))
        scale = batch_std.expand_as(std)
    else:
        scale = std if scale_rewards == "group" else torch.ones_like(std)

    def node_values(block: int) -> torch.Tensor:                          # [B, G]: each leaf's node value
        v = torch.where(valid, r, torch.zeros_like(r)).view(-1, G // block, block).sum(-1)
        n = valid.view(-1, G // block, block).sum(-1)
        mean = torch.where(n > 0, v / n.clamp(min=1), torch.full_like(v, float("nan")))
        return mean.repeat_interleave(block, -1)

    adv = torch.zeros(r.shape[0], G, completion_length)                   # [B, G, T]
    cuts = [0, *(min(int(b), completion_length) for b in branch_at), completion_length]
    for d in range(1, len(widths)):
        here, parent = G // math.prod(widths[:d + 1]), G // math.prod(widths[:d])
        delta = torch.nan_to_num((node_values(here) - node_values(parent)) / (scale[:, None] + eps))
        adv[:, :, cuts[d]:cuts[d + 1]] = delta[:, :, None]
    adv[std < eps] = 0.0                                                  # no signal in the group
    return adv.view(-1, completion_length)
