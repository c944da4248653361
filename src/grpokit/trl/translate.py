"""TRL's flat GRPOConfig values -> grpokit's nested, typed config (`grpokit.config.schema.build_config`).

    t = translate(values, num_prompts=len(train_dataset))
    cfg = build_config(t.overrides)          # validated as any grpokit config
    print(t.notes)                           # TRL's defaults that differ from grpokit's (the paper's)

Which field goes where is declared once in `grpokit.trl.fields.FIELDS`; this module holds the
conversions that are more than a copy (batch sizes, steps, strategies, precision). A refused field at
a non-default value raises `ConfigError` with one line naming it, its value and the reason.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from grpokit.config.schema import SECTIONS, ConfigError
from grpokit.core.loss import LOSS_TYPES
from grpokit.model.quantized import model_keys_from_bnb
from grpokit.trl.fields import FIELDS, REASONS, REFUSE
from grpokit.trl.generation_batch import steps_per_generation

# MAP fields copied as they are: TRL field -> grpokit key.
COPY = {"learning_rate": "optim.learning_rate", "weight_decay": "optim.weight_decay",
        "adam_beta1": "optim.adam_beta1", "adam_beta2": "optim.adam_beta2",
        "max_grad_norm": "optim.max_grad_norm",
        "seed": "run.seed", "num_generations": "rollout.num_generations",
        "max_completion_length": "rollout.max_completion_length", "temperature": "rollout.temperature",
        "top_p": "rollout.top_p", "beta": "loss.beta", "num_iterations": "loss.num_iterations",
        "epsilon": "loss.epsilon", "delta": "loss.delta", "epsilon_high": "loss.epsilon_high",
        "importance_sampling_level": "loss.importance_sampling_level",
        "mask_truncated_completions": "loss.mask_truncated_completions",
        "use_bias_correction_kl": "loss.use_bias_correction_kl",
        "vllm_gpu_memory_utilization": "rollout.vllm_gpu_memory_utilization",
        "vllm_mode": "rollout.vllm_mode", "adam_epsilon": "optim.adam_epsilon",
        "cast_lm_head_to_fp32": "model.cast_lm_head_to_fp32", "trust_remote_code": "model.trust_remote_code",
        "shuffle_dataset": "task.shuffle", "multi_objective_aggregation": "loss.multi_objective_aggregation",
        "top_entropy_quantile": "loss.top_entropy_quantile",
        "off_policy_mask_threshold": "loss.off_policy_mask_threshold",
        "max_tool_calling_iterations": "rollout.max_tool_calling_iterations",
        "ddp_timeout": "run.ddp_timeout_s", "full_determinism": "run.full_determinism",
        "vllm_server_timeout": "rollout.vllm_server_timeout_s",
        "vllm_enable_sleep_mode": "rollout.vllm_enable_sleep_mode",
        **{name: f"loss.{name}" for name in (
            "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
            "vespo_lambda_neg", "entropy_coef", "use_adaptive_entropy", "entropy_coef_min",
            "entropy_coef_max",
            "entropy_coef_delta", "entropy_target")}}
# MAP fields copied when set: None (log_level "passive") keeps grpokit's default, which is PyTorch's
COPY_SET = {"data_seed": "run.data_seed", "log_level": "run.log_level", "ddp_backend": "run.ddp_backend",
            "torch_empty_cache_steps": "run.torch_empty_cache_steps",
            "run_name": "run.run_name", "vllm_max_model_length": "rollout.vllm_max_model_length",
            **{f"ddp_{k}": f"run.ddp_{k}" for k in ("find_unused_parameters", "bucket_cap_mb",
                                                   "broadcast_buffers", "static_graph")}}
# transformers' generate options that grpokit's sampler lacks: set on the model's generation_config for
# the run, and sampling goes through generate (rollout.backend=generate)
GENERATE_FIELDS = ("min_p", "repetition_penalty", "cache_implementation")
# generation_kwargs keys that are grpokit rollout settings
GENERATION_KWARGS_KEYS = {"temperature": "rollout.temperature", "top_p": "rollout.top_p",
                          "top_k": "rollout.top_k"}
OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_8bit": "adamw_8bit",
              "adamw_bnb_8bit": "adamw_8bit"}
SCHEDULERS = {"linear": "linear", "constant": "constant", "constant_with_warmup": "constant"}
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
log = logging.getLogger("grpokit")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class Translation:
    """What `translate` made of a TRL config."""

    overrides: dict[str, Any]                          # dotted grpokit keys -> values, for build_config
    notes: list[str] = field(default_factory=list)     # TRL defaults applied that differ from grpokit's
    trainer: dict[str, Any] = field(default_factory=dict)  # reward_weights, disable_dropout, resume, dtype
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)  # grpokit key -> its TRL fields


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "auto")) or (
        isinstance(v, (list, tuple, dict)) and (len(v) == 0 or list(v) == ["none"]))


def same_as(value: Any, default: Any) -> bool:
    """Whether a field's value means its default (TRL's __post_init__ turns 'none' into [], None into
    an AcceleratorConfig(), ...)."""
    try:
        if value == default:
            return True
    except (TypeError, ValueError):  # objects whose == raises (arrays)
        return False
    if _blank(value) and _blank(default):
        return True
    if default is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            return value == type(value)()
        except TypeError:
            return False
    return False


def is_default(name: str, value: Any) -> bool:
    return same_as(value, FIELDS[name].default)


def refuse(name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"GRPOConfig.{name}={value!r:.80} is not supported ({why}): "
                       f"leave it at {FIELDS[name].default!r}" if name in FIELDS else why)


def read_values(args: Any) -> dict[str, Any]:
    """Every TRL field's value from a grpokit.trl.GRPOConfig, a trl.GRPOConfig or a dict.

    A field that a newer TRL has and this mapping lacks is refused when it is not at its default.
    """
    if isinstance(args, dict):
        values = dict(args)
        unknown = [k for k in values if k not in FIELDS]
        if unknown:
            raise ConfigError(f"unknown TRL GRPOConfig field '{unknown[0]}': check the name")
    else:
        values = {name: getattr(args, name) for name in FIELDS if hasattr(args, name)}
        if dataclasses.is_dataclass(args):
            for f in dataclasses.fields(args):
                if f.name in FIELDS or not f.init:
                    continue
                default = f.default if f.default is not dataclasses.MISSING else (
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
                if not same_as(getattr(args, f.name), default):
                    raise ConfigError(f"GRPOConfig.{f.name} is not known to grpokit's TRL 1.16 mapping: "
                                      f"leave it at {default!r} (grpokit.trl.fields lists those it knows)")
    return {name: values.get(name, f.default) for name, f in FIELDS.items()}


def _check_refused(v: dict[str, Any]) -> None:
    for name, f in FIELDS.items():
        if f.kind == REFUSE and not is_default(name, v[name]):
            raise refuse(name, v[name], REASONS[f.target])
    kwargs = dict(v["model_init_kwargs"] or {})
    extra = [k for k in kwargs if k not in ("dtype", "torch_dtype", "quantization_config")]
    if extra:
        raise refuse("model_init_kwargs", kwargs, f"key '{extra[0]}': " + REASONS["model"])


def _share(value: float, total: int) -> int:
    """TRL's step counts: an int, or a float < 1 meaning that share of the run."""
    return max(1, math.ceil(value * total)) if 0 < value < 1 else int(value)


