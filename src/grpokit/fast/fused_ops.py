"""The training passes' elementwise layers on the CPU in C: the gated MLP's product and RMSNorm.

Between a small model's matmuls, eager PyTorch runs many passes over [B, T, *] tensors, each bound by
memory traffic. Two C kernels per layer type (csrc/decode_kernels.c) replace them:

- Gated SiLU MLP, down(silu(gate(x)) * up(x)): eager runs silu and a multiply, and in backward two
  multiplies and silu's backward (five passes; it also saves silu(g)). `SiluMul` does one pass each way:
      h = g sigma(g) u,    du = dh g sigma(g),    dg = dh u sigma(g) (1 + g (1 - sigma(g)))
- RMSNorm, y = w * x r with r = 1 / sqrt(mean(x^2) + eps): eager runs six ops forward and about ten
  backward. `RMSNormFn` does one pass each way, saving x and r [rows]:
      dx = r g - x r^3 (g . x) / H  with g = w * dy,    dw = sum_rows dy * x r

Under 16-bit autocast (bf16 mixed precision: float32 weights, bf16 matmuls) the MLP saves memory instead,
bit-identical to autocast's eager path: `SiluMulDown`, down(silu(gate) * up) for a plain down projection,
saves gate and up only and recomputes silu(gate) * up in backward, where eager keeps gate, silu(gate), up
and the product (down's input): 93 MB fewer saved bytes a micro-batch of 504 rows on SmolLM2-135M.
Measured with the head's chunked gradient add (master_grads.ADD_ROWS), the bench step's peak RSS went
3882 -> 3818 MiB (2026-12-03, one run each; the norms' outputs cast once as well: 3798, but that sums
their readers' gradients in bf16, not float32, and was not kept).

The model's own modules stay in place (LoRA-wrapped projections included); `fused_ops(model)` swaps
only the forward of MLP and RMSNorm modules of known classes, for the duration of a
`grpokit.switch.accelerated` context, and restores it after. Results equal the eager ops to float32 rounding.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from grpokit.fast.native import DecodeKernels, float32_cpu, kernels

# Classes whose forward is exactly down_proj(act_fn(gate_proj(x)) * up_proj(x)).
MLP_CLASSES = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP", "OlmoMLP", "Olmo2MLP", "GraniteMLP",
               "SmolLM3MLP")
# Classes whose forward is exactly weight * (x.float() * rsqrt(mean(x^2) + variance_epsilon)).to(x.dtype).
RMSNORM_CLASSES = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm", "Olmo2RMSNorm",
                   "GraniteRMSNorm", "SmolLM3RMSNorm")


class SiluMul(torch.autograd.Function):
    """h = silu(gate) * up for gate, up [..., I] (float32, contiguous, same shape); C forward and backward."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, lib: DecodeKernels) -> torch.Tensor:
        width = gate.shape[-1]                                            # I
        n = gate.numel() // width
        out = torch.empty_like(gate)                                      # [..., I]
        lib.silu_mul_rows(gate, up, rows=n, width=width, inner=n, outer_stride=0, inner_stride=width, out=out)
        ctx.save_for_backward(gate, up)
        ctx.lib = lib
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        gate, up = ctx.saved_tensors
        width = gate.shape[-1]
        n = gate.numel() // width
        d_gate, d_up = torch.empty_like(gate), torch.empty_like(up)
        ctx.lib.silu_mul_rows_bwd(gate, up, d_out.contiguous(), rows=n, width=width, inner=n, outer_stride=0,
                                  inner_stride=width, d_gate=d_gate, d_up=d_up, d_stride=width)
        return d_gate, d_up, None


class GatedSiluMul(torch.autograd.Function):
    """h [A, N, I] = silu(gu[..., :I]) * gu[..., I:] for a fused projection gu [A, N, 2 I] (float32, last dim
    contiguous, any strides on the first two: the sampler's transposed record). Saves gu only, where
    eager autograd also keeps silu(gate), one more [A, N, I] per layer until backward; the gradient
    comes back as one [A, N, 2 I] tensor (no concatenation of two halves)."""

    @staticmethod
    def forward(ctx, gu: torch.Tensor, lib: DecodeKernels) -> torch.Tensor:
        A, N, I2 = gu.shape
        width = I2 // 2                                                   # I
        out = gu.new_empty(A, N, width)                                   # [A, N, I]
        lib.silu_mul_rows(gu[..., :width], gu[..., width:], rows=A * N, width=width, inner=N,
                          outer_stride=gu.stride(0), inner_stride=gu.stride(1), out=out)
        ctx.save_for_backward(gu)
        ctx.lib = lib
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        (gu,) = ctx.saved_tensors
        A, N, I2 = gu.shape
        width = I2 // 2                                                   # I
        d_gu = gu.new_empty(A, N, I2)                                     # [A, N, 2 I]
        ctx.lib.silu_mul_rows_bwd(gu[..., :width], gu[..., width:], d_out.contiguous(), rows=A * N,
                                  width=width, inner=N, outer_stride=gu.stride(0), inner_stride=gu.stride(1),
                                  d_gate=d_gu[..., :width], d_up=d_gu[..., width:], d_stride=I2)
        return d_gu, None


