"""grpokit's C kernels (`csrc/`), compiled on first use: the sampler's fused decode steps, and the
training passes' SiLU x up and RMSNorm (`fused_ops.py`).

Measured gain (benchmarks/fast_gains.py, 2026-12-02, 2 threads, fp32): the decode kernels off make a
step 1.25x slower on the demo, 1.63x on bench tiny, 1.09x on small; they do not run in bf16.

A decode step of a small model is bound by per-operation overhead: about 30 PyTorch calls per layer
at ~5-10 us each, several times the step's matmuls (docs/performance.md). decode_kernels.c replaces the
calls between the matmuls with fused kernels (residual + RMSNorm; q/k norm + rotary + cache write +
attention; SiLU(gate) * up), so a layer is 4 matmuls and 4 kernel calls; a fifth draws the tokens.
Where no weight is packed for oneDNN (models below ~512 x 512 matrices), `whole_step.WholeStep` runs the whole
step, matmuls included, in one C call: the matmuls go to the sgemm of the BLAS PyTorch links (checked
against F.linear when the library loads), which removes the per-layer Python work too.

The library is built once per machine with the system C compiler into the user cache
($GRPOKIT_CACHE, else $XDG_CACHE_HOME/grpokit, else ~/.cache/grpokit), keyed by the source, the
compiler and the CPU, then loaded with ctypes. No compiler, a failed build or GRPOKIT_NATIVE=0: the
sampler and the training passes run PyTorch ops instead (one log line); the paths agree to fp32
rounding. The training passes' C attention was removed on 2026-12-02: at 2 threads it paid 1.01-1.04x
(docs/performance.md, "What each speed-up pays").
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

log = logging.getLogger("grpokit")

_CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = tuple(_CSRC / name for name in ("decode_kernels.c", "whole_step.c"))
HEADERS = (_CSRC / "gk_common.h",)
# Tried in order: OpenMP needs -fopenmp (not every compiler has it); -march=native is not universal.
# Reassociation lets the compiler vectorize the kernels' sums; no -ffinite-math (the masks use -inf).
_COMMON = ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
           "-fno-signed-zeros"]
FLAG_SETS = (["-march=native", "-fopenmp"], ["-march=native"], [])
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "gk_add_rms": [_P, _P, _P, _F, _I, _I, _P],
    "gk_rope_attend": [_P, _P, _P, _P, _P, _P, _F, _P, _P, _I, _I, _P, _I, _I, _I, _I, _I, _F, _P],
    "gk_rope_attend_prefix": [_P, _P, _P, _P, _P, _P, _F, _P, _P, _I, _I, _P, _I, _I, _I, _I, _I, _F, _P,
                              _P, _P, _I, _P],
    "gk_sample": [_P, _I, _I, _F, _P, ctypes.c_int, _P, _P],
    "gk_silu_mul": [_P, _P, _I, _I, _I, _I, _I, _P],
    "gk_silu_mul_bwd": [_P, _P, _I, _I, _I, _P, _I, _I, _P, _P, _I],
    "gk_rms_fwd": [_P, _P, _F, _I, _I, _P, _P],
    "gk_rms_bwd": [_P, _P, _P, _P, _I, _I, _I, _P, _P],
    "gk_set_sgemm": [_P],
    "gk_vector_width": [],
    "gk_linear": [_P, _I, _I, _P, _P, _I, _P],
    "gk_decode_step": [_I, _P, _P, _P, _P, _I, _P, _P, _I, _I, _I, _I, _I, _I, _F, _F, _P, _P, _P, _P, _I, _I,
                       _I, _P, _I, _P, _P, _I, _I],
    "gk_linear_packed": [_P, _I, _I, _P, _P, _I, _P],
    "gk_pack_panels": [_P, _I, _I, _P],
}
_loaded: DecodeKernels | None | bool = False      # False: not tried yet


class DecodeDims(NamedTuple):
    """A decoder's sizes, as `DecodeKernels.decode_step` takes them."""

    hidden: int          # H
    intermediate: int    # I, the MLP width
    heads: int           # nh
    kv_heads: int        # nkv
    head_dim: int        # hd


def _ptr(t: torch.Tensor | None) -> int | None:
    """A tensor's data address for a C pointer argument (None: NULL)."""
    return None if t is None else t.data_ptr()