def _batch(v: dict[str, Any], world_size: int, t: Translation) -> int:
    """rollout.prompts_per_step and optim.micro_batch_size from TRL's completion counts; returns B."""
    per_device, accum = v["per_device_train_batch_size"], v["gradient_accumulation_steps"]
    G = v["num_generations"]
    completions = per_device * accum * world_size
    if completions % G:
        raise ConfigError(f"per_device_train_batch_size x gradient_accumulation_steps x ranks = "
                          f"{completions} completions is not a multiple of num_generations={G}: change one")
    B = completions // G
    _put(t, "rollout.prompts_per_step", B, "per_device_train_batch_size", "gradient_accumulation_steps",
         "num_generations")
    _put(t, "optim.micro_batch_size", per_device if accum > 1 else 0, "per_device_train_batch_size",
         "gradient_accumulation_steps")
    _put(t, "rollout.steps_per_generation", steps_per_generation(v, world_size), "steps_per_generation",
         "generation_batch_size", "gradient_accumulation_steps")
    return B


def _put(t: Translation, key: str, value: Any, *sources: str) -> None:
    t.overrides[key] = value
    t.sources[key] = sources


def _steps(v: dict[str, Any], B: int, num_prompts: int | None, t: Translation) -> int:
    """run.max_steps and the step intervals (TRL's float shares of the run)."""
    if v["max_steps"] and v["max_steps"] > 0:
        steps = int(v["max_steps"])
    elif num_prompts is None:
        raise ConfigError("GRPOConfig.max_steps must be set (> 0) for an IterableDataset: its length is "
                          "unknown")
    else:
        steps = max(1, math.ceil(float(v["num_train_epochs"]) * num_prompts / B))
    _put(t, "run.max_steps", steps, "max_steps", "num_train_epochs")
    _put(t, "run.logging_steps", _share(v["logging_steps"], steps), "logging_steps")
    warmup = _share(v["warmup_steps"], steps) if v["warmup_steps"] else 0
    _put(t, "optim.warmup_steps", warmup, "warmup_steps")
    strategy = str(getattr(v["save_strategy"], "value", v["save_strategy"]))
    if strategy not in ("steps", "no"):
        raise refuse("save_strategy", strategy, REASONS["save"] + "; use 'steps' or 'no'")
    _put(t, "run.save_steps", _share(v["save_steps"], steps) if strategy == "steps" else 0,
         "save_strategy", "save_steps")
    _put(t, "run.save_total_limit", v["save_total_limit"] or 0, "save_total_limit")
    evals = str(getattr(v["eval_strategy"], "value", v["eval_strategy"]))
    if evals not in ("steps", "no"):
        raise refuse("eval_strategy", evals, REASONS["eval"] + "; use 'steps' or 'no'")
    every = v["eval_steps"] if v["eval_steps"] is not None else v["logging_steps"]
    # the loop's own greedy evaluation runs before and after only; eval_steps schedules TRL's (the trainer)
    _put(t, "run.eval_steps", 0, "eval_strategy", "eval_steps")
    t.trainer["eval_steps"] = _share(every, steps) if evals == "steps" else 0
    logs = str(getattr(v["logging_strategy"], "value", v["logging_strategy"]))
    if logs not in ("steps", "no"):
        raise refuse("logging_strategy", logs, REASONS["logging"] + "; use 'steps' or 'no'")
    t.trainer["log_every"] = t.overrides["run.logging_steps"] if logs == "steps" else 0
    return steps


