"""[E-F] the per-token GRPO objective, against hand numbers, a plain loop and gradcheck."""

import math

import pytest
import torch

from grpokit.core.loss import grpo_objective_from_logprobs, k3_kl


def test_token_ratios_clip_per_token_not_per_sequence():
    ratios = torch.tensor([[1.1, 0.9, 1.5]])
    old = torch.zeros(1, 3)
    new = ratios.log()
    mask = torch.ones(1, 3)
    _, m = grpo_objective_from_logprobs(new, old, None, mask, torch.tensor([1.0]), clip_eps=0.2, kl_coef=0.0)
    clipped = torch.clamp(ratios, 0.8, 1.2)
    assert torch.allclose(clipped, torch.tensor([[1.1, 0.9, 1.2]]))
    # A sequence-level product would be one ratio 1.1 * 0.9 * 1.5 = 1.485 (then clipped to 1.2 as a whole).
    assert math.isclose(float(ratios.prod()), 1.485, rel_tol=1e-6)
    # With A = +1 the objective is min(r, clip(r)) per token: mean(1.1, 0.9, 1.2) = 1.0667.
    assert float(m["policy_loss"]) == pytest.approx(-(1.1 + 0.9 + 1.2) / 3, abs=1e-6)
    assert float(m["clip_ratio_high"]) == pytest.approx(1 / 3)


def test_k3_kl_properties():
    torch.manual_seed(0)
    new = torch.randn(1000)
    ref = torch.randn(1000)
    assert (k3_kl(new, ref) >= 0).all()
    assert torch.equal(k3_kl(new, new), torch.zeros(1000))
    d = torch.tensor([1e-3, -2e-3, 5e-3], dtype=torch.float64)
    assert torch.allclose(k3_kl(torch.zeros(3, dtype=torch.float64), d), d ** 2 / 2, rtol=1e-2)


def test_k3_monte_carlo_mean_matches_exact_kl():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64)      # policy
    q = torch.tensor([0.3, 0.3, 0.3, 0.1], dtype=torch.float64)      # reference
    exact = float((p * (p / q).log()).sum())
    samples = torch.multinomial(p, 20000, replacement=True, generator=g)
    est = k3_kl(p.log()[samples], q.log()[samples])
    se = float(est.std()) / math.sqrt(est.numel())
    assert abs(float(est.mean()) - exact) < 3 * se


def reference_loop(new, old, ref, mask, adv, eps, beta):
    """DeepSeekMath eq. 3 written element by element from the formula."""
    total, n_rows = 0.0, len(new)
    for i in range(n_rows):
        row_sum, n_tok = 0.0, 0
        for t in range(len(new[i])):
            if mask[i][t] == 0:
                continue
            r = math.exp(new[i][t] - old[i][t])
            a = adv[i]
            obj = min(r * a, min(max(r, 1 - eps), 1 + eps) * a)
            if ref is not None:
                d = ref[i][t] - new[i][t]
                obj -= beta * (math.exp(d) - d - 1)
            row_sum += obj
            n_tok += 1
        total += row_sum / n_tok if n_tok else 0.0
    return -total / n_rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_objective_equals_plain_loop_on_variable_lengths(seed):
    g = torch.Generator().manual_seed(seed)
    N, T = 6, 7
    new = torch.randn(N, T, generator=g) * 0.3 - 1
    old = new + torch.randn(N, T, generator=g) * 0.3
    ref = new + torch.randn(N, T, generator=g) * 0.2
    lengths = torch.tensor([7, 3, 1, 0, 5, 0])                       # two all-masked rows
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    adv = torch.randn(N, generator=g)
    loss, m = grpo_objective_from_logprobs(new, old, ref, mask, adv, 0.2, 0.04)
    want = reference_loop(new.tolist(), old.tolist(), ref.tolist(), mask.tolist(), adv.tolist(), 0.2, 0.04)
    assert torch.isfinite(loss)
    assert float(loss) == pytest.approx(want, abs=1e-5)
    assert all(torch.isfinite(v) for v in m.values())