def cache_dir() -> Path:
    root = os.environ.get("GRPOKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "grpokit")
    return Path(root)


def cpu_id() -> str:
    """What -march=native depends on: the CPU's feature flags where Linux lists them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(out_dir: Path | None = None) -> Path | None:
    """Compile the kernels (or find them already built); the library's path, or None when no build works."""
    cc = compiler()
    if cc is None or not all(f.is_file() for f in SOURCES + HEADERS):    # no compiler, or no csrc/ installed
        return None
    src = b"\0".join(f.read_bytes() for f in SOURCES + HEADERS)
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30,
                                 check=False).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        return None                                                       # CC names no runnable compiler
    out_dir = out_dir or cache_dir()
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([src, " ".join(flags + _COMMON).encode(), str(version).encode(),
                                         cpu_id().encode()])).hexdigest()[:16]
        lib = out_dir / f"decode_kernels-{key}.so"
        if lib.is_file():
            return lib
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)    # then renamed: racing builds are safe
            os.close(fd)
            proc = subprocess.run([cc, *_COMMON, *flags, *map(str, SOURCES), "-o", tmp, "-lm"],
                                  capture_output=True, text=True, timeout=120, check=False)
            if proc.returncode == 0:
                os.replace(tmp, lib)
                return lib
            os.unlink(tmp)
        except (OSError, subprocess.SubprocessError):
            continue
    return None


