"""The lean decoder's whole decode step in one C call (`gk_decode_step`): every layer and the lm-head.

Used where no weight is packed for oneDNN (models below ~512 x 512 matrices): the Python loop over
layers costs ~25% of such a step, and MKL's sgemm re-packs every weight at every call at 32 rows.
The kernels come from `grpokit.fast.native`; the sampler reaches this through the one switch's scope
(`grpokit.fast.Scope.whole_step`).
"""

from __future__ import annotations

import ctypes

import torch

from grpokit.fast.native import DecodeDims, DecodeKernels

PANEL = 16   # output columns per packed panel (the C tile's width)


def pack_panels(W: torch.Tensor, k: DecodeKernels) -> torch.Tensor:
    """W [N, K] (float32, contiguous) -> [ceil(N/16), K, 16] with P[p, k, c] = W[16 p + c, k] (zero past N):
    gk_linear_packed's layout, in which a tile reads 16 output columns' weights for one k as one line."""
    N, K = W.shape
    out = W.new_empty(-(-N // PANEL), K, PANEL)
    k.pack_panels_into(W, out)
    return out


def pad_bias(b: torch.Tensor | None) -> torch.Tensor | None:
    """A bias [N] padded with zeros to a whole number of panels (the tile adds 16 at a time)."""
    if b is None:
        return None
    out = b.new_zeros(-(-b.shape[0] // PANEL) * PANEL)
    out[:b.shape[0]] = b
    return out


def _layer_tensors(w: dict) -> tuple:
    """A LeanDecoder layer's tensors in the order of gk_decode_step's per-layer pointers (the C enum
    GK_QKV_W ... GK_KN); None where there is no bias or no q/k norm."""
    return (w["qkv"].weight, w["qkv"].bias, w["o"].weight, w["o"].bias, w["gu"].weight, w["gu"].bias,
            w["down"].weight, w["down"].bias, w["ln1"], w["ln2"], w["q_norm"], w["k_norm"])


_MATRICES = (0, 2, 4, 6)   # positions in _layer_tensors of qkv, o, gu, down; each one's bias follows it


class WholeStep:
    """A LeanDecoder's decode step as one gk_decode_step call: every layer and the lm-head. The matmuls run
    on weights packed into 16-column panels here, once per sampling call, by the C tile (where the AVX2
    paths are compiled in), else by PyTorch's own sgemm. The rows are split over torch's threads, each
    running the whole step for its rows single-threaded (rows never interact in a decode step): one fork
    and join per step instead of one per operation. Built by `plan`, which returns None where the
    per-layer path must run."""

    def __init__(self, dec, k: DecodeKernels, rows: int) -> None:
        self.dec, self.k = dec, k
        w0 = dec.layers[0]
        self.I = w0["down"].weight.shape[1]
        # With the AVX2 tile, the matrices are packed once here (gk_linear_packed), not by MKL at every call.
        self.panels = k.vector_width == 8
        tensors = [t for w in dec.layers for t in (self._packed(w) if self.panels else _layer_tensors(w))]
        self.head_w, self.head_b = dec.head.weight, dec.head.bias
        if self.panels:
            self.head_w, self.head_b = pack_panels(self.head_w, k), pad_bias(self.head_b)
        self.tensors = tensors                                 # kept alive: the C side holds their addresses
        ptrs = [None if t is None else t.data_ptr() for t in tensors]
        self.ptrs = (ctypes.c_void_p * len(ptrs))(*ptrs)
        H, width = dec.embed.shape[1], (dec.nh + 2 * dec.nkv) * dec.hd
        self.work = dec.embed.new_empty(rows * (3 * H + width + dec.nh * dec.hd + 3 * self.I))

    def _packed(self, w: dict) -> list:
        """`_layer_tensors` with the four matrices packed into panels and their biases padded."""
        t = list(_layer_tensors(w))
        for i in _MATRICES:
            t[i], t[i + 1] = pack_panels(t[i], self.k), pad_bias(t[i + 1])
        return t

    @staticmethod
    def plan(dec, rows: int) -> WholeStep | None:
        """A WholeStep when the kernels and a checked sgemm are there, the MLP is SiLU-gated, no weight is
        packed for oneDNN (those run faster through it), every tensor is contiguous and every layer has
        the same attention scale; else None."""
        k = dec.native
        if k is None or not (k.whole_step or k.vector_width == 8) or not dec.silu \
                or dec.head.packed is not None:
            return None
        if getattr(dec, "compute", None) is not None:                     # bf16 matmuls: the C sgemm is fp32
            return None
        if any(w[name].packed is not None for w in dec.layers for name in ("qkv", "o", "gu", "down")) \
                or len({w["scale"] for w in dec.layers}) != 1:
            return None
        tensors = [t for w in dec.layers for t in _layer_tensors(w)] + [dec.embed, dec.final_norm,
                                                                        dec.head.weight, dec.head.bias]
        return WholeStep(dec, k, rows) if all(t is None or t.is_contiguous() for t in tensors) else None

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor, G: int) -> torch.Tensor:
        """The decoder's prefill as P one-call steps over the B prompt rows [B, P] (short prompts: ~20 PyTorch
        calls a layer cost more than P C calls), then each prompt's keys/values copied to its G cache rows.
        valid [B, P] bool (False: left padding), pos [B, P]. Returns the last position's logits [B, V]."""
        B, P = ids.shape
        for s in range(P):
            seen = valid.clone()
            seen[:, s] = True                                             # a pad sees itself: no empty row
            logits = self(ids[:, s].contiguous(), pos[:, s].contiguous(), s, seen)
        rows = torch.arange(B, device=ids.device).repeat_interleave(G)
        kv = self.dec.kv
        kv[:, :, :B * G, :, :P] = kv[:, :, rows, :, :P]                   # the gather copies before the write
        return logits

    def __call__(self, tok: torch.Tensor, pos: torch.Tensor, slot: int,
                 key_mask: torch.Tensor) -> torch.Tensor:
        """tok, pos [n] (int64), key_mask [n, >= slot + 1] -> logits [n, V]; writes the cache slot `slot`."""
        d, n = self.dec, tok.shape[0]
        head_w, head_b = self.head_w, self.head_b
        V, H = d.head.weight.shape
        tok, pos, key_mask = tok.contiguous(), pos.contiguous(), key_mask.contiguous()
        logits = head_w.new_empty(n, V)
        self.k.decode_step(layers=len(d.layers), weights=self.ptrs, final_norm=d.final_norm, head_w=head_w,
                           head_b=head_b, embed=d.embed, tok=tok,
                           dims=DecodeDims(H, self.I, d.nh, d.nkv, d.hd),
                           eps=d.eps, scale=d.layers[0]["scale"], pos=pos, cos=d.cos, sin=d.sin, kv=d.kv,
                           slot=slot, key_mask=key_mask, work=self.work, logits=logits,
                           threads=max(1, min(torch.get_num_threads(), n)), packed=self.panels)
        return logits
