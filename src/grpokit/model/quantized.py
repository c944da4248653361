"""QLoRA: the policy's base weights quantized by bitsandbytes (4-bit NF4 / FP4, or int8), LoRA on top.

Dettmers et al. 2023 (QLoRA): the frozen base W is stored in 4 bits per weight with one scale per block of
64 (NF4: the 16 levels are quantiles of a standard normal; double quantization stores the scales in 8 bits
too), de-quantized block by block in the forward and multiplied in the compute dtype:

    y = dequant(W_nf4) x + (alpha / r) * B @ A x        W frozen, only A and B train

What stays where (`prepare_quantized`, TRL's choice through peft's `prepare_model_for_kbit_training`):
    quantized linear layers   4-bit / int8, frozen, de-quantized to model.bnb_4bit_compute_dtype per forward
    embeddings, norms, head   float32, frozen
    LoRA A and B              float32 master weights and AdamW state; their matmuls run in the compute
                              precision that `model.precision` picks (bf16 autocast: fp32 masters)

The reference pi_ref is the same quantized base with the adapter off (`lora.DisabledAdapterReference`): no
second copy. A model read from a folder is quantized as it loads; one built in memory (a GGUF file, the
built-in models) is written to a temporary folder first and loaded from it quantized, as transformers
quantizes only in from_pretrained.
"""

from __future__ import annotations

import copy
import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import torch

from grpokit.config.sections import ModelConfig
from grpokit.errors import ConfigError

BNB_HINT = ("model.load_in_4bit / model.load_in_8bit needs bitsandbytes: pip install 'grpokit[qlora]', "
            "or set both to false")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_QUANT_KEYS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map", "quant_state", "SCB",
               "weight_format")


class QuantizationError(ConfigError):
    """The quantized model cannot be set up as configured: the message says what to change."""


def wants_quantization(cfg: ModelConfig) -> bool:
    """Whether the model section asks for a bitsandbytes-quantized base (4-bit or int8)."""
    return bool(cfg.load_in_4bit or cfg.load_in_8bit)


def bnb_config(cfg: ModelConfig):
    """transformers' BitsAndBytesConfig for the model section; None when no quantization is asked for.

    Raises:
        QuantizationError: bitsandbytes is not installed.
    """
    if not wants_quantization(cfg):
        return None
    if importlib.util.find_spec("bitsandbytes") is None:
        raise QuantizationError(BNB_HINT)
    from transformers import BitsAndBytesConfig

    if cfg.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=cfg.bnb_4bit_quant_type,
                              bnb_4bit_use_double_quant=cfg.bnb_4bit_use_double_quant,
                              bnb_4bit_compute_dtype=_DTYPES[cfg.bnb_4bit_compute_dtype])


# BitsAndBytesConfig settings grpokit's model section does not carry, at transformers' defaults
_BNB_FIXED = {"llm_int8_threshold": 6.0, "llm_int8_skip_modules": None,
              "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False,
              "bnb_4bit_quant_storage": "uint8"}


def model_keys_from_bnb(config: Any) -> dict[str, Any]:
    """The model.* keys of a transformers BitsAndBytesConfig (or its dict), as TRL's
    `model_init_kwargs={"quantization_config": ...}` passes it; transformers' defaults where it is silent
    (4-bit: fp4, no double quantization, float32 compute).

    Raises:
        QuantizationError: neither 4-bit nor 8-bit, or a setting grpokit does not carry away from its default.
    """
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    odd = [k for k, default in _BNB_FIXED.items() if k in d and str(d[k]) != str(default)]
    if odd:
        raise QuantizationError(f"quantization_config.{odd[0]}={d[odd[0]]!r}: grpokit's QLoRA keeps it at "
                                f"{_BNB_FIXED[odd[0]]!r}: leave it unset")
    if d.get("load_in_8bit"):
        return {"model.load_in_8bit": True}
    if not d.get("load_in_4bit"):
        raise QuantizationError("quantization_config: grpokit loads bitsandbytes 4-bit or 8-bit weights "
                                "only: set load_in_4bit=True or load_in_8bit=True")
    compute = str(d.get("bnb_4bit_compute_dtype") or "float32").replace("torch.", "")
    return {"model.load_in_4bit": True, "model.bnb_4bit_quant_type": d.get("bnb_4bit_quant_type", "fp4"),
            "model.bnb_4bit_use_double_quant": bool(d.get("bnb_4bit_use_double_quant", False)),
            "model.bnb_4bit_compute_dtype": compute}


def quantized_kwargs(cfg: ModelConfig, device: torch.device) -> dict[str, Any]:
    """Keywords for from_pretrained that load the weights quantized onto `device` (empty: no quantization)."""
    config = bnb_config(cfg)
    return {} if config is None else {"quantization_config": config, "device_map": {"": str(device)}}


