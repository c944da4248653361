"""The objective variants, each against numbers derived by hand: the loss types' policy terms, the token
filters, the entropy bonus and its controller, GDPO's advantages and the masked IS weights."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.core.advantages import decoupled_advantages
from grpokit.core.entropy import applied_entropy_coef, entropy_bonus, next_entropy_coef
from grpokit.core.loss import Filters, aggregate_loss, grpo_objective_from_logprobs, truncated_is_weights
from grpokit.core.policy_terms import Variants, cispo_term, clipped_term, sapo_term, vespo_weights


def close(tensor: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(tensor.detach().float(), torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_clipped_term_and_delta():
    r = torch.tensor([[0.5, 1.0, 1.5]])
    # A = 1: min(r, clip(r)) = .5, 1, 1.2; A = -1: max(r, clip(r)) = .8, 1, 1.5, and 1.3 under delta = 1.3
    close(clipped_term(r, torch.ones(1, 1), 0.2, 0.2), [[-0.5, -1.0, -1.2]])
    close(clipped_term(r, -torch.ones(1, 1), 0.2, 0.2), [[0.8, 1.0, 1.5]])
    close(clipped_term(r, -torch.ones(1, 1), 0.2, 0.2, delta=1.3), [[0.8, 1.0, 1.3]])


def test_cispo_clips_the_weight_and_keeps_the_gradient():
    ratio = torch.tensor([[2.0, 0.5]], requires_grad=True)
    logp = torch.tensor([[-0.7, -0.2]], requires_grad=True)
    loss = cispo_term(ratio, torch.ones(1, 1), logp, eps_max=1.5)
    close(loss, [[1.5 * 0.7, 0.5 * 0.2]])  # -min(r, 1.5) * A * logp
    loss.sum().backward()
    close(logp.grad, [[-1.5, -0.5]])  # every token keeps a gradient
    assert ratio.grad is None or float(ratio.grad.abs().sum()) == 0  # none through the weight


def test_sapo_gate_at_ratio_one():
    r = torch.ones(1, 2, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    loss = sapo_term(r, adv, 1.0, 1.05)
    # -(4 / tau) sigmoid(0) A = -2 A / tau
    close(loss, [[-2.0, 2.0 / 1.05]])
    loss.sum().backward()
    close(r.grad, [[-1.0, 1.0]])  # the unclipped gradient -A at r = 1


def test_vespo_weight_is_one_on_policy_and_gamma_shaped_off():
    mask = torch.ones(2, 3)
    adv = torch.tensor([[1.0], [-1.0]])
    v = Variants()
    close(vespo_weights(adv, torch.zeros(2, 3), mask, None, v), [[1.0], [1.0]])
    log_ratio = torch.tensor([[math.log(2.0), 0.0, 0.0], [math.log(2.0), 0.0, 0.0]])  # w = 2
    phi = vespo_weights(adv, log_ratio, mask, None, v)
    # phi(w) = w^k e^{lam (1 - w)}: A >= 0: 4 e^-3; A < 0: 8 e^-2
    close(phi, [[4 * math.exp(-3)], [8 * math.exp(-2)]])


def test_luspo_sums_each_completions_tokens_then_averages():
    loss = torch.tensor([[1.0, 1.0, 9.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert float(aggregate_loss(loss, mask, "luspo")) == pytest.approx((2 + 6) / 2)


def test_entropy_bonus_is_c_times_the_mean_token_entropy():
    h = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert float(entropy_bonus(h, mask, 0.5)) == pytest.approx(0.5 * 2.0)  # (1 + 3 + 2) / 3
    new = torch.log(torch.full((2, 2), 0.5))
    loss, mets = grpo_objective_from_logprobs(
        new, None, None, mask, torch.zeros(2), loss_type="dapo", filters=Filters(entropy_coef=0.5), entropy=h
    )
    assert float(loss) == pytest.approx(-1.0) and float(mets["entropy_bonus"]) == pytest.approx(1.0)


def test_adaptive_entropy_coefficient():
    kw = dict(target=0.2, delta=0.05, coef_min=0.0, coef_max=0.12)
    assert next_entropy_coef(0.1, 0.1, **kw) == pytest.approx(0.12)  # below target: up, to the cap
    assert next_entropy_coef(0.1, 0.3, **kw) == pytest.approx(0.05)  # above: down
    assert next_entropy_coef(0.02, 0.3, **kw) == 0.0  # not below the floor
    assert applied_entropy_coef(0.1, math.inf, 0.2, adaptive=True) == 0.0  # no measurement yet: no bonus
    assert applied_entropy_coef(0.1, 0.1, 0.2, adaptive=True) == 0.1
    assert applied_entropy_coef(0.1, math.inf, 0.2, adaptive=False) == 0.1


def test_filters_drop_tokens_and_completions():
    new = torch.log(torch.full((2, 4), 0.25)).requires_grad_()
    mask = torch.ones(2, 4)
    h = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]])
    adv = torch.tensor([1.0, -1.0])
    loss, _ = grpo_objective_from_logprobs(
        new, None, None, mask, adv, loss_type="dapo", filters=Filters(top_entropy_quantile=0.25), entropy=h
    )
    (g,) = torch.autograd.grad(loss, new)
    assert (g != 0).tolist() == [[False] * 4, [False, False, True, True]]  # the top quarter: .7 .8
    sampler = new.detach() + torch.tensor([[2.0], [2.0]])  # drift 2 on both completions
    loss, _ = grpo_objective_from_logprobs(
        new,
        None,
        None,
        mask,
        adv,
        loss_type="dapo",
        filters=Filters(off_policy_threshold=1.0),
        sampler_logprobs=sampler,
    )
    (g,) = torch.autograd.grad(loss, new)
    assert (g != 0).any(-1).tolist() == [True, False]  # the negative one is dropped


def test_decoupled_advantages_by_hand():
    # group 1: reward 0 says 1 vs 3, reward 1 ties; group 2: reward 0 ties, reward 1 says 5 vs 1
    rewards = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 5.0], [2.0, 1.0]])
    adv = decoupled_advantages(rewards, torch.tensor([1.0, 2.0]), group_size=2, eps=0.0)
    s = torch.tensor([-1.0, 1.0, 2.0, -2.0]) / math.sqrt(2)  # weighted sums of the group z-scores
    assert adv.tolist() == pytest.approx((s / s.std()).tolist(), abs=1e-6)
    none = torch.tensor([[float("nan"), float("nan")], [1.0, 0.0], [2.0, 0.0], [4.0, 0.0]])
    assert decoupled_advantages(none, torch.ones(2), group_size=2)[0] == 0.0  # unscored: no signal


def test_is_weights_truncated_or_masked():
    old = torch.log(torch.tensor([[0.4, 1.0, 3.0]]))
    sampler = torch.zeros(1, 3)
    mask = torch.ones(1, 3)
    w, m = truncated_is_weights(old, sampler, mask, "token", 2.0, mode="truncate", floor=0.5)
    close(w, [[0.5, 1.0, 2.0]])
    w, m = truncated_is_weights(old, sampler, mask, "token", 2.0, mode="mask", floor=0.5)
    close(w, [[0.0, 1.0, 0.0]])
    assert float(m["tis/clipped_frac"]) == pytest.approx(2 / 3)
    w, _ = truncated_is_weights(old, sampler, mask, "sequence", 2.0, mode="mask")
    close(w, [[1.2]])  # 0.4 * 1 * 3, inside the bounds
