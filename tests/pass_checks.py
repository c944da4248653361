"""Shared by the training-kernel tests: one `per_token_logprobs` pass with its gradients, and the check
that two such passes agree."""

import torch

from grpokit.model.logprobs import per_token_logprobs


def logprobs_and_grads(model, ids, att, T):
    """Log-probs [B, T] and every parameter's gradient of a fixed random weighting of them."""
    model.zero_grad()
    lp = per_token_logprobs(model, ids, att, T)
    (lp * torch.randn(lp.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_pass(got: tuple, want: tuple) -> None:
    """Log-probs to 1e-5, each gradient to 1e-5 of its largest element (at least 1e-5)."""
    (lp, grads), (lp0, grads0) = got, want
    assert torch.allclose(lp, lp0, atol=1e-5)
    for n, g in grads0.items():
        assert torch.allclose(grads[n], g, atol=1e-5 * max(1.0, float(g.abs().max()))), n
