"""The explicit-matmul attention of the training passes (grpokit.fast.small_attention) against SDPA."""

import pytest
import torch
import torch.nn.functional as F

from grpokit import switch
from grpokit.fast import small_attention
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout.groups import sample_groups


def _inputs(dtype, B=3, Hq=6, Hk=2, Tq=5, Tk=9, D=8):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, h, t, D, dtype=dtype, requires_grad=True)
               for h, t in ((Hq, Tq), (Hk, Tk), (Hk, Tk)))
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)[None, None].repeat(B, 1, 1, 1)
    mask[1, :, :, :3] = False                                            # row 1: a left-padded prompt
    return q, k, v, mask


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_attention_and_its_gradients_equal_sdpa(dtype, tol):
    q, k, v, mask = _inputs(dtype)
    g = torch.randn(3, 6, 5, 8, dtype=dtype)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = small_attention.attention(q, k, v, mask, 8 ** -0.5)
    assert got.dtype == dtype and torch.allclose(got.float(), want.float(), atol=tol)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
        assert torch.allclose(a.float(), b.float(), atol=tol * 4)


def test_a_fully_masked_row_gives_no_nan():
    q, k, v, mask = _inputs(torch.float32)
    mask[0, :, 2] = False                                                # one query sees nothing
    out = small_attention.attention(q, k, v, mask, 0.3)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()


def test_it_applies_only_under_autograd_on_small_scores(monkeypatch):
    q, k, v, mask = _inputs(torch.float32)
    assert small_attention._applies(q, k, v, mask, 0.0, {})
    assert not small_attention._applies(q, k, v, mask, 0.1, {})                          # dropout
    assert not small_attention._applies(q, k, v, mask.float(), 0.0, {})                  # additive mask
    assert not small_attention._applies(q, k, v, mask, 0.0, {"softcap": 30.0})
    assert not small_attention._applies(q, k, v, None, 0.0, {})                          # Tq != Tk, no mask
    with torch.no_grad():
        assert not small_attention._applies(q, k, v, mask, 0.0, {})                      # sampling, reference
    monkeypatch.setattr(small_attention, "MAX_SCORES", 3 * 6 * 5 * 9 - 1)
    assert not small_attention._applies(q, k, v, mask, 0.0, {})                          # one score too many


def test_installed_touches_this_model_only_and_no_global_entry():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model, other = build_model("tiny")[0], build_model("tiny")[0]
    before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    with small_attention.installed(model):
        assert model.config._attn_implementation == small_attention.NAME
        assert other.config._attn_implementation == "sdpa"                # another model: untouched
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before                  # the global entry: untouched
        with small_attention.installed(model):                            # nested: nothing more
            assert model.config._attn_implementation == small_attention.NAME
    assert model.config._attn_implementation == "sdpa" and ALL_ATTENTION_FUNCTIONS["sdpa"] is before


def test_a_training_pass_through_it_equals_the_plain_one():
    """per_token_logprobs of a batch with shared prompts, and every weight's gradient, the same inside
    `switch.accelerated` (small attention on) and outside it, and the small attention really ran."""
    model, tok = build_model("small", mean_length=6)
    model.train()
    torch.manual_seed(0)
    r = sample_groups(model, tok, bench_prompts(2), 3, 12, backend="generate")
    T = r.completion_ids.shape[1]
    weights = torch.randn(r.completion_ids.shape)

    def grads(lp):
        model.zero_grad(set_to_none=True)
        (lp * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = per_token_logprobs(model, r.input_ids, r.attention_mask, T)
    g_plain = grads(plain)
    calls = []
    real = small_attention.attention
    with switch.accelerated(model):
        small_attention.attention = lambda *a: calls.append(1) or real(*a)
        try:
            got = per_token_logprobs(model, r.input_ids, r.attention_mask, T)
        finally:
            small_attention.attention = real
    assert calls, "the small attention did not run"
    assert torch.allclose(got, plain, atol=1e-5)
    for a, b in zip(grads(got), g_plain):       # float32 rounding, relative to each gradient's scale
        assert torch.allclose(a, b, atol=1e-5 * max(1.0, float(b.abs().max())))