def _objective(v: dict[str, Any], t: Translation) -> None:
    loss_type = v["loss_type"]
    if loss_type not in LOSS_TYPES:
        raise ConfigError(f"GRPOConfig.loss_type={loss_type!r} is not a TRL 1.16 loss type: use one of "
                          f"{', '.join(LOSS_TYPES)}")
    _put(t, "loss.loss_type", loss_type, "loss_type")
    scale = {True: "group", False: "none"}.get(v["scale_rewards"], v["scale_rewards"])
    _put(t, "loss.scale_rewards", scale, "scale_rewards")
    sync = bool(v["sync_ref_model"])
    _put(t, "loss.ref_model_sync_steps", int(v["ref_model_sync_steps"]) if sync else 0, "sync_ref_model")
    if sync:
        _put(t, "loss.ref_model_mixup_alpha", float(v["ref_model_mixup_alpha"]), "ref_model_mixup_alpha")


def _optimizer(v: dict[str, Any], t: Translation) -> None:
    optim = str(getattr(v["optim"], "value", v["optim"]))
    if optim not in OPTIMIZERS:
        raise refuse("optim", optim, REASONS["optimizer"] + f"; use one of {', '.join(OPTIMIZERS)}")
    _put(t, "optim.optim", OPTIMIZERS[optim], "optim")
    sched = str(getattr(v["lr_scheduler_type"], "value", v["lr_scheduler_type"]))
    if sched not in SCHEDULERS:
        raise refuse("lr_scheduler_type", sched,
                     REASONS["optimizer"] + f"; use one of {', '.join(SCHEDULERS)}")
    _put(t, "optim.lr_scheduler_type", SCHEDULERS[sched], "lr_scheduler_type")


