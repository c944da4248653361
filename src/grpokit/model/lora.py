"""LoRA for the policy (optional `[peft]` extra): adapters train, the base weights stay frozen.

With LoRA the reference model costs no memory: pi_ref is the policy's own base weights, reached by
running the same PeftModel with its adapters disabled (`peft`'s `disable_adapter()` context):

    pi_theta(o | q) = base(W + (alpha / r) * B @ A)        adapters on   (the policy)
    pi_ref(o | q)   = base(W)                               adapters off  (the reference)

`DisabledAdapterReference` exposes that view with the interface `per_token_logprobs` reads
(`config`, `get_decoder`, `get_output_embeddings`, a forward) and holds no parameters of its own,
so a checkpoint stores nothing for it and there is no second copy of the weights. The same holds for a
quantized base (QLoRA, grpokit.model.quantized): pi_ref is the frozen 4-bit base with the adapter off.

Fused MoE experts are one 3-D parameter per block ([E, out, in], no nn.Linear to wrap); peft adapts them
through `target_parameters` (model.lora_target_parameters), one low-rank delta per expert.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
from pathlib import Path
from typing import Any, Iterator

import torch

from grpokit.config.schema import ModelConfig
from grpokit.model.quantized import dequantized_state_dict, is_quantized, save_merged_requested, save_plain
from grpokit.model.reference import eval_mode, frozen_reference

log = logging.getLogger("grpokit")


class LoRAError(ValueError):
    """LoRA cannot be set up as configured: the message says what to change."""


def _peft():
    try:
        import peft
    except ImportError:
        raise LoRAError("model.lora_r > 0 needs peft: pip install 'grpokit[peft]', "
                        "or set model.lora_r=0") from None
    return peft


def is_peft_model(model: Any) -> bool:
    """Whether `model` is a peft PeftModel (without importing peft when it is not installed)."""
    return any(cls.__name__ == "PeftModel" for cls in type(model).__mro__)


def active_delta(module: Any) -> torch.Tensor | None:
    """sum_a (alpha_a / r_a) * B_a @ A_a over a peft LoRA layer's active adapters (a new tensor, no
    autograd); None for a layer with no active adapter or that is not a LoRA layer."""
    lora_a = getattr(module, "lora_A", None)
    if lora_a is None or not hasattr(module, "get_delta_weight"):
        return None
    adapters = [a for a in getattr(module, "active_adapters", []) if a in lora_a]
    if not adapters:
        return None
    with torch.no_grad():
        return sum(module.get_delta_weight(a) for a in adapters)


def effective_linear(module: Any) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) that a linear layer's forward applies, for code that reads weights directly (the
    lean decoder): nn.Linear's own; an unmerged peft LoRA layer's W + `active_delta` (a new tensor; no
    DoRA, no LoRA bias); None for any other layer."""
    if type(module) is torch.nn.Linear:
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(module, "get_delta_weight") \
            or getattr(module, "merged", True) or getattr(module, "disable_adapters", True):
        return None
    adapters = [a for a in module.active_adapters if a in module.lora_A]
    if any(getattr(module, "use_dora", {}).get(a, False) for a in adapters) \
            or any(getattr(module, "lora_bias", {}).get(a, False) for a in adapters):
        return None
    delta = active_delta(module)
    if delta is None:
        return base.weight, base.bias
    # a bf16-stored base with float32 adapters (peft's default): the merged weight in the base's dtype
    return (base.weight.detach() + delta).to(base.weight.dtype), base.bias


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total


def wrap_lora(model: torch.nn.Module, cfg: ModelConfig) -> torch.nn.Module:
    """Wrap a causal LM with LoRA adapters on `cfg.lora_target_modules`; only the adapters train.

    Args:
        model: a transformers causal LM.
        cfg: model section (lora_r, lora_alpha, lora_dropout, lora_target_modules).

    Returns:
        A peft PeftModel (train mode) whose trainable parameters are the LoRA A and B matrices.
    """
    peft = _peft()
    check_targets(model, cfg.lora_target_modules)
    check_target_parameters(model, cfg.lora_target_parameters)
    head = model.get_output_embeddings()
    head_names = {n for n, m in model.named_modules() if m is head}
    clash = [t for t in cfg.lora_target_modules if any(n == t or n.endswith("." + t) for n in head_names)]
    if clash:  # the chunked lm-head reads head.weight directly and would skip an adapter on it
        raise LoRAError(f"model.lora_target_modules may not include the lm-head ({', '.join(clash)}): "
                        "target attention/MLP projections, e.g. q_proj,k_proj,v_proj,o_proj")
    lora_cfg = peft.LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                               target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM",
                               bias="none", target_parameters=list(cfg.lora_target_parameters) or None)
    if getattr(model, "is_gradient_checkpointing", False):
        model.enable_input_require_grads()   # else checkpointed blocks of frozen weights pass no gradient on
    try:
        wrapped = peft.get_peft_model(model, lora_cfg)
    except ValueError as e:
        raise LoRAError(f"LoRA could not wrap the model: {str(e).splitlines()[0]}; "
                        "check model.lora_target_modules") from None
    trainable, total = trainable_parameters(wrapped)
    log.info("LoRA r=%d: %d trainable of %d parameters (%.3f%%)", cfg.lora_r, trainable, total,
             100.0 * trainable / max(total, 1))
    return wrapped


def check_targets(model: torch.nn.Module, targets: list) -> None:
    """Every name in model.lora_target_modules must match a module (its full name, or its last part):
    peft wraps whatever matches and silently drops a misspelt one, which would then never train."""
    names = [n for n, _ in model.named_modules() if n]
    missing = [str(t) for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                         if isinstance(m, torch.nn.Linear)})
        close = [c for t in missing for c in difflib.get_close_matches(t, linear, n=1, cutoff=0.5)]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise LoRAError(f"model.lora_target_modules: {', '.join(missing)} match no module of the "
                        f"model{hint}; its linear layers are {', '.join(linear)}: "
                        "check model.lora_target_modules")


