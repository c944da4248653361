"""Mixed precision: fp32 master weights and optimizer state, bf16 matmuls where the hardware has them.

`model.precision` (config.Precision) is separate from the storage dtype `model.dtype`:

    fp32  every op in float32 (the reference path; bit-identical runs).
    bf16  weights, gradients and AdamW moments stay float32 (the "master" copy, so an update of
          lr 1e-6 is not rounded away); the matmuls of the sampler, the reference forward and the
          policy forward/backward run in bfloat16 (oneDNN on the CPU, tensor cores on CUDA);
          log-softmax, ratio, KL and the loss stay float32 (`grpokit.model.logprobs` casts the lm-head's
          logits up before the logsumexp).
    auto  bf16 where the device has native bf16 matmul (CPU: AVX512-BF16 or AMX through oneDNN;
          CUDA: torch.cuda.is_bf16_supported) and the model is large enough for it to pay
          (BF16_MIN_PARAMS), else fp32. `describe_choice` says which and why.

The choice is carried by the model object (`set_compute_dtype`), so every pass over it (sampling,
the reference, the update, evaluation) reads the same switch without a flag in each signature.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from grpokit.model.reference import weights_owner

if TYPE_CHECKING:
    from grpokit.config.schema import GRPOConfig

log = logging.getLogger("grpokit")

# auto: bf16 from this many parameters. Measured on a 2-core AVX512-BF16 CPU (docs/precision.md): the 1.1M
# "tiny" bench model samples 12x slower in bf16 (its fp32 path is one C call per step); the 24M "small"
# one's forward/backward and SmolLM2-135M's sampling are faster in bf16.
BF16_MIN_PARAMS = 10_000_000
ATTR = "grpokit_compute_dtype"       # the attribute on the model that holds the compute dtype (or None)
HEAD_ATTR = "grpokit_fp32_head"      # set (True) on a model whose lm-head computes in float32


def bf16_matmul_native(device: torch.device) -> tuple[bool, str]:
    """(whether `device` multiplies bf16 matrices natively, the evidence in a few words)."""
    if device.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
        return ok, "CUDA bf16 tensor cores" if ok else "this CUDA device has no native bf16"
    if device.type != "cpu":
        return False, f"no bf16 probe for device {device.type}"
    if not torch.backends.mkldnn.is_available():
        return False, "torch built without oneDNN"
    probes = (("AMX-BF16", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
    feats = [name for name, probe in probes if getattr(torch.cpu, probe, lambda: False)()]
    return (True, f"{' and '.join(feats)} on this CPU (oneDNN)") if feats else \
        (False, "this CPU has neither AMX-BF16 nor AVX512-BF16 (bf16 would be emulated)")


def resolve_precision(precision: str, device: torch.device, n_params: int,
                      storage: torch.dtype = torch.float32) -> tuple[str, str]:
    """(fp32 | bf16, why) for `model.precision` on this device and model size.

    Weights stored in a 16-bit dtype compute in it: precision only chooses for float32 storage.
    """
    if storage != torch.float32:
        return "fp32", f"model.dtype={str(storage).split('.')[-1]}: weights and compute in that dtype"
    if precision != "auto":
        return precision, f"model.precision={precision}"
    native, why = bf16_matmul_native(device)
    if not native:
        return "fp32", f"auto: {why}"
    if n_params < BF16_MIN_PARAMS:
        return "fp32", (f"auto: {why}, but {n_params / 1e6:.1f}M parameters < {BF16_MIN_PARAMS / 1e6:.0f}M "
                        "(bf16 measured slower at this size)")
    return "bf16", f"auto: {why}, {n_params / 1e6:.0f}M parameters (bf16 matmuls measured faster)"


def _unwrap(model):
    # DDP / FSDP wrappers keep the model in .module; LoRA's reference computes as its policy does
    return weights_owner(getattr(model, "module", model))


def set_compute_dtype(model: torch.nn.Module, dtype: torch.dtype | None) -> None:
    """Mark `model` to compute its matmuls in `dtype` (None: in its storage dtype)."""
    setattr(_unwrap(model), ATTR, dtype)


def compute_dtype(model) -> torch.dtype | None:
    """The dtype the matmuls over `model` run in when it differs from the weights', else None."""
    dtype = getattr(_unwrap(model), ATTR, None)
    params = next(iter(_unwrap(model).parameters()), None) if isinstance(model, torch.nn.Module) else None
    return None if dtype is None or params is None or params.dtype == dtype else dtype


