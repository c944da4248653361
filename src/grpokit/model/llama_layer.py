"""One Llama-family decoder layer in plain PyTorch, shared by the lean decoder and the reuse path.

    x = RMSNorm(h);  q, k, v = split(x W_qkv^T);  q, k = rotary(qk_norm(q, k))
    h = h + attend(q, k, v) W_o^T;  h = h + down(act(gate(RMSNorm(h))) * up(RMSNorm(h)))

The two callers differ only in where the projections come from and how attention sees the cache:
`grpokit.rollout.sampler.LeanDecoder` runs the matmuls and writes its own KV cache; `grpokit.fast.reuse`
reads the projections the sampler recorded and runs them under autograd. Both pass those two pieces in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with transformers' op order (float32 statistics), so results match bit for bit."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)                # one call, the same float32 math
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """[..., hd] -> [-sin_1, sin_2]: rotate_half(x) * sin == roll(x, hd/2) * signed_sin (one roll, no cat)."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], -1)


@dataclass(frozen=True)
class LayerSpec:
    """What a layer needs besides its projections: norms, head layout, attention scale, activation."""

    ln1: torch.Tensor                 # [H] input RMSNorm weight
    ln2: torch.Tensor                 # [H] post-attention RMSNorm weight
    q_norm: torch.Tensor | None       # [hd] Qwen3's per-head q/k RMSNorm weights, or None
    k_norm: torch.Tensor | None
    eps: float
    heads: int                        # nh query heads
    kv_heads: int                     # nkv key/value heads (nh % nkv == 0)
    head_dim: int                     # hd
    act: Callable[[torch.Tensor], torch.Tensor]

    @staticmethod
    def of(layer, config) -> LayerSpec:
        """The spec of a transformers Llama / Qwen2 / Qwen3 / Mistral decoder layer."""
        a = layer.self_attn
        return LayerSpec(ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                         q_norm=getattr(getattr(a, "q_norm", None), "weight", None),
                         k_norm=getattr(getattr(a, "k_norm", None), "weight", None),
                         eps=layer.input_layernorm.variance_epsilon, heads=config.num_attention_heads,
                         kv_heads=config.num_key_value_heads, head_dim=a.head_dim, act=layer.mlp.act_fn)


def gated_mlp_input(gu: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """act(gate) * up for the fused projection gu = [gate | up] [..., 2 I]."""
    gate, up = gu.chunk(2, -1)
    return act(gate) * up


def decoder_layer(h: torch.Tensor, spec: LayerSpec, *, project: Callable[[str, torch.Tensor], torch.Tensor],
                  cos: torch.Tensor, sin: torch.Tensor,
                  attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                  gated: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """h [n, L, H] -> h [n, L, H] through one pre-norm decoder layer.

    project(name, x): the output of projection "qkv" (q, k, v fused), "o", "gu" (gate, up fused) or
    "down" for input x. cos, sin: rotary tables broadcastable to [n, heads, L, hd] (sin signed, see
    `signed_sin`). attend(q [n, nh, L, hd], k, v [n, nkv, L, hd]) -> [n, nh, L, hd]: the caller adds the
    cached keys/values and the mask. gated(gu): act(gate) * up (default `gated_mlp_input`).
    """
    n, L, _ = h.shape
    nh, nkv, hd = spec.heads, spec.kv_heads, spec.head_dim
    x = rms_norm(h, spec.ln1, spec.eps)
    qkv = project("qkv", x).view(n, L, nh + 2 * nkv, hd).transpose(1, 2)  # [n, heads, L, hd]
    qk, v = qkv[:, :nh + nkv], qkv[:, nh + nkv:]
    if spec.q_norm is not None:
        q_n, k_n = rms_norm(qk[:, :nh], spec.q_norm, spec.eps), rms_norm(qk[:, nh:], spec.k_norm, spec.eps)
        qk = torch.cat([q_n, k_n], 1)
    qk = qk * cos + qk.roll(hd // 2, -1) * sin                            # rotary, q and k together
    att = attend(qk[:, :nh], qk[:, nh:], v)                               # [n, nh, L, hd]
    h = h + project("o", att.transpose(1, 2).reshape(n, L, nh * hd))
    gu = project("gu", rms_norm(h, spec.ln2, spec.eps))
    act = gated(gu) if gated is not None else gated_mlp_input(gu, spec.act)
    return h + project("down", act)