def _model_and_run(v: dict[str, Any], t: Translation) -> None:
    bf16 = v["bf16"]
    if "precision" in {f.name for f in dataclasses.fields(SECTIONS["model"])}:
        _put(t, "model.precision", "auto" if bf16 is None else ("bf16" if bf16 else "fp32"), "bf16")
    elif bf16:
        _put(t, "model.dtype", "bfloat16", "bf16")
    if bf16 is None:
        t.notes.append("bf16 unset (TRL: on) -> model.precision=auto: bf16 where the device has native bf16 "
                       "matmuls, else fp32")
    ckpt = v["activation_checkpointing"]
    ckpt = v["gradient_checkpointing"] if ckpt is None else ckpt
    _put(t, "model.gradient_checkpointing", bool(ckpt), "gradient_checkpointing", "activation_checkpointing")
    _put(t, "model.gradient_checkpointing_kwargs", dict(v["gradient_checkpointing_kwargs"] or {}),
         "gradient_checkpointing_kwargs")
    if v["use_cpu"]:
        _put(t, "model.device", "cpu", "use_cpu")
    if v["fsdp"] not in (None, "", [], False):
        _put(t, "run.fsdp", True, "fsdp")
    _put(t, "run.output_dir", v["output_dir"] or "trainer_output", "output_dir")
    _put(t, "run.progress", not v["disable_tqdm"], "disable_tqdm")
    report = v["report_to"]
    report = [] if _blank(report) else ([report] if isinstance(report, str) else list(report))
    if "all" in report or any(r not in TRACKERS for r in report):
        raise ConfigError(f"GRPOConfig.report_to={report!r}: grpokit reports to {', '.join(TRACKERS)}; "
                          "name them (no 'all')")
    _put(t, "run.report_to", report, "report_to")
    if v["log_completions"]:
        _put(t, "run.log_completions_steps", t.overrides["run.logging_steps"], "log_completions")
    _put(t, "task.chat_template_kwargs", dict(v["chat_template_kwargs"] or {}), "chat_template_kwargs")


def _generation(v: dict[str, Any], t: Translation) -> None:
    """min_p, repetition_penalty, cache_implementation and generation_kwargs: transformers' generate
    options (t.trainer["generation"]), or grpokit's rollout keys for temperature / top_p / top_k."""
    options = {name: v[name] for name in GENERATE_FIELDS if not is_default(name, v[name])}
    kwargs = dict(v["generation_kwargs"] or {})
    if kwargs.get("do_sample", True) is not True:
        raise refuse("generation_kwargs", kwargs, "GRPO samples its completions: leave do_sample unset or "
                     "True")
    kwargs.pop("do_sample", None)
    for key, target in GENERATION_KWARGS_KEYS.items():   # generation_kwargs win over the fields, as in TRL
        if key in kwargs:
            _put(t, target, kwargs.pop(key), "generation_kwargs")
    for key in ("max_new_tokens", "max_length", "num_return_sequences"):
        if key in kwargs:
            raise refuse("generation_kwargs", kwargs, f"'{key}' is set by max_completion_length and "
                         "num_generations")
    options.update(kwargs)
    t.trainer["generation"] = options
    if options:
        if v["use_vllm"]:
            raise refuse(next(iter(options)), options, "with use_vllm these transformers generate options do "
                         "not reach vLLM in grpokit")
        _put(t, "rollout.backend", "generate", *[n for n in GENERATE_FIELDS + ("generation_kwargs",)
                                                  if not is_default(n, v[n])])


def _sampling(v: dict[str, Any], t: Translation) -> None:
    _put(t, "rollout.top_k", int(v["top_k"] or 0), "top_k")
    _generation(v, t)
    if not v["use_vllm"]:
        return
    _put(t, "rollout.backend", "vllm", "use_vllm")
    url = v["vllm_server_base_url"] or f"http://{v['vllm_server_host']}:{v['vllm_server_port']}"
    _put(t, "rollout.vllm_server_base_url", url, "vllm_server_base_url")
    mode = str(v["vllm_importance_sampling_mode"])
    if mode not in IS_MODES:
        raise ConfigError(f"GRPOConfig.vllm_importance_sampling_mode={mode!r}: use one of "
                          f"{', '.join(IS_MODES)}")
    level, kind = mode.split("_")
    if not v["vllm_importance_sampling_correction"]:
        level = "none"
    _put(t, "loss.tis_level", level, "vllm_importance_sampling_correction", "vllm_importance_sampling_mode")
    _put(t, "loss.tis_mode", kind, "vllm_importance_sampling_mode")
    cap = v["vllm_importance_sampling_cap"] or v["vllm_importance_sampling_clip_max"]
    _put(t, "loss.tis_cap", None if cap is None else float(cap), "vllm_importance_sampling_clip_max")
    low = v["vllm_importance_sampling_clip_min"]
    _put(t, "loss.tis_min", None if low is None else float(low), "vllm_importance_sampling_clip_min")


