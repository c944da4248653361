"""The fused MLP under bf16 autocast (mixed precision): `SiluMulDown` gives autocast's eager results bit for
bit and keeps fewer bytes for backward."""

import torch
import torch.nn.functional as F

from grpokit.fast import fused_ops
from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout.groups import sample_groups


def _saved_bytes_and_out(fn):
    """(bytes of the distinct tensors autograd saves while fn() runs, fn's output); parameters excluded."""
    seen = {}

    def pack(t):
        if not (t.is_leaf and t.requires_grad):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def test_silu_mul_down_equals_eager_autocast_bit_for_bit():
    torch.manual_seed(0)
    x = torch.randn(3, 7, 24, requires_grad=True)
    w_gate, w_up = (torch.randn(40, 24, requires_grad=True) for _ in range(2))
    w_down = torch.randn(24, 40, requires_grad=True)
    leaves = (x, w_gate, w_up, w_down)

    def eager():
        return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)

    def fused():
        return fused_ops.SiluMulDown.apply(F.linear(x, w_gate), F.linear(x, w_up), w_down)

    d = torch.randn(3, 7, 24).bfloat16()
    results = []
    for fn in (eager, fused):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            saved, y = _saved_bytes_and_out(fn)
            grads = torch.autograd.grad(y, leaves, d)
        results.append((saved, y, grads))
    (saved_e, y_e, g_e), (saved_f, y_f, g_f) = results
    assert y_f.dtype == torch.bfloat16 and torch.equal(y_f, y_e)
    for a, b, leaf in zip(g_f, g_e, leaves):
        assert a.dtype == leaf.dtype == torch.float32 and torch.equal(a, b)
    # eager keeps gate, silu(gate), up and the product [3, 7, 40] in bf16, and down's bf16 cast [24, 40]
    # (which autocast's cache holds anyway); fused keeps gate, up and the float32 parameter itself
    assert saved_e - saved_f == 2 * 3 * 7 * 40 * 2 + 24 * 40 * 2


def test_model_under_autocast_equals_eager_with_less_saved(monkeypatch):
    """A whole tiny Qwen2 with the swaps, C kernels off so the norms are eager too: the logits and every
    parameter's gradient equal the unswapped model's under autocast exactly."""
    monkeypatch.setattr(fused_ops, "kernels", lambda: None)
    torch.manual_seed(0)
    model, tok = build_model("tiny")
    r = sample_groups(model, tok, bench_prompts(2), 2, 12)
    ids = torch.cat([r.prompt_ids, r.completion_ids], 1)
    att = torch.cat([r.prompt_mask, r.completion_mask], 1)
    calls = []
    apply = fused_ops.SiluMulDown.apply
    monkeypatch.setattr(fused_ops.SiluMulDown, "apply", lambda *a: calls.append(1) or apply(*a))

    def pass_():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            saved, logits = _saved_bytes_and_out(lambda: model(input_ids=ids, attention_mask=att).logits)
            logits.float().log_softmax(-1).mean().backward()
        return saved, logits, {n: p.grad.clone() for n, p in model.named_parameters()}

    with fused_ops.fused_ops(model):
        saved_f, logits_f, grads_f = pass_()
    assert len(calls) == model.config.num_hidden_layers
    saved_e, logits_e, grads_e = pass_()                                   # every forward restored: eager
    assert len(calls) == model.config.num_hidden_layers
    assert torch.equal(logits_f, logits_e)
    assert grads_f.keys() == grads_e.keys()
    assert all(torch.equal(grads_f[n], grads_e[n]) for n in grads_e)
    rows, hidden = ids.numel(), model.config.hidden_size
    inter = model.config.intermediate_size
    # per layer, bf16: silu(gate) and the product [rows, I] are not kept, nor down's cast [H, I] (autograd
    # saves the float32 parameter instead; autocast's cache holds the cast either way)
    per_layer = 2 * rows * inter * 2 + hidden * inter * 2
    assert saved_e - saved_f == model.config.num_hidden_layers * per_layer


def test_not_under_autocast_nothing_changes(monkeypatch):
    """In float32 (no autocast) `SiluMulDown` never runs."""
    monkeypatch.setattr(fused_ops.SiluMulDown, "apply", lambda *a: (_ for _ in ()).throw(AssertionError))
    model, _ = build_model("tiny")
    norm = model.model.layers[0].input_layernorm
    x = torch.randn(2, 5, model.config.hidden_size)
    with fused_ops.fused_ops(model):
        assert norm(x).dtype == torch.float32
        model(input_ids=torch.ones(1, 4, dtype=torch.long))


def test_silu_mul_down_with_a_frozen_down_weight():
    """A frozen down projection gets no gradient; gate and up get eager autocast's exactly."""
    torch.manual_seed(1)
    gate, up = (torch.randn(2, 5, 12, requires_grad=True) for _ in range(2))
    w_down = torch.randn(6, 12)
    d = torch.randn(2, 5, 6).bfloat16()
    grads = []
    eager = lambda g, u: F.linear(F.silu(g) * u, w_down)                  # noqa: E731
    fused = lambda g, u: fused_ops.SiluMulDown.apply(g, u, w_down)       # noqa: E731
    for fn in (eager, fused):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(gate.bfloat16(), up.bfloat16())
            grads.append(torch.autograd.grad(y, (gate, up), d))
    assert all(torch.equal(a, b) for a, b in zip(*grads))
