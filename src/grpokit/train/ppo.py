"""PPO with a critic: the baseline GRPO drops (DeepSeekMath section 4.1), kept small for comparison.

PPO learns a value model V_psi(q, o_<t) beside the policy and takes GAE advantages from it
(`loss.algorithm: ppo`; everything else - sampling, rewards, reference, clipped objective - is
GRPO's own code):

    r_t     = R_i * [t = last valid token]  (- beta * KL_t per token when loss.kl_in_reward)
    delta_t = r_t + gamma * V_{t+1} - V_t                      (V after the last token is 0)
    A_t     = delta_t + gamma * lam * A_{t+1}                  (GAE; gamma = lam = 1: A_t = R - V_t)
    ret_t   = A_t + V_t                                        (value targets)
    A_t    <- (A_t - mean A) / std A over the batch's valid tokens (whitening)

    L_pi    = the clipped surrogate with the k3 KL to pi_ref (loss.grpo_objective_from_logprobs)
    L_V     = 1/2 max((V - ret)^2, (V_old + clip(V - V_old, -c, c) - ret)^2), aggregated like L_pi
    loss    = L_pi + vf_coef * L_V                             (the two models have separate AdamW)

The value model is the policy's decoder (a trainable copy, initialised from the policy) with a
scalar head instead of the lm-head. Its weights, gradients, AdamW state and activations are the
memory GRPO saves; `grpokit.cli.membench` measures them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from grpokit import switch
from grpokit.config.schema import GRPOConfig
from grpokit.core.loss import grpo_objective_from_logprobs, k3_kl
from grpokit.core.ppo import clipped_value_loss, gae, terminal_rewards, whiten
from grpokit.model.logprobs import position_ids_from_mask
from grpokit.observe.metrics import PhaseTimer, length_stats, reward_stats, tensor_stats
from grpokit.rollout.groups import Rollout
from grpokit.train.collect import collect_batch
from grpokit.train.state import TrainState, make_optimizer
from grpokit.train.update import forward_logprobs, optimizer_step, rows_logprobs


class ValueModel(torch.nn.Module):
    """V_psi(q, o_<t): a copy of the policy's decoder and a linear scalar head on its hidden states."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(policy.get_decoder())   # initialised from the policy
        self.backbone.requires_grad_(True)
        hidden = policy.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            self.head.weight.normal_(0.0, getattr(policy.config, "initializer_range", 0.02))
            self.head.bias.zero_()
        self.head.to(device=next(self.backbone.parameters()).device,
                     dtype=next(self.backbone.parameters()).dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                completion_length: int) -> torch.Tensor:
        """Values of the states before each completion token. [B, T] float32.

        input_ids, attention_mask: [B, P + T], the layout of `Rollout.input_ids`; V_t is read off the
        hidden state that predicts completion token t (the same position as its log-prob).
        """
        T = completion_length
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids_from_mask(attention_mask))
        hidden = out.last_hidden_state[:, -T - 1:-1]                      # [B, T, H]
        return self.head(hidden).squeeze(-1).float()                      # [B, T]