def test_no_reference_or_zero_beta_skips_kl():
    new = torch.randn(2, 3)
    mask = torch.ones(2, 3)
    adv = torch.tensor([1.0, -1.0])
    a, ma = grpo_objective_from_logprobs(new, None, None, mask, adv)
    b, _ = grpo_objective_from_logprobs(new, None, new + 1, mask, adv, kl_coef=0.0)
    assert torch.equal(a, b)
    assert float(ma["approx_kl"]) == 0


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    N, T = 3, 4
    new = (torch.randn(N, T, generator=g, dtype=torch.float64) * 0.1).requires_grad_()
    old = new.detach() + 0.05 * torch.randn(N, T, generator=g, dtype=torch.float64)
    ref = new.detach() + 0.05 * torch.randn(N, T, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    fn = lambda x: grpo_objective_from_logprobs(x, old, ref, mask, adv, 0.2, 0.04)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (new,), eps=1e-6, atol=1e-5)


def test_kl_bias_correction_keeps_the_value_at_mu_1_and_adds_kl_times_dlogp_to_the_gradient():
    """TRL's use_bias_correction_kl: KL_t <- r_t * k3_t with r_t = exp(new - old) differentiable. At mu = 1
    (old = new.detach()) r = 1, so the loss is unchanged, but d(r k3)/d new = k3 + dk3/d new: per token the
    gradient gains k3 = exp(ref - new) - (ref - new) - 1 (hand-derived; advantages 0 isolate the KL term)."""
    new = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5]], dtype=torch.float64)
    mask, adv = torch.ones(1, 3, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    grads, losses = [], []
    for corrected in (False, True):
        loss, _ = grpo_objective_from_logprobs(new, None, ref, mask, adv, kl_coef=1.0,
                                               kl_bias_correction=corrected)
        (g,) = torch.autograd.grad(loss, new)
        grads.append(g)
        losses.append(loss.detach())
    d = ref - new.detach()
    k3 = torch.exp(d) - d - 1.0
    assert torch.equal(losses[0], losses[1])
    assert torch.allclose(grads[0], (1.0 - torch.exp(d)) / 3, atol=1e-12)       # plain: dk3/dnew / |o|
    assert torch.allclose(grads[1] - grads[0], k3 / 3, atol=1e-12)              # corrected: + k3 / |o|
    assert (grads[1] - grads[0]).abs().max() > 0.1


def test_per_token_weight_of_a_short_and_a_long_answer_by_loss_type():
    """The chapter's example: a 2-token and an 8-token answer with the same advantage. The grpo mean
    weighs each token of the short one 1/2 and of the long one 1/8 (times 1/N); dr_grpo, dapo and bnpo
    weigh every token the same (1 / (N * T_max), 1 / total tokens)."""
    mask = torch.zeros(2, 8)
    mask[0, :2] = 1
    mask[1, :] = 1
    expected = {"grpo": (1 / 2 / 2, 1 / 8 / 2), "dr_grpo": (1 / 16, 1 / 16), "dapo": (1 / 10, 1 / 10),
                "bnpo": (1 / 10, 1 / 10)}
    for loss_type, (short, long) in expected.items():
        lp = torch.full((2, 8), -1.0, requires_grad=True)
        loss, _ = grpo_objective_from_logprobs(lp, None, None, mask, torch.tensor([1.0, 1.0]), kl_coef=0.0,
                                               loss_type=loss_type, max_completion_length=8)
        loss.backward()
        grad = -lp.grad                                   # d objective / d log-prob of each token (ratio 1)
        assert torch.allclose(grad[0, :2], torch.full((2,), short)), loss_type
        assert torch.allclose(grad[1], torch.full((8,), long)), loss_type
        assert float(grad[0, 2:].abs().sum()) == 0.0      # padding gets nothing