def is_quantized(model: Any) -> bool:
    """Whether `model` (a transformers model, or a PeftModel over one) has bitsandbytes-quantized weights."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False))


def quantize_in_memory(model: torch.nn.Module, cfg: ModelConfig, device: torch.device) -> torch.nn.Module:
    """The same weights loaded back quantized (a model built in memory: GGUF, built-in): written to a
    temporary folder in the storage dtype, then from_pretrained with the bitsandbytes config."""
    from transformers import AutoModelForCausalLM

    kwargs = quantized_kwargs(cfg, device)
    with tempfile.TemporaryDirectory(prefix="grpokit-quantize-") as folder:
        model.save_pretrained(folder)
        quantized = AutoModelForCausalLM.from_pretrained(folder, dtype=next(model.parameters()).dtype,
                                                         **kwargs)
    quantized.generation_config = model.generation_config
    return quantized


def prepare_quantized(model: torch.nn.Module, cfg: ModelConfig) -> torch.nn.Module:
    """Freeze every weight, keep the non-quantized ones (embeddings, norms, head) in float32, and remember
    whether the final save merges (model.save_merged_quantized); LoRA is wrapped after this.

    Gradient checkpointing is left to `model.gradient_checkpointing` (loading turns it on)."""
    from peft import prepare_model_for_kbit_training

    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    for module in model.modules():
        # bitsandbytes' CPU layers repack their weights for a faster inference kernel on the first eval-mode
        # forward and keep that layout when back in train mode, where that kernel passes no gradient to the
        # input (and rounds differently from the training path, so pi_old != pi_theta at the same
        # weights): one path for every forward
        if is_bnb_linear(module) and getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
        if type(module).__name__ == "Linear4bit" and is_bnb_linear(module):
            module.register_load_state_dict_pre_hook(_check_quant_state)
    model.grpokit_save_merged = bool(cfg.save_merged_quantized)
    return model


def _check_quant_state(module: torch.nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    """load_state_dict of a 4-bit layer (a checkpoint resumed): its saved quantization state (the scales of
    the frozen base, `weight.absmax` ...) must be the live one; it is then taken out, as torch's loader
    knows only the packed weight and would report the rest as unexpected."""
    live = module.weight.quant_state.as_dict(packed=True)
    for key, value in live.items():
        saved = state_dict.pop(f"{prefix}weight.{key}", None)
        if saved is not None and not torch.equal(saved.to(value.device), value):
            raise QuantizationError(f"the checkpoint's 4-bit base differs from this model's at "
                                    f"{prefix}weight ({key}): resume with the model and model.bnb_4bit_* it "
                                    "was saved with")


def save_merged_requested(model: Any) -> bool:
    """Whether the final save of a (LoRA-wrapped) model writes merged/: always for a plain base, on request
    (model.save_merged_quantized) for a quantized one."""
    if not is_quantized(model):
        return True
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "grpokit_save_merged", False))


def dequantized(module: torch.nn.Module) -> torch.Tensor:
    """The float weight [out, in] a bitsandbytes Linear4bit / Linear8bitLt layer multiplies by, in float32."""
    from peft.utils.integrations import dequantize_bnb_weight

    weight = module.weight
    return dequantize_bnb_weight(weight, state=getattr(module, "state", None)).float()


def is_bnb_linear(module: torch.nn.Module) -> bool:
    """Whether `module` is one of bitsandbytes' quantized linear layers."""
    return type(module).__module__.startswith("bitsandbytes") and hasattr(module, "weight") \
        and type(module).__name__ in ("Linear4bit", "Linear8bitLt")


def dequantized_state_dict(model: torch.nn.Module, weights: dict[str, torch.Tensor],
                           dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`weights` (a PeftModel's state dict) with each quantized layer's packed weight and quantization state
    replaced by its de-quantized float weight in `dtype`; the frozen base is read from the live layers."""
    out = {k: v for k, v in weights.items()
           if not any(f".weight.{q}" in k or k.endswith(f".{q}") for q in _QUANT_KEYS)}
    for name, module in model.named_modules():
        if is_bnb_linear(module):
            out[f"{name}.weight"] = dequantized(module).to(dtype)
    return out


def plain_config(config: Any) -> Any:
    """A copy of a quantized model's config without its quantization entries (a plain model loads it)."""
    plain = copy.deepcopy(config)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(plain, attr):
            delattr(plain, attr)
    return plain


def save_plain(config: Any, state_dict: dict[str, torch.Tensor], out: Path, generation_config: Any) -> None:
    """Write a plain (not quantized) transformers model of `config` holding `state_dict` to `out`.

    Raises:
        QuantizationError: the state dict lacks a weight of the plain model (other than a tied one).
    """
    from transformers import AutoModelForCausalLM

    dtype = next(iter(state_dict.values())).dtype
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(plain_config(config), dtype=dtype)
    missing, _ = plain.load_state_dict(state_dict, strict=False, assign=True)
    plain.tie_weights()
    left = [k for k in missing if plain.get_parameter(k).is_meta]
    if left:
        raise QuantizationError(f"the merged model lacks {', '.join(left[:3])}: save the adapter alone "
                                "(model.save_merged_quantized=false)")
    plain.generation_config = generation_config
    plain.save_pretrained(out)