class DecodeKernels:
    """ctypes bindings of the kernels, one typed method each; shapes are checked by the caller (`LeanDecoder`,
    `WholeStep`, `fused_ops`). Tensors are float32 (int64 for ids, positions),
    contiguous unless a stride argument says otherwise; outputs are written in place."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        for name, args in _SIGNATURES.items():
            getattr(lib, name).argtypes = args
            getattr(lib, name).restype = None
        self.lib = lib
        lib.gk_vector_width.restype = ctypes.c_int
        self.vector_width = lib.gk_vector_width()  # 8: the AVX2 paths are compiled in; 1: plain C
        self.whole_step = _hand_over_sgemm(lib)   # False: no usable BLAS symbol, the per-layer path only

    def silu_mul_rows(self, gate: torch.Tensor, up: torch.Tensor, *, rows: int, width: int, inner: int,
                      outer_stride: int, inner_stride: int, out: torch.Tensor) -> None:
        """out [rows, width] = silu(gate) * up. Row r of gate and up starts (r // inner) * outer_stride +
        (r % inner) * inner_stride floats after their first element (gate and up may be two halves of one
        fused [gate | up] tensor: pass the two views)."""
        self.lib.gk_silu_mul(_ptr(gate), _ptr(up), inner, outer_stride, inner_stride, rows, width, _ptr(out))

    def silu_mul_rows_bwd(self, gate: torch.Tensor, up: torch.Tensor, d_out: torch.Tensor, *, rows: int,
                          width: int, inner: int, outer_stride: int, inner_stride: int, d_gate: torch.Tensor,
                          d_up: torch.Tensor, d_stride: int) -> None:
        """Backward of `silu_mul_rows` from d_out [rows, width]; row r of d_gate and d_up at r * d_stride."""
        self.lib.gk_silu_mul_bwd(_ptr(gate), _ptr(up), inner, outer_stride, inner_stride, _ptr(d_out), rows,
                                 width, _ptr(d_gate), _ptr(d_up), d_stride)

    def rms_norm_fwd(self, x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor,
                     rstd: torch.Tensor) -> None:
        """out [..., H] = weight * x * rstd, rstd [rows] = 1 / sqrt(mean(x^2) + eps) (kept for backward)."""
        H = x.shape[-1]
        self.lib.gk_rms_fwd(_ptr(x), _ptr(weight), eps, x.numel() // H, H, _ptr(out), _ptr(rstd))

    def rms_norm_bwd(self, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, *,
                     parts: int, dx: torch.Tensor, dw_parts: torch.Tensor) -> None:
        """dx [..., H] and dw_parts [parts, H] (partial sums over fixed row ranges; sum them) from dy."""
        H = x.shape[-1]
        self.lib.gk_rms_bwd(_ptr(x), _ptr(weight), _ptr(rstd), _ptr(dy), x.numel() // H, H, parts, _ptr(dx),
                            _ptr(dw_parts))

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *,
               out: torch.Tensor) -> None:
        """out [M, N] = x [M, K] W[N, K]^T + b through the handed-over sgemm."""
        (M, K), N = x.shape, weight.shape[0]
        self.lib.gk_linear(_ptr(x), M, K, _ptr(weight), _ptr(bias), N, _ptr(out))

    def linear_packed(self, x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, *, n_out: int,
                      out: torch.Tensor) -> None:
        """out [M, n_out] = x [M, K] W^T + b with W in `pack_panels` layout and b padded (`pad_bias`)."""
        M, K = x.shape
        self.lib.gk_linear_packed(_ptr(x), M, K, _ptr(panels), _ptr(bias), n_out, _ptr(out))

    def decode_step(self, *, layers: int, weights: ctypes.Array, final_norm: torch.Tensor,
                    head_w: torch.Tensor, head_b: torch.Tensor | None, embed: torch.Tensor, tok: torch.Tensor,
                    dims: DecodeDims, eps: float, scale: float, pos: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, kv: torch.Tensor, slot: int, key_mask: torch.Tensor,
                    work: torch.Tensor, logits: torch.Tensor, threads: int, packed: bool) -> None:
        """One decode step of every layer and the lm-head for tok [n] at positions pos [n]: logits [n, V].

        weights: each layer's tensors in `_layer_tensors` order (pointers); kv [layers, 2, R, nkv, S, hd]
        (slot `slot` written); key_mask [n, >= slot + 1] (uint8/bool); work: scratch (see whole_step.c);
        threads: row ranges run in parallel; packed: the matrices are in `pack_panels` layout."""
        n, V = logits.shape
        d = dims
        self.lib.gk_decode_step(layers, weights, _ptr(final_norm), _ptr(head_w), _ptr(head_b), V, _ptr(embed),
                                _ptr(tok), n, d.hidden, d.intermediate, d.heads, d.kv_heads, d.head_dim, eps,
                                scale, _ptr(pos), _ptr(cos), _ptr(sin), _ptr(kv), kv.shape[2], kv.shape[4],
                                slot, _ptr(key_mask), key_mask.stride(0), _ptr(work), _ptr(logits), threads,
                                int(packed))

    def pack_panels_into(self, weight: torch.Tensor, out: torch.Tensor) -> None:
        """out [ceil(N/16), K, 16] = W [N, K] in panels (see `pack_panels`)."""
        N, K = weight.shape
        self.lib.gk_pack_panels(_ptr(weight), N, K, _ptr(out))

    def add_rms(self, h: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float,
                out: torch.Tensor) -> None:
        """h [n, H] += y [n, H] (in place; y None: no add); out [n, H] = RMSNorm(h) * weight."""
        n, H = h.shape
        self.lib.gk_add_rms(_ptr(h), _ptr(y), _ptr(weight), eps, n, H, _ptr(out))

    def rope_attend(self, qkv: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float, kv: torch.Tensor,
                    slot: int, key_mask: torch.Tensor, heads: int, scale: float, out: torch.Tensor,
                    prefix: torch.Tensor | None = None, prefix_row: torch.Tensor | None = None) -> None:
        """qkv [n, (heads + 2 kv_heads) hd]; key_mask [n, >= slot + 1] bool; out [n, heads hd] = attention
        over slots 0..slot. kv [2, n, kv_heads, S, hd]: each row's own cache, slot `slot` written; or, with
        prefix [2, B, kv_heads, P, hd] (slots 0..P-1 of each prompt) and prefix_row [n] (each row's prompt),
        the slots from P on, slot `slot` - P written."""
        _, n, nkv, S, hd = kv.shape
        args = (_ptr(qkv), _ptr(pos), _ptr(cos), _ptr(sin), _ptr(q_norm), _ptr(k_norm), eps, _ptr(kv[0]),
                _ptr(kv[1]), S, slot, _ptr(key_mask), key_mask.stride(0), n, heads, nkv, hd, scale, _ptr(out))
        if prefix is None:
            self.lib.gk_rope_attend(*args)
        else:
            self.lib.gk_rope_attend_prefix(*args, _ptr(prefix[0]), _ptr(prefix[1]), prefix.shape[3],
                                           _ptr(prefix_row))

    def silu_mul(self, gu: torch.Tensor) -> torch.Tensor:
        """gu [n, 2 I] = [gate | up] -> silu(gate) * up [n, I]."""
        n, I2 = gu.shape
        out = gu.new_empty(n, I2 // 2)
        # gk_silu_mul(gate, up, inner, outer_stride, inner_stride, rows, width, out): rows I2 floats apart
        self.lib.gk_silu_mul(_ptr(gu[:, :I2 // 2]), _ptr(gu[:, I2 // 2:]), n, 0, I2, n, I2 // 2, _ptr(out))
        return out

    def sample(self, logits: torch.Tensor, temperature: float,
               greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row of logits [n, V] (float32, contiguous) from softmax(z / temperature), or the
        argmax; returns (tokens [n], log-probs [n] of the tempered distribution). Draws n uniforms from
        torch's generator (none when greedy), as `grpokit.rollout.sampling.sample_categorical` does."""
        n, V = logits.shape
        u = None if greedy else torch.rand(n)
        tok, lp = torch.empty(n, dtype=torch.long), torch.empty(n)
        self.lib.gk_sample(_ptr(logits), n, V, temperature, _ptr(u), int(greedy), _ptr(tok), _ptr(lp))
        return tok, lp


def _blas_sgemm() -> int | None:
    """Address of the Fortran sgemm_ in the BLAS PyTorch links (MKL in the x86 wheels), or None."""
    lib_dir = Path(torch.__file__).resolve().parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        try:
            return ctypes.cast(ctypes.CDLL(str(lib_dir / name)).sgemm_, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


def _hand_over_sgemm(lib: ctypes.CDLL) -> bool:
    """Give the kernels PyTorch's sgemm, then check it on odd shapes with a bias against F.linear (a BLAS
    that does not compute it right leaves the per-layer path in charge)."""
    fn = _blas_sgemm()
    if fn is None:
        return False
    lib.gk_set_sgemm(fn)
    g = torch.Generator().manual_seed(0)
    x, W, b = torch.randn(5, 7, generator=g), torch.randn(3, 7, generator=g), torch.randn(3, generator=g)
    y = torch.full((5, 3), float("nan"))
    lib.gk_linear(x.data_ptr(), 5, 7, W.data_ptr(), b.data_ptr(), 3, y.data_ptr())
    with torch.autocast("cpu", enabled=False):   # first loaded inside a bf16 region: the check stays fp32
        return bool(torch.allclose(y, torch.nn.functional.linear(x, W, b), atol=1e-5))


def kernels() -> DecodeKernels | None:
    """The loaded kernels, built on first call; None when GRPOKIT_NATIVE=0 or no build works."""
    global _loaded
    if _loaded is False:
        _loaded = None
        if os.environ.get("GRPOKIT_NATIVE", "1") != "0":
            path = build()
            if path is None:
                log.info("sampler: could not build the decode kernels in %s (needs a C compiler, `cc` or "
                         "$CC, and a writable %s; set GRPOKIT_CACHE to another folder); decoding with "
                         "PyTorch ops",
                         SOURCES[0].parent, cache_dir())
            else:
                _loaded = DecodeKernels(ctypes.CDLL(str(path)))
    return _loaded


def float32_cpu(model) -> bool:
    """Whether the model computes in float32 on the CPU, judged by its first parameter: a cheap look for
    the training passes' swaps (fused_ops.py), whose kernels check each tensor they get."""
    p = next(model.parameters(), None)
    return p is not None and p.device.type == "cpu" and p.dtype == torch.float32


def kernels_for(model) -> DecodeKernels | None:
    """The kernels for this model's decode steps: float32 weights on the CPU only (else None: PyTorch ops)."""
    params = list(model.parameters())
    if not params or params[0].device.type != "cpu" or any(p.dtype != torch.float32 for p in params):
        return None
    return kernels()


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3                 # glibc's mallopt parameters (malloc.h)
_kept_memory = False


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Have glibc's malloc keep freed memory for the next pass instead of returning it to the OS; True if set.

    Every training pass allocates and frees the same large activations. By default glibc serves blocks
    above a (moving) threshold with mmap and trims the heap's free top, so the next pass faults those
    pages back in, each one zeroed by the kernel: ~1 us per 4 KiB page on the 2-core test machine, about
    37,000 faults (~40 ms) per tiny/256 bench step. With blocks up to `mmap_threshold` taken from the heap
    and up to `trim_threshold` of free heap kept, 0-7,000 remained in two measurements (docs/performance.md).
    Peak RSS is that of the largest pass either way; between passes the process keeps it. A no-op off
    glibc and with GRPOKIT_KEEP_MEMORY=0; process-wide, set once.
    """
    global _kept_memory
    flag = os.environ.get("GRPOKIT_KEEP_MEMORY", "1")
    if flag not in ("0", "1"):
        raise ValueError(f"GRPOKIT_KEEP_MEMORY={flag!r}: set it to 0 (malloc's defaults) "
                         "or 1 (keep freed memory)")
    if _kept_memory or flag == "0" or platform.libc_ver()[0] != "glibc":
        return _kept_memory
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        _kept_memory = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
            mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    return _kept_memory
