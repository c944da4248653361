"""Every field of TRL 1.16's `GRPOConfig` (its own and the ~110 it inherits from transformers'
`TrainingArguments`), with TRL's default and what grpokit does with it. Nothing is ignored silently:

    map       the value goes to a grpokit config key (maybe converted)            -> `translate.py`
    derived   grpokit keys computed from this and other fields (batch sizes, steps)
    trainer   used by `grpokit.trl.GRPOTrainer` itself (reward weights, dropout, the chat template)
    same      any value is accepted: it changes nothing in grpokit (the reason says why)
    refuse    accepted at TRL's default; another value stops with one line naming the field and why

`mapping_table()` renders this as the table of docs/coming_from_trl.md (a test keeps them equal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

MAP, DERIVED, TRAINER, SAME, REFUSE = "map", "derived", "trainer", "same", "refuse"


class Field(NamedTuple):
    default: Any    # TRL 1.16's default (before its __post_init__)
    kind: str       # map | derived | trainer | same | refuse
    target: str     # map/derived: the grpokit key(s); refuse: a REASONS key; same/trainer: why


# Why a group of fields is refused at a non-default value.
REASONS = {
    "hub": "hub upload: grpokit writes locally only (push output_dir/final yourself)",
    "launch": "distributed setup: grpokit reads torchrun's environment and uses PyTorch DDP / FSDP2 "
              "(run.fsdp) with their defaults; no DeepSpeed or accelerate config",
    "data": "data loading: grpokit draws prompts in-process, in a seeded random order per epoch (dataset "
            "order with shuffle_dataset=False), with no DataLoader",
    "precision": "precision and kernels: grpokit computes in fp32 or bf16 (model.precision) with its own "
                 "kernels; no fp16 loss scaling, tf32, torch.compile, Liger or NEFTune",
    "eval": "evaluation: TRL's (loss and rewards on sampled completions) every eval_steps with "
            "eval_strategy='steps', and on evaluate(); grpokit's greedy one before and after training",
    "save": "checkpoints: grpokit saves full, verified checkpoints every save_steps and keeps the newest "
            "save_total_limit; no best-model tracking or partial checkpoints",
    "logging": "logging: grpokit writes every step to metrics.jsonl, the console every logging_steps, "
               "trackers from report_to (named after output_dir)",
    "optimizer": "optimizer: grpokit has AdamW or AdamW 8-bit, a constant or linear schedule with "
                 "linear warm-up",
    "objective": "objective option not in grpokit: the MoE router's auxiliary loss (grpokit trains no "
                 "router loss)",
    "generation": "generation engine: grpokit samples with its own KV-cache sampler or transformers' "
                  "generate, not transformers' continuous batching",
    "vllm": "vLLM option not in grpokit's vLLM backend (use_vllm, vllm_mode, memory share, server URL)",
    "model": "model loading: grpokit loads a local folder itself; load the model yourself for anything else "
             "and pass the object",
    "supervised": "supervised-training option: GRPO has no labels",
    "steps": "grpokit trains whole optimizer steps on the slices of one generation batch",
}

_INHERITED = {  # transformers.TrainingArguments, as TRL 1.16 overrides them
    "output_dir": Field(None, MAP, "run.output_dir (None: 'trainer_output', as transformers)"),
    "per_device_train_batch_size": Field(8, DERIVED, "rollout.prompts_per_step = per_device_train_batch_size "
                                         "x gradient_accumulation_steps x ranks / num_generations"),
    "num_train_epochs": Field(3.0, DERIVED, "run.max_steps = ceil(epochs x prompts / prompts_per_step) when "
                              "max_steps <= 0"),
    "max_steps": Field(-1, DERIVED, "run.max_steps (when > 0)"),
    "learning_rate": Field(1e-06, MAP, "optim.learning_rate"),
    "lr_scheduler_type": Field("linear", DERIVED, "optim.lr_scheduler_type: linear | constant | "
                               "constant_with_warmup (= constant)"),
    "lr_scheduler_kwargs": Field(None, REFUSE, "optimizer"),
    "warmup_steps": Field(0, DERIVED, "optim.warmup_steps (a float < 1: that share of max_steps)"),
    "optim": Field("adamw_torch_fused", DERIVED, "optim.optim: adamw_torch[_fused] -> adamw, "
                   "adamw_bnb_8bit / adamw_8bit -> adamw_8bit"),
    "optim_args": Field(None, REFUSE, "optimizer"),
    "weight_decay": Field(0.0, MAP, "optim.weight_decay"),
    "adam_beta1": Field(0.9, MAP, "optim.adam_beta1"),
    "adam_beta2": Field(0.999, MAP, "optim.adam_beta2"),
    "adam_epsilon": Field(1e-08, MAP, "optim.adam_epsilon"),
    "optim_target_modules": Field(None, REFUSE, "optimizer"),
    "gradient_accumulation_steps": Field(1, DERIVED, "optim.micro_batch_size = per_device_train_batch_size "
                                         "(when > 1), and the generation batch"),
    "average_tokens_across_devices": Field(True, REFUSE, "launch"),
    "max_grad_norm": Field(1.0, MAP, "optim.max_grad_norm"),
    "label_smoothing_factor": Field(0.0, REFUSE, "supervised"),
    "bf16": Field(None, DERIVED, "model.precision: True -> bf16, False -> fp32, None (TRL: on) -> auto"),
    "fp16": Field(False, REFUSE, "precision"),
    "bf16_full_eval": Field(False, REFUSE, "precision"),
    "fp16_full_eval": Field(False, REFUSE, "precision"),
    "tf32": Field(None, REFUSE, "precision"),
    "activation_checkpointing": Field(None, DERIVED, "model.gradient_checkpointing (wins over "
                                      "gradient_checkpointing when set)"),
    "activation_checkpointing_kwargs": Field(None, REFUSE, "precision"),
    "gradient_checkpointing": Field(True, MAP, "model.gradient_checkpointing"),
    "gradient_checkpointing_kwargs": Field(None, MAP, "model.gradient_checkpointing_kwargs (None: {})"),
    "torch_compile": Field(False, REFUSE, "precision"),
    "torch_compile_backend": Field(None, REFUSE, "precision"),
    "torch_compile_mode": Field(None, REFUSE, "precision"),
    "use_liger_kernel": Field(False, REFUSE, "precision"),
    "liger_kernel_config": Field(None, REFUSE, "precision"),
    "use_cache": Field(False, SAME, "grpokit's sampler keeps its own KV cache; training passes use none"),
    "neftune_noise_alpha": Field(None, REFUSE, "precision"),
    "torch_empty_cache_steps": Field(None, MAP, "run.torch_empty_cache_steps (None: 0, never)"),
    "auto_find_batch_size": Field(False, REFUSE, "data"),
    "logging_strategy": Field("steps", TRAINER, "steps: a log_history row every logging_steps; no: only the "
                              "last row (metrics.jsonl has every step either way)"),
    "logging_steps": Field(10, MAP, "run.logging_steps (a float < 1: that share of max_steps)"),
    "logging_first_step": Field(False, TRAINER, "True: a log_history row after step 1 too (metrics.jsonl has "
                                "every step)"),
    "log_on_each_node": Field(True, SAME, "one node's rank 0 writes the logs"),
    "logging_nan_inf_filter": Field(True, SAME, "grpokit skips non-finite updates and counts them "
                                    "(skipped_updates, run.max_bad_steps)"),
    "include_num_input_tokens_seen": Field("no", TRAINER, "True / 'all' / 'non_padding': log rows also "
                                           "hold num_input_tokens_seen, the prompt + completion tokens "
                                           "(no padding, every rank) so far, as num_tokens always does"),
    "log_level": Field("passive", MAP, "run.log_level (passive: the logger as the caller set it)"),
    "log_level_replica": Field("warning", REFUSE, "logging"),
    "disable_tqdm": Field(None, MAP, "run.progress = not disable_tqdm"),
    "report_to": Field("none", MAP, "run.report_to (tensorboard, wandb, mlflow, trackio; 'all' is refused)"),
    "run_name": Field(None, MAP, "run.run_name (None: output_dir's folder name)"),
    "project": Field("huggingface", REFUSE, "logging"),
    "trackio_space_id": Field(None, REFUSE, "hub"),
    "trackio_bucket_id": Field(None, REFUSE, "hub"),
    "trackio_static_space_id": Field(None, REFUSE, "hub"),
    "eval_strategy": Field("no", DERIVED, "run.eval_steps: no -> 0 (eval_dataset: before and after only), "
                           "steps -> eval_steps"),
    "eval_steps": Field(None, TRAINER, "with eval_strategy='steps': the TRL-style evaluation every N steps "
                        "(None: logging_steps; a float < 1: that share of max_steps)"),
    "eval_delay": Field(0, TRAINER, "no TRL-style evaluation before this step"),
    "per_device_eval_batch_size": Field(8, TRAINER, "completions per evaluation batch (a multiple of "
                                        "num_generations_eval)"),
    "prediction_loss_only": Field(False, SAME, "GRPO's evaluation computes the loss and rewards only, as in "
                                  "TRL"),
    "eval_on_start": Field(False, TRAINER, "True: a TRL-style evaluation before the first step"),
    "eval_do_concat_batches": Field(True, SAME, "predictions options: GRPOTrainer takes no compute_metrics"),
    "eval_use_gather_object": Field(False, SAME, "predictions options: GRPOTrainer takes no compute_metrics"),
    "eval_accumulation_steps": Field(None, SAME, "predictions options: GRPOTrainer takes no compute_metrics"),
    "include_for_metrics": Field([], SAME, "predictions options: GRPOTrainer takes no compute_metrics"),
    "batch_eval_metrics": Field(False, SAME, "predictions options: GRPOTrainer takes no compute_metrics"),
    "save_only_model": Field(False, REFUSE, "save"),
    "save_strategy": Field("steps", DERIVED, "run.save_steps: steps -> save_steps, no -> 0"),
    "save_steps": Field(500, DERIVED, "run.save_steps with save_strategy='steps' (a float < 1: that share)"),
    "save_on_each_node": Field(False, REFUSE, "save"),
    "save_total_limit": Field(None, MAP, "run.save_total_limit (None: 0, keep all)"),
    "enable_jit_checkpoint": Field(False, REFUSE, "save"),
    "push_to_hub": Field(False, REFUSE, "hub"),
    "hub_token": Field(None, REFUSE, "hub"),
    "hub_private_repo": Field(None, REFUSE, "hub"),
    "hub_model_id": Field(None, REFUSE, "hub"),
    "hub_strategy": Field("every_save", REFUSE, "hub"),
    "hub_always_push": Field(False, REFUSE, "hub"),
    "hub_revision": Field(None, REFUSE, "hub"),
    "load_best_model_at_end": Field(False, REFUSE, "save"),
    "metric_for_best_model": Field(None, REFUSE, "save"),
    "greater_is_better": Field(None, REFUSE, "save"),
    "ignore_data_skip": Field(False, REFUSE, "save"),
    "restore_callback_states_from_checkpoint": Field(False, REFUSE, "save"),
    "full_determinism": Field(False, MAP, "run.full_determinism"),
    "seed": Field(42, MAP, "run.seed"),
    "data_seed": Field(None, MAP, "run.data_seed (None: run.seed)"),
    "use_cpu": Field(False, MAP, "model.device = cpu"),
    "accelerator_config": Field(None, SAME, "grpokit has no accelerate DataLoader to configure; "
                                "dispatch_batches=True with an IterableDataset is refused, as TRL refuses "
                                "it"),
    "parallelism_config": Field(None, REFUSE, "launch"),
    "dataloader_drop_last": Field(False, REFUSE, "data"),
    "dataloader_num_workers": Field(0, SAME, "grpokit draws prompts in-process (no DataLoader workers); set "
                                    "to 0 for an IterableDataset, as TRL does"),
    "dataloader_pin_memory": Field(True, SAME, "grpokit has no DataLoader: nothing is pinned (use_cpu sets "
                                   "it False)"),
    "dataloader_persistent_workers": Field(False, SAME, "DataLoader workers: grpokit draws prompts "
                                           "in-process"),
    "dataloader_prefetch_factor": Field(None, SAME, "DataLoader workers: grpokit draws prompts in-process"),
    "dataloader_multiprocessing_context": Field(None, SAME, "DataLoader workers: grpokit draws prompts "
                                                "in-process"),
    "dataloader_in_order": Field(True, SAME, "DataLoader workers: grpokit draws prompts in-process"),
    "remove_unused_columns": Field(False, REFUSE, "data"),
    "label_names": Field(None, REFUSE, "supervised"),
    "train_sampling_strategy": Field("random", SAME, "TRL's GRPOTrainer samples with its own RepeatSampler, "
                                     "so "
                                     "this changes nothing there either (shuffle_dataset does)"),
    "length_column_name": Field("length", SAME, "only read by group_by_length, which GRPO does not use"),
    "ddp_find_unused_parameters": Field(None, MAP, "run.ddp_find_unused_parameters (None: false, PyTorch's "
                                        "default)"),
    "ddp_bucket_cap_mb": Field(None, MAP, "run.ddp_bucket_cap_mb (None: 25, PyTorch's default)"),
    "ddp_broadcast_buffers": Field(None, MAP, "run.ddp_broadcast_buffers (None: true)"),
    "ddp_static_graph": Field(None, MAP, "run.ddp_static_graph (None: false)"),
    "ddp_backend": Field(None, MAP, "run.ddp_backend (None: auto, NCCL for CUDA, gloo otherwise)"),
    "ddp_timeout": Field(1800, MAP, "run.ddp_timeout_s"),
    "fsdp": Field(None, MAP, "run.fsdp = true for any FSDP setting (grpokit's FSDP2 full sharding)"),
    "fsdp_config": Field(None, REFUSE, "launch"),
    "deepspeed": Field(None, REFUSE, "launch"),
    "debug": Field("", REFUSE, "launch"),
    "skip_memory_metrics": Field(True, SAME, "grpokit logs peak memory every step either way"),
    "do_train": Field(False, SAME, "a flag for scripts; trainers ignore it (transformers' too)"),
    "do_eval": Field(False, SAME, "a flag for scripts; trainers ignore it (transformers' too)"),
    "do_predict": Field(False, SAME, "a flag for scripts; trainers ignore it (transformers' too)"),
    "resume_from_checkpoint": Field(None, TRAINER, "the default of .train(resume_from_checkpoint=...)"),
    "local_rank": Field(-1, SAME, "set by the launcher; grpokit reads LOCAL_RANK from the environment"),
}

_GRPO = {  # trl.GRPOConfig's own fields
    "model_init_kwargs": Field(None, DERIVED, "model.dtype from {'dtype': ...} (or torch_dtype); "
                               "{'quantization_config': BitsAndBytesConfig(...)}: model.load_in_4bit / "
                               "load_in_8bit and model.bnb_4bit_* (QLoRA, with peft_config); other keys are "
                               "refused (model loading)"),
    "trust_remote_code": Field(False, MAP, "model.trust_remote_code (a model folder with its own modeling "
                               "code)"),
    "router_aux_loss_coef": Field(None, REFUSE, "objective"),
    "disable_dropout": Field(False, TRAINER, "True: every Dropout of the policy gets p = 0 before training"),
    "cast_lm_head_to_fp32": Field(False, MAP, "model.cast_lm_head_to_fp32"),
    "num_generations": Field(8, MAP, "rollout.num_generations (G)"),
    "num_generations_eval": Field(None, TRAINER, "completions per prompt in evaluation (None: "
                                  "num_generations)"),
    "max_completion_length": Field(512, MAP, "rollout.max_completion_length (T)"),
    "ds3_gather_for_generation": Field(True, REFUSE, "launch"),
    "shuffle_dataset": Field(True, MAP, "task.shuffle (False: prompts in dataset order)"),
    "pad_to_multiple_of": Field("auto", SAME, "tensor shapes only (TRL pads for Neuron compilation); grpokit "
                                "pads to the longest row, the masks make the math the same"),
    "generation_batch_size": Field(None, DERIVED, "rollout.steps_per_generation = generation_batch_size / "
                                   "(per_device_train_batch_size x ranks x gradient_accumulation_steps): a "
                                   "multiple of those completions, else refused (" + REASONS["steps"] + ")"),
    "steps_per_generation": Field(None, DERIVED, "rollout.steps_per_generation = steps_per_generation / "
                                  "gradient_accumulation_steps (None: gradient_accumulation_steps, one step "
                                  "per generation): a multiple of it, else refused ("
                                  + REASONS["steps"] + ")"),
    "temperature": Field(1.0, MAP, "rollout.temperature"),
    "top_p": Field(1.0, MAP, "rollout.top_p"),
    "top_k": Field(0, MAP, "rollout.top_k (0 or None: all tokens)"),
    "min_p": Field(None, TRAINER, "sampled by transformers' generate with this min_p (rollout.backend="
                   "generate)"),
    "generation_kwargs": Field(None, TRAINER, "temperature / top_p / top_k go to rollout.*; other keys to "
                               "transformers' generate (rollout.backend=generate); do_sample must stay True"),
    "chat_template_kwargs": Field(None, MAP, "task.chat_template_kwargs"),
    "repetition_penalty": Field(1.0, TRAINER, "sampled by transformers' generate with this penalty "
                                "(rollout.backend=generate)"),
    "cache_implementation": Field(None, TRAINER, "sampled by transformers' generate with this KV cache "
                                  "(rollout.backend=generate)"),
    "use_vllm": Field(False, MAP, "rollout.backend = vllm"),
    "vllm_mode": Field("colocate", MAP, "rollout.vllm_mode"),
    "vllm_model_impl": Field("vllm", REFUSE, "vllm"),
    "vllm_enable_sleep_mode": Field(False, MAP, "rollout.vllm_enable_sleep_mode (grpokit's own default: "
                                  "true)"),
    "vllm_structured_outputs_regex": Field(None, REFUSE, "vllm"),
    "vllm_server_base_url": Field(None, DERIVED, "rollout.vllm_server_base_url (None: "
                                  "http://vllm_server_host:vllm_server_port); a `grpokit vllm-serve`: "
                                  "`trl vllm-serve` speaks another API"),
    "vllm_server_host": Field("0.0.0.0", DERIVED, "rollout.vllm_server_base_url"),
    "vllm_server_port": Field(8000, DERIVED, "rollout.vllm_server_base_url"),
    "vllm_server_timeout": Field(240.0, MAP, "rollout.vllm_server_timeout_s"),
    "vllm_group_port": Field(51216, REFUSE, "vllm"),
    "vllm_gpu_memory_utilization": Field(0.3, MAP, "rollout.vllm_gpu_memory_utilization"),
    "vllm_max_model_length": Field(None, MAP, "rollout.vllm_max_model_length (None: prompt + completion "
                                 "lengths)"),
    "vllm_tensor_parallel_size": Field(1, REFUSE, "vllm"),
    "beta": Field(0.0, MAP, "loss.beta"),
    "num_iterations": Field(1, MAP, "loss.num_iterations (mu)"),
    "epsilon": Field(0.2, MAP, "loss.epsilon"),
    "delta": Field(None, MAP, "loss.delta"),
    "epsilon_high": Field(None, MAP, "loss.epsilon_high"),
    "sapo_temperature_neg": Field(1.05, MAP, "loss.sapo_temperature_neg"),
    "sapo_temperature_pos": Field(1.0, MAP, "loss.sapo_temperature_pos"),
    "vespo_k_pos": Field(2.0, MAP, "loss.vespo_k_pos"),
    "vespo_lambda_pos": Field(3.0, MAP, "loss.vespo_lambda_pos"),
    "vespo_k_neg": Field(3.0, MAP, "loss.vespo_k_neg"),
    "vespo_lambda_neg": Field(2.0, MAP, "loss.vespo_lambda_neg"),
    "importance_sampling_level": Field("token", MAP, "loss.importance_sampling_level"),
    "reward_weights": Field(None, TRAINER, "the weight of each reward function (None: 1.0 each)"),
    "multi_objective_aggregation": Field("sum_then_normalize", MAP, "loss.multi_objective_aggregation"),
    "scale_rewards": Field("group", MAP, "loss.scale_rewards (True: group, False: none)"),
    "loss_type": Field("dapo", MAP, "loss.loss_type: grpo | bnpo | dr_grpo | dapo | cispo | sapo | luspo | "
                       "vespo"),
    "mask_truncated_completions": Field(False, MAP, "loss.mask_truncated_completions"),
    "sync_ref_model": Field(False, DERIVED, "loss.ref_model_sync_steps = ref_model_sync_steps if True, "
                            "else 0"),
    "ref_model_mixup_alpha": Field(0.6, DERIVED, "loss.ref_model_mixup_alpha (with sync_ref_model)"),
    "ref_model_sync_steps": Field(512, DERIVED, "loss.ref_model_sync_steps (with sync_ref_model)"),
    "top_entropy_quantile": Field(1.0, MAP, "loss.top_entropy_quantile"),
    "entropy_coef": Field(0.0, MAP, "loss.entropy_coef"),
    "use_adaptive_entropy": Field(False, MAP, "loss.use_adaptive_entropy"),
    "entropy_coef_min": Field(0.0, MAP, "loss.entropy_coef_min"),
    "entropy_coef_max": Field(1.0, MAP, "loss.entropy_coef_max"),
    "entropy_coef_delta": Field(0.005, MAP, "loss.entropy_coef_delta"),
    "entropy_target": Field(0.2, MAP, "loss.entropy_target"),
    "max_tool_calling_iterations": Field(None, MAP, "rollout.max_tool_calling_iterations (the tool loop of "
                                         "GRPOTrainer(tools=..., environment_factory=...); docs/agents.md)"),
    "vllm_importance_sampling_correction": Field(True, DERIVED, "with use_vllm: loss.tis_level (False: "
                                                 "none)"),
    "vllm_importance_sampling_mode": Field("sequence_mask", DERIVED, "with use_vllm: loss.tis_level (token | "
                                           "sequence) and loss.tis_mode (truncate | mask)"),
    "vllm_importance_sampling_clip_max": Field(3.0, DERIVED, "with use_vllm: loss.tis_cap"),
    "vllm_importance_sampling_clip_min": Field(None, DERIVED, "with use_vllm: loss.tis_min"),
    "off_policy_mask_threshold": Field(None, MAP, "loss.off_policy_mask_threshold"),
    "use_bias_correction_kl": Field(True, MAP, "loss.use_bias_correction_kl (the KL weighted by the ratio)"),
    "log_completions": Field(False, MAP, "run.log_completions_steps = logging_steps"),
    "log_multimodal": Field(True, SAME, "grpokit trains text-only models"),
    "num_completions_to_print": Field(None, SAME, "console only: grpokit prints no completion table (they go "
                                      "to its completions log, run.log_completions_steps)"),
    "log_unique_prompts": Field(False, REFUSE, "logging"),
    "log_completions_hub_repo": Field(None, REFUSE, "hub"),
    "use_transformers_continuous_batching": Field(False, REFUSE, "generation"),
    "transformers_continuous_batching_config": Field(None, REFUSE, "generation"),
    "use_transformers_paged": Field(False, REFUSE, "generation"),
    "vllm_importance_sampling_cap": Field(None, DERIVED, "with use_vllm: loss.tis_cap (deprecated "
                                          "spelling of vllm_importance_sampling_clip_max)"),
}

FIELDS: dict[str, Field] = {**_INHERITED, **_GRPO}


def mapping_table() -> str:
    """The field-by-field Markdown table of docs/coming_from_trl.md, generated from FIELDS."""
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    rows = ["| TRL field | TRL default | grpokit |", "|---|---|---|"]
    for name, f in FIELDS.items():
        if f.kind == REFUSE:
            what = f"refused unless default: {REASONS[f.target]}"
        elif f.kind == SAME:
            what = f"accepted, no effect: {f.target}"
        elif f.kind == TRAINER:
            what = f"GRPOTrainer: {f.target}"
        else:
            what = f.target
        rows.append(f"| `{name}` | `{f.default!r}` | {cell(what)} |")
    return "\n".join(rows)


def refused_summary() -> str:
    """How many fields are refused away from TRL's default, and why (the docs' count, generated)."""
    by_reason: dict[str, int] = {}
    for f in FIELDS.values():
        if f.kind == REFUSE:
            by_reason[f.target] = by_reason.get(f.target, 0) + 1
    ranked = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = ", ".join(f"{reason} {n}" for reason, n in ranked)
    return (f"**{sum(by_reason.values())} of {len(FIELDS)} fields are refused** away from TRL's default "
            f"(by reason: {parts}); the others are mapped, used by the trainer, or accepted with no effect.")


BLOCKS = {"trl-mapping": mapping_table, "trl-refused": refused_summary}   # marker name -> generator


def sync_docs(path: str | Path) -> bool:
    """Rewrite every generated block (between <!-- name:start --> and <!-- name:end -->) of a Markdown file;
    True when it changed.

        python scripts/update_trl_docs.py        # docs/coming_from_trl.md
    """
    page = Path(path)
    text = original = page.read_text(encoding="utf-8")
    for name, generate in BLOCKS.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        head, found, rest = text.partition(start)
        if found:
            _, _, tail = rest.partition(end)
            text = f"{head}{start}\n{generate()}\n{end}{tail}"
    if text != original:
        page.write_text(text, encoding="utf-8")
    return text != original