@dataclass
class Critic:
    """The value model with its own optimizer and schedule (same optim settings as the policy)."""

    model: ValueModel
    optimizer: torch.optim.Optimizer
    scheduler: Any

    def step(self, max_grad_norm: float) -> float:
        """Clip and step; a non-finite gradient skips the update. Returns the gradient norm."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm or float("inf")))
        if torch.isfinite(torch.tensor(norm)):
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


def build_critic(policy: torch.nn.Module, cfg: GRPOConfig) -> Critic:
    """A value model initialised from `policy` (train mode) and its AdamW."""
    model = ValueModel(policy)
    model.train()
    optimizer, scheduler = make_optimizer(model, cfg)
    return Critic(model, optimizer, scheduler)


def critic_values(critic: Critic, rollout: Rollout, cfg: GRPOConfig) -> torch.Tensor:
    """[N, T] values with no autograd state, micro-batched like the reference forward."""
    N, T = rollout.completion_ids.shape
    mb = cfg.optim.micro_batch_size or N
    out = torch.zeros(N, T, device=rollout.completion_ids.device)
    with torch.inference_mode():
        for s in range(0, N, mb):
            out[s:s + mb] = critic.model(rollout.input_ids[s:s + mb], rollout.attention_mask[s:s + mb], T)
    return out.clone()


def ppo_update(state: TrainState, rollout: Rollout, advantages: torch.Tensor, returns: torch.Tensor, *,
               old_values: torch.Tensor, old_lp, ref_lp, loss_mask: torch.Tensor,
               timer: PhaseTimer) -> dict[str, float]:
    """mu updates of policy and value model over micro-batches with gradient accumulation."""
    cfg, lo = state.cfg, state.cfg.loss
    N, T_full = rollout.completion_ids.shape
    mb = cfg.optim.micro_batch_size or N
    bnpo_scale = 1.0 / ((N + mb - 1) // mb) if lo.loss_type == "bnpo" else 1.0
    num_tokens = float(loss_mask.sum())
    beta = 0.0 if lo.kl_in_reward else lo.beta
    norm = dict(num_sequences=N, num_tokens=num_tokens,
                max_completion_length=cfg.rollout.max_completion_length)
    token_metrics = ("approx_kl", "mean_ratio", "clip_ratio", "clip_ratio_low", "clip_ratio_high",
                     "value_clipfrac")
    out: dict[str, float] = {}
    for it in range(lo.num_iterations):
        sums: dict[str, torch.Tensor] = {}
        for s in range(0, N, mb):
            rows = slice(s, s + mb)
            new_lp, T = rows_logprobs(state.model, rollout, rows, cfg.rollout.temperature)
            m = loss_mask[rows, :T]
            pol_loss, mets = grpo_objective_from_logprobs(
                new_lp, None if old_lp is None else old_lp[rows, :T],
                None if ref_lp is None else ref_lp[rows, :T], m, advantages[rows, :T], lo.epsilon, beta,
                clip_eps_high=cfg.epsilon_high, delta=lo.delta,
                loss_type=lo.loss_type, importance_sampling_level=lo.importance_sampling_level,
                kl_bias_correction=lo.use_bias_correction_kl, **norm)
            values = state.critic.model(rollout.input_ids[rows], rollout.attention_mask[rows], T_full)[:, :T]
            vf_loss, vmets = clipped_value_loss(values, old_values[rows, :T], returns[rows, :T], m,
                                                lo.cliprange_value, loss_type=lo.loss_type, **norm)
            ((pol_loss + lo.vf_coef * vf_loss) * bnpo_scale).backward()
            for k, v in {**mets, **vmets}.items():
                sums[k] = sums.get(k, 0.0) + (v * m.sum() if k in token_metrics else v * bnpo_scale)
        with timer("optimizer"):
            grad_norm = optimizer_step(state)
            value_grad_norm = state.critic.step(cfg.optim.max_grad_norm)
        suffix = "" if it == 0 else f"/iter{it}"
        for k, v in sums.items():
            out[k + suffix] = float(v / max(num_tokens, 1.0)) if k in token_metrics else float(v)
        out["grad_norm" + suffix], out["value_grad_norm" + suffix] = grad_norm, value_grad_norm
    return out


def ppo_learn(state: TrainState, rollout: Rollout, rewards: torch.Tensor,
              timer: PhaseTimer) -> tuple[dict[str, float], torch.Tensor]:
    """Reference, values, GAE and the update for one scored rollout.

    rewards: [N] outcome rewards (NaN counts as 0). Returns (metrics, per-completion mean raw advantage [N]).
    """
    cfg, lo = state.cfg, state.cfg.loss
    loss_mask = rollout.completion_mask.float()                            # [N, T]
    if lo.mask_truncated_completions:
        loss_mask = loss_mask * (~rollout.truncated).float()[:, None]
    ref_lp = old_lp = None
    if state.ref_model is not None:
        with timer("ref_forward"):
            ref_lp = forward_logprobs(state.ref_model, rollout, cfg)
    if lo.num_iterations > 1 or (lo.kl_in_reward and ref_lp is not None):
        with timer("old_forward"):
            old_lp = forward_logprobs(state.model, rollout, cfg)
    with timer("value_forward"):
        old_values = critic_values(state.critic, rollout, cfg)             # [N, T]
    with timer("advantage"):
        token_r = terminal_rewards(rewards, loss_mask)                     # [N, T]
        if lo.kl_in_reward and ref_lp is not None:
            token_r = token_r - lo.beta * k3_kl(old_lp, ref_lp) * loss_mask
        raw_adv, returns = gae(token_r, old_values, loss_mask, lo.gamma, lo.lam)
        advantages = whiten(raw_adv, loss_mask)
    with timer("update"):
        upd = ppo_update(state, rollout, advantages, returns, old_values=old_values, old_lp=old_lp,
                         ref_lp=ref_lp, loss_mask=loss_mask, timer=timer)
    n_tok = loss_mask.sum().clamp(min=1)
    upd["value_mean"] = float((old_values * loss_mask).sum() / n_tok)
    upd["returns_mean"] = float((returns * loss_mask).sum() / n_tok)
    return upd, (raw_adv * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)


def ppo_train_step(state: TrainState, timer: PhaseTimer | None = None, tracker=None) -> dict[str, float]:
    """One PPO step on fresh generations: sample, score, reference, values, GAE, update, log."""
    timer = timer or PhaseTimer(cuda=next(state.model.parameters()).is_cuda)
    # the optional CPU speed-ups (grpokit.switch) for this step's passes, as in GRPO's train_step
    with switch.accelerated(state.model, state.cfg, world_size=state.dist.world_size, timer=timer):
        rollout, scores, correct, info = collect_batch(state, timer)
        upd, adv_flat = ppo_learn(state, rollout, scores.total, timer)
    state.step += 1
    metrics = {"step": state.step, **reward_stats(scores.total, correct, rollout.group_size),
               **{f"rewards/{k}": float(torch.nanmean(v)) for k, v in scores.per_func.items()},
               **tensor_stats("advantage", adv_flat),
               **length_stats(rollout.completion_mask, rollout.truncated, correct),
               **upd, **info, "reward_errors": float(scores.num_errors), "bad_steps": float(state.bad_steps),
               "learning_rate": state.scheduler.get_last_lr()[0],
               "completion_tokens": float(rollout.completion_mask.sum()),
               "input_tokens_seen": state.count_input_tokens(rollout)}
    if tracker is not None:
        tracker.observe(state.step, rollout, scores, adv_flat, correct)
    return metrics
