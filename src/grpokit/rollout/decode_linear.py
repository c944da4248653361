"""The lean decoder's matmuls: y = x W^T + b on a weight packed once per sampling call for oneDNN.

`fused` builds one for projections that read the same input (q|k|v, gate|up), LoRA merged in; the
sampler (`grpokit.rollout.sampler.LeanDecoder`) calls them once per layer and decode step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpokit.model.lora import effective_linear

# Weights at least this large (in x out) run through oneDNN with the weight packed once per sampling
# call: at 8-64 rows per step, MKL's sgemm re-packs the weight on every call and reaches about half the
# rate of the packed kernel (docs/performance.md). Smaller matrices are faster through plain F.linear.
PACK_MIN_ELEMENTS = 512 * 512


class DecodeLinear:
    """y = x W^T + b for the decode loop: plain F.linear, or oneDNN on a weight packed for `rows` rows.

    The choice depends only on the weight's shape, dtype and device (never on timings), so a run
    repeats bit for bit; both paths agree to fp32 rounding (summation order).
    compute (bf16 mixed precision): W and b are kept as bf16 copies (packed for oneDNN the same way:
    1536 x 576 at 32 rows, 144 us packed vs 174 us plain bf16 vs 266 us packed fp32), x is cast down
    and y back up, so the decoder around the matmuls (and its fp32 C kernels) stays float32.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int,
                 compute: torch.dtype | None = None) -> None:
        if compute is not None:
            weight, bias = weight.detach().to(compute), None if bias is None else bias.detach().to(compute)
        self.weight, self.bias, self.packed, self.compute = weight, bias, None, compute
        if (weight.numel() >= PACK_MIN_ELEMENTS and weight.device.type == "cpu"
                and weight.dtype in (torch.float32, torch.bfloat16)
                and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)
            except (RuntimeError, AttributeError):                       # an older build without the op
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.compute is not None:
            return self._linear(x.to(self.compute)).float()
        return self._linear(x)

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def fused(*mods, rows: int, compute) -> DecodeLinear:
    """One DecodeLinear for projections that read the same input (q|k|v, gate|up), LoRA merged in."""
    pairs = [effective_linear(m) for m in mods]
    weight = torch.cat([w for w, _ in pairs]) if len(pairs) > 1 else pairs[0][0]
    bias = None if all(b is None for _, b in pairs) else \
        torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])
    return DecodeLinear(weight, bias, rows, compute)
