"""The training passes' fused elementwise layers (grpokit.fast.fused_ops): silu(gate) * up and RMSNorm, and
their gradients, equal eager PyTorch's; the swap covers exactly the known classes, and every forward is
restored."""

import pytest
import torch
import torch.nn.functional as F

from grpokit.fast import fused_ops, native
from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout.groups import sample_groups
from pass_checks import assert_same_pass, logprobs_and_grads

needs_kernels = pytest.mark.skipif(native.kernels() is None,
                                   reason="no C compiler could build grpokit's kernels")


def _assert_same_values_and_grads(out, ref, inputs, rtol, atol):
    """out equals ref (rtol 1e-5, atol 1e-6); their input gradients for one random output gradient to
    (rtol, atol)."""
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6)
    d = torch.randn(out.shape)
    for a, b in zip(torch.autograd.grad(out, inputs, d), torch.autograd.grad(ref, inputs, d)):
        assert torch.allclose(a, b, rtol=rtol, atol=atol)


@needs_kernels
@pytest.mark.parametrize("shape", [(3, 7, 64), (5, 37), (1, 1, 1, 9)])   # 37, 9: lanes past the last 8
def test_silu_mul_and_gradients_equal_eager(lib, shape):
    torch.manual_seed(len(shape))
    # large |g|: both tails of the sigmoid
    gate = (3 * torch.randn(shape)).requires_grad_()
    up = torch.randn(shape, requires_grad=True)
    _assert_same_values_and_grads(fused_ops.SiluMul.apply(gate, up, lib), F.silu(gate) * up,
                                  (gate, up), 1e-5, 1e-6)


@needs_kernels
# True: the sampler's [L, N, 2I] record as [N, L, 2I]
@pytest.mark.parametrize("transposed", [False, True])
def test_gated_silu_mul_on_a_fused_projection(lib, transposed):
    torch.manual_seed(7)
    A, N, I_ = 3, 5, 21
    base = (3 * torch.randn((N, A, 2 * I_) if transposed else (A, N, 2 * I_))).requires_grad_()
    gu = base.transpose(0, 1) if transposed else base                     # [A, N, 2I]
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: sizes.append(x.numel()) or x, lambda x: x):
        out = fused_ops.silu_mul_halves(gu, torch.nn.SiLU(), lib)
    assert sizes == [A * N * 2 * I_]                                     # gu only: no silu(gate) kept
    gate, up = gu.chunk(2, -1)
    _assert_same_values_and_grads(out, F.silu(gate) * up, (base,), 1e-5, 1e-6)
    gelu = fused_ops.silu_mul_halves(gu, torch.nn.GELU(), lib)             # not SiLU: the eager product
    assert torch.allclose(gelu, F.gelu(gate) * up)


@needs_kernels
# 70 rows: more than 64 parts
@pytest.mark.parametrize("shape", [(3, 7, 64), (5, 37), (2, 3, 4, 24), (70, 9)])
def test_rmsnorm_and_gradients_equal_eager(lib, shape):
    torch.manual_seed(len(shape) + shape[-1])
    x = (2 * torch.randn(shape)).requires_grad_()
    w = (1 + 0.3 * torch.randn(shape[-1])).requires_grad_()
    eps = 1e-6
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))   # transformers' Llama/Qwen2 RMSNorm
    _assert_same_values_and_grads(fused_ops.RMSNormFn.apply(x, w, eps, lib), ref, (x, w), 1e-4, 1e-5)


@needs_kernels
def test_logprobs_and_gradients_equal_the_eager_layers(monkeypatch):
    torch.manual_seed(0)
    model, tok = build_model("tiny")
    r = sample_groups(model, tok, bench_prompts(2), 2, 12)
    ids, att = torch.cat([r.prompt_ids, r.completion_ids],
                         1), torch.cat([r.prompt_mask, r.completion_mask], 1)
    calls = {"mlp": 0, "norm": 0}
    mlp_apply, norm_apply = fused_ops.SiluMul.apply, fused_ops.RMSNormFn.apply
    monkeypatch.setattr(fused_ops.SiluMul, "apply",
                        lambda *a: calls.update(mlp=calls["mlp"] + 1) or mlp_apply(*a))
    monkeypatch.setattr(fused_ops.RMSNormFn, "apply",
                        lambda *a: calls.update(norm=calls["norm"] + 1) or norm_apply(*a))
    with fused_ops.fused_ops(model):                                     # what switch.accelerated enters
        got = logprobs_and_grads(model, ids, att, 12)
    layers = model.config.num_hidden_layers
    # the prompt pass and the completion pass
    expected = {"mlp": 2 * layers, "norm": 2 * (2 * layers + 1)}
    assert calls == expected
    assert not any("forward" in vars(m) for m in model.modules())         # every forward restored
    want = logprobs_and_grads(model, ids, att, 12)                        # the plain path
    assert calls == expected                                              # not called on the eager pass
    assert_same_pass(got, want)


@needs_kernels
def test_only_known_modules_and_forward_restored():
    model, _ = build_model("tiny")
    mlps = [m for m in model.modules() if type(m).__name__ == "Qwen2MLP"]
    norms = [m for m in model.modules() if type(m).__name__ == "Qwen2RMSNorm"]
    assert mlps and len(norms) == 2 * len(mlps) + 1
    with fused_ops.fused_ops(model):
        assert all("forward" in vars(m) for m in mlps + norms)
        assert not any("forward" in vars(m) for m in model.modules() if m not in mlps + norms)
    assert not any("forward" in vars(m) for m in mlps + norms)
    with pytest.raises(RuntimeError), fused_ops.fused_ops(model):
        raise RuntimeError("a failing pass")
    assert not any("forward" in vars(m) for m in mlps)
    # not SiLU: that module keeps its forward
    mlps[0].act_fn = torch.nn.GELU()
    hooked = mlps[1]
    # another library's instance-level forward
    hooked.forward = hooked.forward
    with fused_ops.fused_ops(model):
        assert "forward" not in vars(mlps[0]) and hooked.forward.__func__ is type(hooked).forward
        assert all("forward" in vars(m) for m in mlps[2:])
    # the other library's forward is left in place
    assert "forward" in vars(hooked)
    with fused_ops.fused_ops(model.to(torch.bfloat16)):                   # not float32: nothing is swapped
        assert not any("forward" in vars(m) for m in mlps[2:])


@needs_kernels
def test_non_contiguous_inputs_take_the_eager_ops(monkeypatch):
    model, _ = build_model("tiny")
    mlp = next(m for m in model.modules() if type(m).__name__ == "Qwen2MLP")
    norm = next(m for m in model.modules() if type(m).__name__ == "Qwen2RMSNorm")
    x = torch.randn(2, 5, model.config.hidden_size)
    mlp.up_proj.register_forward_hook(lambda mod, inp, out: out.transpose(0, 1).contiguous().transpose(0, 1))
    x_t = x.transpose(0, 1).contiguous().transpose(0, 1)                  # same values, not contiguous
    for fn in (fused_ops.SiluMul, fused_ops.RMSNormFn):
        monkeypatch.setattr(fn, "apply", lambda *a: pytest.fail("a kernel ran on a non-contiguous tensor"))
    with fused_ops.fused_ops(model):
        got, got_norm = mlp(x), norm(x_t)
    assert torch.allclose(got, type(mlp).forward(mlp, x), atol=1e-6)
    assert torch.allclose(got_norm, type(norm).forward(norm, x), atol=1e-6)