def _notes_for_defaults(v: dict[str, Any], t: Translation) -> None:
    """One note per grpokit key set from TRL defaults alone to a value that differs from grpokit's."""
    for key, value in t.overrides.items():
        section, name = key.split(".", 1)
        ours = getattr(SECTIONS[section](), name)
        if value != ours and all(is_default(s, v[s]) for s in t.sources[key]):
            t.notes.append(f"{key} = {value!r} from TRL's default (grpokit's own default: {ours!r})")


def translate(args: Any, num_prompts: int | None = None, world_size: int = 1) -> Translation:
    """TRL config values (a grpokit.trl.GRPOConfig, a trl.GRPOConfig or a dict) as grpokit overrides.

    Args:
        args: the TRL-style config.
        num_prompts: rows of the training dataset (None: unknown, an IterableDataset).
        world_size: training processes (TRL's per-device batch is per rank).

    Returns:
        A `Translation`: overrides for `build_config`, notes, and the options the trainer applies.

    Raises:
        ConfigError: a refused field at a non-default value, or inconsistent batch sizes.
    """
    v = read_values(args)
    _check_refused(v)
    t = Translation({})
    for name, key in COPY.items():
        _put(t, key, v[name], name)
    for name, key in COPY_SET.items():
        if v[name] is not None and v[name] != "passive":
            _put(t, key, v[name], name)
    B = _batch(v, world_size, t)
    _steps(v, B, num_prompts, t)
    _objective(v, t)
    _optimizer(v, t)
    _model_and_run(v, t)
    _sampling(v, t)
    dtype = dict(v["model_init_kwargs"] or {})
    dtype = dtype.get("dtype", dtype.get("torch_dtype"))
    if dtype is not None:
        _put(t, "model.dtype", str(dtype).replace("torch.", ""), "model_init_kwargs")
        if t.overrides["model.dtype"] != "float32":   # 16-bit weights compute in their own dtype
            t.overrides.pop("model.precision", None)
    quantization = dict(v["model_init_kwargs"] or {}).get("quantization_config")
    if quantization is not None:   # QLoRA: the base loaded by bitsandbytes (grpokit.model.quantized)
        for key, value in model_keys_from_bnb(quantization).items():
            _put(t, key, value, "model_init_kwargs")
    _notes_for_defaults(v, t)
    t.trainer.update(reward_weights=v["reward_weights"], disable_dropout=bool(v["disable_dropout"]),
                     resume_from_checkpoint=v["resume_from_checkpoint"], model_dtype=dtype,
                     eval_batch_size=int(v["per_device_eval_batch_size"]),
                     num_generations_eval=int(v["num_generations_eval"] or v["num_generations"]),
                     eval_on_start=bool(v["eval_on_start"]), eval_delay=v["eval_delay"] or 0,
                     logging_first_step=bool(v["logging_first_step"]))
    return t


def _dispatch_batches(config: Any) -> Any:
    if isinstance(config, dict):
        return config.get("dispatch_batches")
    return getattr(config, "dispatch_batches", None)


def prepare_dataset_args(args: Any, iterable_train: bool, eval_dataset: Any) -> None:
    """TRL's rules for iterable datasets, applied to `args` as TRL applies them: accelerate's
    dispatch_batches must be False (set so), and an iterable train set is read by one worker
    (dataloader_num_workers set to 0, with a warning)."""
    evals = list(eval_dataset.values()) if isinstance(eval_dataset, dict) or hasattr(eval_dataset, "keys") \
        else [eval_dataset]
    if not (iterable_train or any(type(e).__name__ == "IterableDataset" for e in evals)):
        return
    config = getattr(args, "accelerator_config", None)
    if _dispatch_batches(config):
        raise ConfigError("Iterable datasets require `dispatch_batches=False`, but accelerator_config sets "
                          "it "
                          "to True: set it to False")
    if isinstance(config, dict):
        config["dispatch_batches"] = False
    elif config is not None and hasattr(config, "dispatch_batches"):
        config.dispatch_batches = False
    if iterable_train and getattr(args, "dataloader_num_workers", 0):
        log.warning("an IterableDataset is read by one worker to keep its groups of num_generations whole: "
                    "dataloader_num_workers=%s set to 0", args.dataloader_num_workers)
        args.dataloader_num_workers = 0
