"""The training passes' C attention forward (grpokit.fast.attention): equal to PyTorch's SDPA in output and
gradients, used only where it applies, and transformers' registry restored after every pass."""

import pytest
import torch
import torch.nn.functional as F

from grpokit.fast import attention, native
from grpokit.model.testing import build_model
from grpokit.rollout.groups import sample_groups
from pass_checks import assert_same_pass, logprobs_and_grads

K = native.kernels()
needs_kernels = pytest.mark.skipif(K is None, reason="no C compiler could build grpokit's kernels")


def _mask(B, L, S, pads):
    """Causal with the queries at the end of the keys (a completion pass on a cached prompt), each row's
    first pads[b] keys masked (left padding)."""
    m = torch.ones(B, L, S, dtype=torch.bool).tril(S - L)
    for b, p in enumerate(pads):
        m[b, :, :p] = False
    return m


@needs_kernels
@pytest.mark.parametrize("H,Hkv,hd", [(4, 2, 32), (6, 2, 24), (4, 4, 64), (3, 1, 128)])
@pytest.mark.parametrize("L,S", [(9, 17), (1, 5), (20, 20), (70, 75)])  # 70: two whole 32-query blocks + 6
def test_forward_and_gradients_equal_sdpa(lib, H, Hkv, hd, L, S):
    # every query sees a key
    _check_against_sdpa(lib, H, Hkv, hd, _mask(3, L, S, [0, min(2, S - L), min(3, S - L)]))


@needs_kernels
@pytest.mark.parametrize("H,Hkv,hd", [(4, 2, 32), (6, 3, 40)])
def test_gradients_equal_sdpa_for_any_mask(lib, H, Hkv, hd):
    """Not causal: each query attends a random set of keys (its last one anywhere), across query blocks."""
    torch.manual_seed(hd)
    B, L, S = 2, 45, 50
    mask = torch.rand(B, L, S) < 0.3
    mask[torch.arange(B)[:, None], torch.arange(L), torch.randint(0, S, (B, L))] = True
    _check_against_sdpa(lib, H, Hkv, hd, mask)


def _check_against_sdpa(lib, H, Hkv, hd, mask):
    B, L, S = mask.shape
    torch.manual_seed(H * L)
    # q as transformers has it: a transposed view
    base = torch.randn(B, L, H, hd)
    q = base.transpose(1, 2).requires_grad_()
    k, v = torch.randn(B, Hkv, S, hd, requires_grad=True), torch.randn(B, Hkv, S, hd, requires_grad=True)
    out = attention.KernelAttention.apply(q, k, v, mask, hd ** -0.5, lib)  # [B, L, H, hd]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4)


@needs_kernels
def test_logprobs_and_gradients_equal_the_sdpa_pass(monkeypatch):
    """per_token_logprobs on the bench model (left-padded prompts of different lengths, shared-prompt pass):
    the kernel runs once per layer and the log-probs and every gradient equal SDPA's."""
    model, tok = build_model("tiny")
    r = sample_groups(model, tok, ["1+2=", "12+30=", "7*8 is", "9"], 3, 12, suppress_eos=True)
    ids, att = torch.cat([r.prompt_ids, r.completion_ids],
                         1), torch.cat([r.prompt_mask, r.completion_mask], 1)
    assert bool((r.prompt_mask == 0).any())                               # some left padding
    calls = []
    apply = attention.KernelAttention.apply
    monkeypatch.setattr(attention.KernelAttention, "apply", lambda *a: calls.append(1) or apply(*a))
    with attention.kernel_attention(model):                              # what fast.accelerated enters
        got = logprobs_and_grads(model, ids, att, 12)
    assert len(calls) == model.config.num_hidden_layers                   # the completion pass of every layer
    want = logprobs_and_grads(model, ids, att, 12)                        # the plain path
    assert_same_pass(got, want)


@needs_kernels
def test_only_where_it_applies_and_registry_restored():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model, _ = build_model("tiny")
    before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    q, k = torch.randn(2, 4, 3, 32), torch.randn(2, 2, 5, 32)
    mask = _mask(2, 3, 5, [0, 1])[:, None]
    ok = dict(query=q, key=k, value=k, mask=mask, dropout=0.0, kwargs={})
    assert attention._usable(K, **ok)
    assert not attention._usable(K, **{**ok, "mask": None})               # no mask: transformers' causal path
    assert not attention._usable(K, **{**ok, "dropout": 0.1})
    assert not attention._usable(K, **{**ok, "query": q.double(), "key": k.double(), "value": k.double()})
    assert not attention._usable(K, **{**ok, "mask": mask.float()})      # additive masks: not this kernel
    empty = mask.clone()
    empty[0, 0, 1] = False                                                # a query that attends nothing
    assert not attention._usable(K, **{**ok, "mask": empty})
    with attention.kernel_attention(model):
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not before
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    with pytest.raises(RuntimeError), attention.kernel_attention(model):
        raise RuntimeError("a failing pass")
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    with attention.kernel_attention(model.to(torch.bfloat16)):           # not float32: nothing is swapped
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