def head_dtype(model) -> torch.dtype | None:
    """The dtype of the lm-head's matmul: float32 when the head is kept in fp32 (`cast_lm_head_to_fp32`),
    else the model's compute dtype (None: the weights')."""
    return torch.float32 if getattr(_unwrap(model), HEAD_ATTR, False) else compute_dtype(model)


def cast_lm_head_to_fp32(model: torch.nn.Module) -> None:
    """Keep the lm-head's weight in float32 and compute the logits in float32 (`head_dtype`), for precise
    log-probs of a 16-bit model (TRL's cast_lm_head_to_fp32). Forward hooks do the casts at the edges:
    the head's input up to float32, and, when the head is tied to the input embedding (which then shares
    the float32 weight), the embedding's output back to the decoder's dtype.
    """
    owner = _unwrap(model)
    if getattr(owner, HEAD_ATTR, False):   # already cast (a second run on the same model object)
        return
    head, embed = owner.get_output_embeddings(), owner.get_input_embeddings()
    if head is None:
        raise ValueError("model.cast_lm_head_to_fp32: the model has no output embedding (lm-head)")
    dtype = head.weight.dtype
    head.float()
    setattr(owner, HEAD_ATTR, True)
    # model.forward (generate, the generic log-prob path) hands the head 16-bit hidden states: cast them up
    head.register_forward_pre_hook(lambda module, args: tuple(a.float() if torch.is_tensor(a) else a
                                                              for a in args))
    if embed is not None and embed.weight is head.weight and dtype != torch.float32:
        embed.register_forward_hook(lambda module, args, output: output.to(dtype))


def autocast_for(model) -> contextlib.AbstractContextManager:
    """torch.autocast to the model's compute dtype for a forward over it; a no-op in fp32."""
    dtype = compute_dtype(model)
    if dtype is None:
        return contextlib.nullcontext()
    device = next(_unwrap(model).parameters()).device.type
    return torch.autocast(device, dtype=dtype)


def apply_precision(model: torch.nn.Module, cfg: GRPOConfig) -> tuple[str, str]:
    """Resolve `cfg.model.precision` for `model`, mark it, warn about lost updates. Returns (choice, why)."""
    p = next(model.parameters())
    n_params = sum(x.numel() for x in model.parameters())
    choice, why = resolve_precision(cfg.model.precision, p.device, n_params, p.dtype)
    set_compute_dtype(model, torch.bfloat16 if choice == "bf16" else None)
    if cfg.model.cast_lm_head_to_fp32:
        cast_lm_head_to_fp32(model)
    log.info("precision: %s (%s)", choice, why)
    warning = lost_update_warning(model, cfg.optim.learning_rate)
    if warning:
        log.warning(warning)
    return choice, why


def reference_storage(ref: torch.nn.Module | None, policy: torch.nn.Module) -> torch.nn.Module | None:
    """A separate frozen reference of a bf16-computing policy is stored in bf16 (half the memory, no cast
    per forward: it is never updated, so it needs no fp32 master); the policy itself (LoRA) unchanged."""
    dtype = compute_dtype(policy)
    if ref is None or ref is policy or dtype is None:
        return ref
    return ref.to(dtype)


def lost_update_warning(model: torch.nn.Module, learning_rate: float) -> str | None:
    """One line when weights stored in bf16 cannot take an AdamW step of `learning_rate`, else None.

    bf16 keeps 8 significant bits: near |w| its spacing is about |w| 2^-7, and a step smaller than
    half of it rounds to no change. AdamW's first steps move each weight by about lr, so when
    lr < median|w| 2^-8 most weights never change and the run learns nothing while looking normal.
    """
    weights = [p.detach().reshape(-1) for p in model.parameters()
               if p.requires_grad and p.dtype == torch.bfloat16]
    if not weights:
        return None
    sample = torch.cat([w[:: max(1, w.numel() // 4096)] for w in weights]).float().abs()
    median = float(sample.median())
    if learning_rate >= median * 2.0 ** -8:
        return None
    return (f"model.dtype=bfloat16: an AdamW step of lr {learning_rate:g} is below half the bf16 spacing "
            f"near the median weight ({median:.3g}), so most weights never change: use "
            "model.dtype=float32 model.precision=bf16 (fp32 master weights, bf16 compute)")


@contextlib.contextmanager
def computing_in(model: torch.nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """For the duration, `model` computes in `dtype` (tests and benches compare precisions on one model)."""
    before = getattr(_unwrap(model), ATTR, None)
    set_compute_dtype(model, dtype)
    try:
        yield
    finally:
        set_compute_dtype(model, before)