def check_target_parameters(model: torch.nn.Module, targets: list) -> None:
    """Every name in model.lora_target_parameters must match a parameter (its full name or its tail, e.g.
    mlp.experts.gate_up_proj): peft would otherwise adapt nothing for it."""
    names = [n for n, _ in model.named_parameters()]
    missing = [str(t) for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        fused = sorted({n.split(".layers.", 1)[-1].split(".", 1)[-1] for n, p in model.named_parameters()
                        if p.dim() == 3})
        hint = f"; its 3-D (fused expert) parameters are {', '.join(fused)}" if fused else \
            "; the model has no 3-D (fused expert) parameters: use model.lora_target_modules"
        raise LoRAError(f"model.lora_target_parameters: {', '.join(missing)} match no parameter of the "
                        f"model{hint}")


class DisabledAdapterReference(torch.nn.Module):
    """pi_ref for a LoRA policy: the policy's PeftModel run with adapters disabled, in eval mode.

    It registers no parameters or submodules (the PeftModel is held outside the module tree), so
    `state_dict()` is empty and the reference adds no memory.
    """

    def __init__(self, peft_model: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_policy", peft_model)  # not a submodule: no second copy, nothing saved

    @property
    def weights_owner(self) -> torch.nn.Module:
        """The PeftModel whose base weights this view runs on: its precision and size apply here."""
        return self._policy

    @contextlib.contextmanager
    def base_model_mode(self) -> Iterator[None]:
        """Adapters off and eval mode (no dropout) for the duration; the policy's mode is restored."""
        with eval_mode(self._policy), self._policy.disable_adapter():
            yield

    @property
    def config(self):
        return self._policy.config

    def get_output_embeddings(self):
        return self._policy.get_output_embeddings()

    def get_decoder(self):
        decoder = self._policy.get_decoder()

        def run(*args: Any, **kwargs: Any):
            with self.base_model_mode():
                return decoder(*args, **kwargs)
        return run

    def forward(self, *args: Any, **kwargs: Any):
        with self.base_model_mode():
            return self._policy(*args, **kwargs)


def reference_for(model: torch.nn.Module) -> torch.nn.Module:
    """The reference model: adapters disabled for a LoRA policy, else a frozen deep copy."""
    if is_peft_model(model):
        return DisabledAdapterReference(model)
    return frozen_reference(model)


def save_lora(model: torch.nn.Module, out: Path, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Save the adapter into `out` (peft format) and a merged plain model into `out/merged`.

    state_dict: the PeftModel's whole state dict when the live one cannot be read here (FSDP: rank 0's
    gathered copy); default model.state_dict(). The merge W <- W + (alpha / r) * B @ A is computed on
    that dict (`merged_state_dict`), so the live policy keeps its adapters. A quantized base (QLoRA) is
    merged only on request (model.save_merged_quantized): de-quantized to the storage dtype first, then
    written as a plain model. Returns the merged folder, which plain `AutoModelForCausalLM.from_pretrained`
    loads, or `out` when no merged model is written.
    """
    weights = model.state_dict() if state_dict is None else state_dict
    model.save_pretrained(out, state_dict=weights)
    if not save_merged_requested(model):
        return out
    base = model.get_base_model()
    if is_quantized(model):
        dtype = getattr(base.config, "_pre_quantization_dtype", None) or torch.float32
        weights = dequantized_state_dict(model, weights, dtype)
        save_plain(base.config, merged_state_dict(model, weights), out / "merged", base.generation_config)
    else:
        base.save_pretrained(out / "merged", state_dict=merged_state_dict(model, weights))
    return out / "merged"


def _plain_name(name: str) -> str:
    """A module or weight name in the model before wrapping: peft's prefix and every `.base_layer` dropped
    (a parameter adapter over another one nests them: experts.base_layer.base_layer.gate_up_proj)."""
    parts = name.removeprefix("base_model.model.").split(".")
    return ".".join(part for part in parts if part != "base_layer")


def merged_state_dict(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A PeftModel's state dict with every LoRA layer merged, in the plain model's names.

    For each adapted linear layer `name`: name.weight = base_layer.weight + sum_a s_a * B_a @ A_a, with
    s_a = lora_alpha / r (`module.scaling`); adapter tensors are dropped and the `base_model.model.` prefix
    removed, so the keys are those of the model before wrapping. A parameter adapter (fused MoE experts,
    peft's `target_parameters`) adds its per-expert delta [E, ...] to the parameter it names.
    """
    out = {_plain_name(key): value for key, value in weights.items() if ".lora_" not in key}
    for name, module in model.named_modules():
        lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
        if lora_a is None or lora_b is None:
            continue
        # a parameter adapter (fused MoE experts) names its parameter; a linear layer's is .weight
        target = f"{_plain_name(name)}.{getattr(module, 'parameter_name', None) or 'weight'}"
        for adapter in lora_a:
            if hasattr(module, "parameter_name"):   # [E, out, in] (or [E, in, out]): peft's per-expert delta
                with torch.no_grad():
                    delta = module.get_delta_weight(adapter).float()
            else:
                a = weights[f"{name}.lora_A.{adapter}.weight"].float()
                b = weights[f"{name}.lora_B.{adapter}.weight"].float()
                delta = module.scaling[adapter] * (b @ a)
            out[target] = (out[target].float() + delta).to(out[target].dtype)
    return out