def silu_mul_halves(gu: torch.Tensor, act_fn: torch.nn.Module, lib: DecodeKernels | None) -> torch.Tensor:
    """act_fn(gate) * up for gu = [gate | up] [A, N, 2 I]: `GatedSiluMul` where it applies (SiLU, float32 on
    the CPU, the kernels built), else the eager ops."""
    if lib is not None and _is_silu(act_fn) and gu.dim() == 3 and gu.stride(-1) == 1 \
            and gu.device.type == "cpu" and gu.dtype == torch.float32:
        return GatedSiluMul.apply(gu, lib)
    gate, up = gu.chunk(2, -1)
    return act_fn(gate) * up


class RMSNormFn(torch.autograd.Function):
    """y = weight * x / sqrt(mean(x^2, -1) + eps) for x [..., H] (float32, contiguous), weight [H]."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, lib: DecodeKernels) -> torch.Tensor:
        H = x.shape[-1]
        n = x.numel() // H
        out, r = torch.empty_like(x), x.new_empty(n)                      # [..., H], [n]
        lib.rms_norm_fwd(x, weight, eps, out=out, rstd=r)
        ctx.save_for_backward(x, weight, r)
        ctx.lib = lib
        return out

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, r = ctx.saved_tensors
        dy = dy.contiguous()
        H = x.shape[-1]
        n = x.numel() // H
        parts = max(1, min(64, n))                                        # fixed row ranges: any thread count
        dx, dw = torch.empty_like(x), x.new_empty(parts, H)
        ctx.lib.rms_norm_bwd(x, weight, r, dy, parts=parts, dx=dx, dw_parts=dw)
        return dx, dw.sum(0), None, None


class SiluMulDown(torch.autograd.Function):
    """y = down(silu(gate) * up) = (silu(gate) * up) W^T for 16-bit gate, up [..., I] and W [H, I] under
    autocast (W's cast is autocast's, cached for the update). Saves gate, up and W itself (no copy);
    backward recomputes p = silu(gate) * up and casts W again, with the forward's ops, then, as eager:
        dW = dy^T p,   dp = dy W,   du = dp silu(gate),   dg = silu'(gate) (dp u)
    so the output and every gradient equal eager autocast's bit for bit; dW comes back in W's dtype."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up, weight)
        return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, weight)   # [..., H]

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        gate, up, weight = ctx.saved_tensors
        need_gate, need_up, need_w = ctx.needs_input_grad
        s = torch.nn.functional.silu(gate)                                # [..., I], as in forward
        dw = None
        if need_w:                                                        # [H, I] in the compute dtype
            dw = (dy.reshape(-1, dy.shape[-1]).t() @ (s * up).reshape(-1, s.shape[-1])).to(weight.dtype)
        dp = dy @ weight.to(gate.dtype)                                   # [..., I]
        d_gate = torch.ops.aten.silu_backward(dp * up, gate) if need_gate else None
        return d_gate, dp * s if need_up else None, dw


def _usable(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def _mlp_forward(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)                           # [..., I] each
    lib = kernels()                                                       # loaded by the first call
    if lib is not None and _usable(gate, up) and gate.shape == up.shape:
        return mlp.down_proj(SiluMul.apply(gate, up, lib))
    down = mlp.down_proj
    if _autocast_16bit(gate) and up.dtype == gate.dtype and type(down) is torch.nn.Linear \
            and down.bias is None and down.weight.dtype == torch.float32:
        return SiluMulDown.apply(gate, up, down.weight)
    return mlp.down_proj(mlp.act_fn(gate) * up)                           # what the class's forward computes


def _norm_forward(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    lib = kernels()
    if lib is not None and _usable(x, norm.weight) and norm.weight.shape == x.shape[-1:]:
        return RMSNormFn.apply(x, norm.weight, float(norm.variance_epsilon), lib)
    return type(norm).forward(norm, x)


def _autocast_16bit(x: torch.Tensor) -> bool:
    """Whether autocast is on for x's device with a 16-bit compute dtype."""
    kind = x.device.type
    return torch.is_autocast_enabled(kind) and \
        torch.get_autocast_dtype(kind) in (torch.bfloat16, torch.float16)


def _is_silu(act) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _swappable(m: torch.nn.Module) -> bool:
    name = type(m).__name__
    if "forward" in vars(m):                                              # set on the instance elsewhere
        return False
    if name in MLP_CLASSES:
        return _is_silu(getattr(m, "act_fn", None)) and all(
            isinstance(getattr(m, p, None), torch.nn.Module) for p in ("gate_proj", "up_proj", "down_proj"))
    return name in RMSNORM_CLASSES and isinstance(getattr(m, "weight", None), torch.Tensor) and \
        hasattr(m, "variance_epsilon")


@contextlib.contextmanager
def fused_ops(model: torch.nn.Module) -> Iterator[None]:
    """For the duration, the model's gated-SiLU MLPs (`MLP_CLASSES`) and RMSNorms (`RMSNORM_CLASSES`) run
    `SiluMul` and `RMSNormFn` where the kernels apply (float32 on the CPU), and `SiluMulDown` under
    16-bit autocast (module docstring); else nothing changes.
    Not for passes under activation checkpointing: the recompute runs later, with the class's forward."""
    swapped = [m for m in model.modules() if _swappable(m)] if float32_cpu(model) else []
    for m in swapped:       # the library is loaded by the first call (inside a pass), not here
        m.forward = functools.partial(_mlp_forward if type(m).__name__ in MLP_CLASSES else _norm_forward, m)
    ours = [(m, vars(m)["forward"]) for m in swapped]
    try:
        yield
    finally:
        for m, forward in ours:   # only ours: code inside may have put the class's own back (model.eval()
            if vars(m).get("forward") is forward:   # re-kernelizing a model with transformers' hub kernels)
                del m.forward
