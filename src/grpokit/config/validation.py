"""Range and consistency checks of a GRPOConfig, one function per concern.

Every failure raises `ConfigError` with one line naming the field and what to change; the config
calls `validate` when it is built, so a bad value never reaches training.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path
from typing import Literal

from grpokit.config.code_checks import check_code
from grpokit.config.overlap_checks import check_reward_overlap
from grpokit.config.reuse_checks import check_generation_reuse, check_padding_free
from grpokit.config.sections import ConfigTree
from grpokit.errors import ConfigError, suggest


def choices(cfg: ConfigTree) -> dict[str, tuple[str, ...]]:
    """{'section.field': its options} for every field typed with a `grpokit.config.choices` Literal."""
    out = {}
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        if not dataclasses.is_dataclass(section):
            continue
        for name, tp in typing.get_type_hints(type(section)).items():
            if typing.get_origin(tp) is Literal:
                out[f"{f.name}.{name}"] = typing.get_args(tp)
    return out


_DEVICE = re.compile(r"auto|cpu|mps|(cuda|xpu)(:\d+)?")


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _check_choices(cfg: ConfigTree) -> None:
    for key, options in choices(cfg).items():
        section, name = key.split(".", 1)
        value = getattr(getattr(cfg, section), name)
        _check(value in options, f"{key} must be one of {', '.join(options)}, got {value!r}"
               f"{suggest(str(value), options)}")


def _check_precision(cfg: ConfigTree) -> None:
    m = cfg.model
    # 16-bit weights compute in their dtype
    wants = {"fp32": "float32", "bf16": "bfloat16"}.get(m.precision)
    _check(m.dtype == "float32" or wants in (None, m.dtype),
           f"model.precision={m.precision} contradicts model.dtype={m.dtype} (16-bit weights compute in "
           "their own dtype): set model.dtype=float32 for fp32 master weights, or model.precision=auto")
    quantized = "load_in_4bit" if m.load_in_4bit else "load_in_8bit" if m.load_in_8bit else None
    _check(not (m.load_in_4bit and m.load_in_8bit), "model.load_in_4bit and model.load_in_8bit are both set: "
           "pick one")
    _check(quantized is None or m.lora_r > 0, f"model.{quantized} freezes the quantized base weights, so "
           "only LoRA adapters can train: set model.lora_r (e.g. 16)")


def _check_rollout(cfg: ConfigTree) -> None:
    r = cfg.rollout
    _check(r.num_generations >= 2, f"rollout.num_generations must be >= 2 (GRPO compares completions "
           f"within a group), got {r.num_generations}")
    _check(r.prompts_per_step >= 1, f"rollout.prompts_per_step must be >= 1, got {r.prompts_per_step}")
    _check(r.max_prompt_length > 0, f"rollout.max_prompt_length must be > 0, got {r.max_prompt_length}")
    _check(r.max_completion_length > 0,
           f"rollout.max_completion_length must be > 0, got {r.max_completion_length}")
    _check(r.temperature > 0, f"rollout.temperature must be > 0, got {r.temperature}")
    _check(0 < r.top_p <= 1, f"rollout.top_p must be in (0, 1], got {r.top_p}")
    _check(r.top_k >= 0, f"rollout.top_k must be >= 0 (0 keeps all tokens), got {r.top_k}")
    _check(r.max_resample_rounds >= 0,
           f"rollout.max_resample_rounds must be >= 0, got {r.max_resample_rounds}")
    _check(0 < r.vllm_gpu_memory_utilization <= 1,
           f"rollout.vllm_gpu_memory_utilization must be in (0, 1], got {r.vllm_gpu_memory_utilization}")
    lo = cfg.loss
    _check(lo.tis_cap is None or lo.tis_cap >= 1,
           f"loss.tis_cap must be >= 1 (weights above it are truncated), got {lo.tis_cap}")
    _check(lo.tis_min is None or 0 <= lo.tis_min < (lo.tis_cap or float("inf")),
           f"loss.tis_min must be in [0, loss.tis_cap), got {lo.tis_min}")
    _check(lo.tis_mode == "mask" or lo.tis_cap is not None or lo.tis_min is not None,
           "loss.tis_mode=truncate needs a bound: set loss.tis_cap (or loss.tis_min)")
    _check(r.reuse_activations in (False, True, "auto"),
           f"rollout.reuse_activations must be true, false or auto, got {r.reuse_activations!r}")
    for name, value in (("generation_batch_size", r.generation_batch_size),):
        _check(value >= 0, f"rollout.{name} must be >= 0 (0 = whole batch), got {value}")
        _check(value == 0 or value % r.num_generations == 0,
               f"rollout.{name} ({value}) must be a multiple of num_generations ({r.num_generations})")


def _check_vllm(cfg: ConfigTree) -> None:
    """rollout.backend=vllm: what grpokit.rollout.vllm_engine cannot drive, refused before any engine
    starts."""
    r = cfg.rollout
    _check(r.vllm_kv_cache_gib >= 0, f"rollout.vllm_kv_cache_gib must be >= 0 (0 = vLLM's sizing), got "
           f"{r.vllm_kv_cache_gib}")
    _check(r.vllm_cpu_threads >= 0,
           f"rollout.vllm_cpu_threads must be >= 0 (0 = as is), got {r.vllm_cpu_threads}")
    _check(r.vllm_enforce_eager in (False, True, "auto"),
           f"rollout.vllm_enforce_eager must be true, false or auto, got {r.vllm_enforce_eager!r}")
    longest = r.max_prompt_length + r.max_completion_length
    _check(r.vllm_max_model_length is None or r.vllm_max_model_length >= longest,
           f"rollout.vllm_max_model_length={r.vllm_max_model_length} is shorter than max_prompt_length + "
           f"max_completion_length = {longest}: raise it, or null for exactly that")
    if r.backend != "vllm":
        return
    _check(r.reuse_activations is not True, "rollout.reuse_activations=true needs grpokit's own sampler, "
           "but rollout.backend=vllm samples elsewhere: set rollout.reuse_activations=auto or false")
    _check(r.vllm_server_base_url.startswith(("http://", "https://")),
           f"rollout.vllm_server_base_url must start with http://, got {r.vllm_server_base_url!r}")
    _check(not cfg.run.fsdp, "run.fsdp=true with rollout.backend=vllm: the engine's weight sync reads whole "
           "tensors and FSDP holds each rank's shards: set run.fsdp=false (DDP) or rollout.backend=fast")
    if r.vllm_mode == "server":
        for key, value, flag in (("vllm_kv_cache_gib", r.vllm_kv_cache_gib, "--kv-cache-gib"),
                                 ("vllm_cpu_threads", r.vllm_cpu_threads, "--threads")):
            _check(not value, f"rollout.{key} sizes a colocated engine; with rollout.vllm_mode=server "
                   f"pass it to the server (grpokit vllm-serve {flag}) and drop rollout.{key}")
    _check(cfg.model.dtype != "float16" or r.vllm_mode == "server" or not cfg.model.device.startswith("cpu"),
           "rollout.backend=vllm on CPU has no float16 kernels: set model.dtype=float32 or bfloat16")


def _check_async(cfg: ConfigTree) -> None:
    """rollout.async.* (grpokit.train.async_rollouts): the schedule's bounds and what a worker cannot do."""
    r, K = cfg.rollout, cfg.rollout.async_max_staleness
    _check(r.async_worker_threads >= 0, f"rollout.async.worker_threads must be >= 0 (0 = half the cores; "
           f"the trainer's threads at max_staleness=0), got {r.async_worker_threads}")
    _check(r.async_max_restarts >= 0, f"rollout.async.max_restarts must be >= 0, got {r.async_max_restarts}")
    _check(r.async_heartbeat_stale_after_s > 0, "rollout.async.heartbeat_stale_after_s must be > 0, got "
           f"{r.async_heartbeat_stale_after_s}")
    if K is None:
        return
    _check(K >= 0, f"rollout.async.max_staleness must be >= 0 (or none for synchronous runs), got {K}")
    N = r.async_weight_sync_steps
    _check(1 <= N <= K + 1, f"rollout.async.weight_sync_steps={N} must be between 1 and max_staleness + 1 = "
           f"{K + 1} (a batch may lag at most K versions): lower it or raise rollout.async.max_staleness")
    refused = {"rollout.dynamic_sampling": (r.dynamic_sampling, "resamples inside the step"),
               "rollout.tools / rollout.environment": (bool(r.tools or r.environment),
                                                       "tool loops run in the trainer's process"),
               "rollout.vllm_mode=colocate": (r.backend == "vllm" and r.vllm_mode == "colocate",
                                              "the engine shares the trainer's process: use server mode"),
               "loss.algorithm=ppo": (cfg.loss.algorithm == "ppo", "the critic baseline is synchronous"),
               "run.iterations": (bool(cfg.run.iterations), "Algorithm 1 relabels the step's own samples")}
    for key, (on, why) in refused.items():
        _check(not on, f"rollout.async.max_staleness with {key}: not supported ({why}): drop one of them")


def _check_tree(cfg: ConfigTree) -> None:
    """rollout.tree.* (grpokit.rollout.tree): a tree with num_generations leaves, forking inside T."""
    r = cfg.rollout
    widths, at = r.tree_widths, r.tree_branch_at
    if not widths:
        _check(not at, "rollout.tree.branch_at needs rollout.tree.widths (children per depth): set both")
        return
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in [*widths, *at])
    _check(ints and min(widths) >= 1, f"rollout.tree.widths and branch_at must be integers, widths >= 1 "
           f"(e.g. rollout.tree.widths=[2,4] rollout.tree.branch_at=[8]), got {widths} and {at}")
    _check(math.prod(widths) == r.num_generations, f"rollout.tree.widths={widths} has {math.prod(widths)} "
           f"leaves but rollout.num_generations={r.num_generations}: make their product G")
    _check(len(at) == len(widths) - 1, f"rollout.tree.branch_at needs {len(widths) - 1} token counts "
           f"(one per width after the first), got {at}")
    _check(all(a < b for a, b in zip([0, *at], at)) and (not at or at[-1] < r.max_completion_length),
           f"rollout.tree.branch_at={at} must increase, each between 1 and rollout.max_completion_length - 1 "
           f"({r.max_completion_length - 1})")
    _check(math.isfinite(r.tree_segment_weight), "rollout.tree.segment_weight must be a finite number")
    refused = {"rollout.backend": (r.backend != "auto" and r.backend != "fast",
                                   "forking needs grpokit's sampler: set rollout.backend=auto"),
               "rollout.tools / rollout.environment": (bool(r.tools or r.environment), "one turn per leaf"),
               "rollout.async.max_staleness": (r.async_max_staleness is not None, "the worker samples flat"),
               "rollout.dynamic_sampling": (r.dynamic_sampling, "it regroups rows across rounds"),
               "loss.algorithm=ppo": (cfg.loss.algorithm == "ppo", "the critic's values replace the tree's"),
               "loss.multi_objective_aggregation=normalize_then_sum":
                   (cfg.loss.multi_objective_aggregation == "normalize_then_sum", "the tree uses one reward")}
    for key, (on, why) in refused.items():
        _check(not on, f"rollout.tree.widths with {key}: not supported ({why}): drop one of them")


def _check_mcts(cfg: ConfigTree) -> None:
    """rollout.mcts.* (grpokit.train.mcts_rollouts): the search's settings, and what it cannot run with."""
    r = cfg.rollout
    if not r.mcts_enabled:
        return
    _check(r.mcts_width >= 1, f"rollout.mcts.width must be >= 1 (progressive widening), got {r.mcts_width}")
    _check(r.mcts_max_tokens is None or r.mcts_max_tokens >= 1,
           f"rollout.mcts.max_tokens must be >= 1 or null (no budget), got {r.mcts_max_tokens}")
    _check(math.isfinite(r.mcts_exploration) and r.mcts_exploration >= 0,
           f"rollout.mcts.exploration must be a finite number >= 0, got {r.mcts_exploration}")
    _check(r.mcts_separator != "", "rollout.mcts.separator is empty: give the text ending a step, e.g. '. '")
    _check(r.mcts_value in ("reward", "steps") or Path(r.mcts_value).is_dir(),
           f"rollout.mcts.value must be reward, steps or a reward-model folder; {r.mcts_value!r} is none "
           f"of them{suggest(r.mcts_value, ['reward', 'steps'])}")
    refused = {"rollout.backend": (r.backend not in ("auto", "fast"), "grpokit's sampler decodes the steps"),
               "rollout.tools / rollout.environment": (bool(r.tools or r.environment), "one turn"),
               "rollout.async.max_staleness": (r.async_max_staleness is not None, "the worker samples flat"),
               "rollout.dynamic_sampling": (r.dynamic_sampling, "it regroups rows"),
               "rollout.tree.widths": (bool(r.tree_widths), "one search per group"),
               "loss.algorithm=ppo": (cfg.loss.algorithm == "ppo", "the critic replaces the search")}
    for key, (on, why) in refused.items():
        _check(not on, f"rollout.mcts.enabled with {key}: not supported ({why}): drop one of them")


def _check_agents(cfg: ConfigTree) -> None:
    """rollout.tools / rollout.environment (grpokit.agents): the tool loop's limits and what it needs."""
    r = cfg.rollout
    _check(r.tool_timeout > 0, f"rollout.tool_timeout must be > 0 seconds, got {r.tool_timeout}")
    _check(r.max_tool_output_chars >= 0,
           f"rollout.max_tool_output_chars must be >= 0 (0 = never cut), got {r.max_tool_output_chars}")
    _check(r.max_tool_calling_iterations is None or r.max_tool_calling_iterations >= 0,
           f"rollout.max_tool_calling_iterations must be >= 0 or null, got {r.max_tool_calling_iterations}")
    for name in r.tools:
        _check(isinstance(name, str) and ":" in name,
               f"rollout.tools entry {name!r} is not an import path: write it as package.module:function")
    _check(cfg.task.name != "environment" or bool(r.environment),
           "task.name=environment has no data of its own: set rollout.environment (its reset() makes the "
           "prompts), or choose another task")
    if not r.tools and not r.environment:
        return
    _check(r.backend != "generate", "rollout.tools / rollout.environment run in grpokit's own sampler or on "
           "vLLM, not model.generate: set rollout.backend=auto or vllm")
    _check(cfg.loss.algorithm == "grpo", "rollout.tools / rollout.environment train with GRPO: set "
           "loss.algorithm=grpo")


def _check_loss(cfg: ConfigTree) -> None:
    lo = cfg.loss
    _check(0 < lo.epsilon < 1, f"loss.epsilon must be in (0, 1), got {lo.epsilon}")
    _check(lo.epsilon_high is None or lo.epsilon_high > 0,
           f"loss.epsilon_high must be > 0, got {lo.epsilon_high}")
    _check(lo.epsilon_high is None or lo.epsilon_high >= lo.epsilon,
           f"loss.epsilon_high ({lo.epsilon_high}) must be >= loss.epsilon ({lo.epsilon})")
    _check(lo.delta is None or lo.delta > 1 + cfg.epsilon_high,
           f"loss.delta must be > 1 + epsilon_high ({1 + cfg.epsilon_high}), got {lo.delta}")
    _check(lo.beta >= 0, f"loss.beta must be >= 0 (0 disables the KL penalty), got {lo.beta}")
    _check(lo.num_iterations >= 1, f"loss.num_iterations (mu) must be >= 1, got {lo.num_iterations}")
    _check(lo.ref_model_sync_steps >= 0,
           f"loss.ref_model_sync_steps must be >= 0, got {lo.ref_model_sync_steps}")
    _check(0 < lo.ref_model_mixup_alpha <= 1,
           f"loss.ref_model_mixup_alpha must be in (0, 1], got {lo.ref_model_mixup_alpha}")
    _check(not (lo.kl_in_reward and lo.beta == 0), "loss.kl_in_reward needs loss.beta > 0")
    _check_objective_variants(cfg)
    _check(0 <= lo.gamma <= 1 and 0 <= lo.lam <= 1, f"loss.gamma and loss.lam must be in [0, 1], got "
           f"{lo.gamma} and {lo.lam}")
    _check(lo.vf_coef > 0, f"loss.vf_coef must be > 0, got {lo.vf_coef}")
    _check(lo.cliprange_value > 0, f"loss.cliprange_value must be > 0, got {lo.cliprange_value}")
    _check(lo.algorithm != "ppo" or not cfg.model.lora_r,
           "loss.algorithm=ppo is a full fine-tuning baseline: set model.lora_r=0 or loss.algorithm=grpo")
    _check(lo.algorithm != "ppo" or not cfg.run.resume, "loss.algorithm=ppo does not checkpoint its value "
           "model: drop run.resume or use loss.algorithm=grpo")


def _check_objective_variants(cfg: ConfigTree) -> None:
    """The loss types of grpokit.core.policy_terms, the token filters and the entropy bonus."""
    lo = cfg.loss
    _check(lo.sapo_temperature_pos > 0 and lo.sapo_temperature_neg > 0,
           "loss.sapo_temperature_pos and loss.sapo_temperature_neg must be > 0")
    _check(min(lo.vespo_k_pos, lo.vespo_lambda_pos, lo.vespo_k_neg, lo.vespo_lambda_neg) >= 0,
           "loss.vespo_k_pos, vespo_lambda_pos, vespo_k_neg and vespo_lambda_neg must be >= 0")
    _check(0 <= lo.top_entropy_quantile <= 1,
           f"loss.top_entropy_quantile must be in [0, 1] (1 = all tokens), got {lo.top_entropy_quantile}")
    _check(lo.off_policy_mask_threshold is None or lo.off_policy_mask_threshold >= 0,
           f"loss.off_policy_mask_threshold must be >= 0 or None, got {lo.off_policy_mask_threshold}")
    _check(0 <= lo.entropy_coef_min <= lo.entropy_coef_max,
           f"loss.entropy_coef_min ({lo.entropy_coef_min}) must be in [0, loss.entropy_coef_max "
           f"({lo.entropy_coef_max})]")
    _check(lo.entropy_coef_delta >= 0, f"loss.entropy_coef_delta must be >= 0, got {lo.entropy_coef_delta}")
    _check(lo.algorithm == "grpo" or (lo.loss_type in ("grpo", "bnpo", "dr_grpo", "dapo")
                                      and lo.entropy_coef == 0 and not lo.use_adaptive_entropy),
           f"loss.algorithm=ppo compares against the clipped objective: use loss.loss_type grpo, bnpo, "
           f"dr_grpo or dapo and no entropy bonus (got {lo.loss_type})")
    _check(lo.loss_type != "vespo" or cfg.rollout.backend != "vllm" or lo.tis_level in ("token", "none"),
           "loss.loss_type=vespo folds the sampler correction into its per-token weights: set "
           "loss.tis_level=token (or none)")


def _check_optim_and_run(cfg: ConfigTree) -> None:
    o, run = cfg.optim, cfg.run
    _check(o.learning_rate > 0, f"optim.learning_rate must be > 0, got {o.learning_rate}")
    _check(o.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {o.weight_decay}")
    _check(0 <= o.adam_beta1 < 1 and 0 <= o.adam_beta2 < 1, "optim.adam_beta1/adam_beta2 must be in [0, 1)")
    _check(o.adam_epsilon > 0, f"optim.adam_epsilon must be > 0, got {o.adam_epsilon}")
    _check(o.max_grad_norm >= 0, f"optim.max_grad_norm must be >= 0 (0 disables), got {o.max_grad_norm}")
    _check(o.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {o.warmup_steps}")
    _check(o.micro_batch_size >= 0, f"optim.micro_batch_size must be >= 0, got {o.micro_batch_size}")
    _check(o.micro_batch_size == 0 or cfg.batch_size % o.micro_batch_size == 0,
           f"optim.micro_batch_size ({o.micro_batch_size}) must divide the generation batch "
           f"prompts_per_step * num_generations = {cfg.batch_size}")
    _check(bool(run.output_dir.strip()), "run.output_dir is empty: give a folder for the run, e.g. "
           "run.output_dir=runs/my-run")
    _check(run.max_steps >= 1, f"run.max_steps must be >= 1, got {run.max_steps}")
    _check(run.max_minutes >= 0, f"run.max_minutes must be >= 0 (0 = no time budget), got {run.max_minutes}")
    _check(run.logging_steps >= 1, f"run.logging_steps must be >= 1, got {run.logging_steps}")
    for name in ("eval_steps", "save_steps", "log_completions_steps", "save_total_limit"):
        _check(getattr(run, name) >= 0, f"run.{name} must be >= 0, got {getattr(run, name)}")
    _check(run.eval_limit >= -1, f"run.eval_limit must be >= -1 (-1 = all), got {run.eval_limit}")
    _check(run.resume in (False, True, "auto"), f"run.resume must be true, false or auto, got {run.resume!r}")
    _check(not (run.resume and run.overwrite), "run.resume and run.overwrite conflict: --resume continues "
           "the run in output_dir, --overwrite deletes it; pass only one")
    _check(run.max_bad_steps >= 1, f"run.max_bad_steps must be >= 1, got {run.max_bad_steps}")
    _check(run.ddp_bucket_cap_mb >= 1, f"run.ddp_bucket_cap_mb must be >= 1 MiB, got {run.ddp_bucket_cap_mb}")
    _check(run.data_seed is None or run.data_seed >= 0, f"run.data_seed must be >= 0 or null (run.seed), "
           f"got {run.data_seed}")


def _check_reward_model_task(cfg: ConfigTree) -> None:
    r, lo = cfg.rollout, cfg.loss
    # an environment's get_reward() may be the only reward (checked when the environment is built)
    _check(bool(cfg.reward.funcs) or bool(r.environment),
           "reward.funcs is empty: name at least one reward, e.g. {rule: 1.0}")
    for name, weight in cfg.reward.funcs.items():
        _check(isinstance(weight, (int, float)) and not isinstance(weight, bool),
               f"reward.funcs.{name} weight must be a number, got {weight!r}")
    _check(cfg.reward.overlong_buffer >= 0,
           f"reward.overlong_buffer must be >= 0, got {cfg.reward.overlong_buffer}")
    _check(cfg.reward.overlong_buffer < r.max_completion_length,
           f"reward.overlong_buffer ({cfg.reward.overlong_buffer}) must be < rollout.max_completion_length "
           f"({r.max_completion_length})")
    _check(cfg.reward.step_correct_reward > cfg.reward.step_wrong_reward,
           f"reward.step_correct_reward ({cfg.reward.step_correct_reward}) must be > "
           f"reward.step_wrong_reward ({cfg.reward.step_wrong_reward}): a right step must earn more "
           "than a wrong one")
    device = cfg.model.device
    _check(_DEVICE.fullmatch(device) is not None, f"model.device must be auto, cpu, cuda, cuda:N or mps, "
           f"got {device!r}{suggest(device, ('auto', 'cpu', 'cuda', 'mps'))}")
    _check(bool(cfg.model.lora_target_modules) or not cfg.model.lora_r,
           "model.lora_target_modules is empty: name the modules LoRA wraps, e.g. "
           "q_proj,k_proj,v_proj,o_proj")
    _check(cfg.model.lora_r >= 0, f"model.lora_r must be >= 0 (0 = full fine-tuning), got {cfg.model.lora_r}")
    _check(not (cfg.model.lora_r and lo.ref_model_sync_steps),
           "loss.ref_model_sync_steps needs full fine-tuning: with model.lora_r > 0 the reference is "
           "the base model itself; set loss.ref_model_sync_steps=0")
    t = cfg.task
    _check(t.name not in ("jsonl", "hf", "mbpp", "code") or t.path is not None,
           f"task.path is required for task.name={t.name}: give the jsonl file")
    _check(t.digits >= 1 and t.terms >= 2, "task.digits must be >= 1 and task.terms >= 2")
    _check(bool(t.operators) and set(t.operators) <= set("+-*"),
           f"task.operators must be a non-empty subset of '+-*', got {t.operators!r}")
    _check(t.few_shot >= 0, f"task.few_shot must be >= 0, got {t.few_shot}")
    _check(t.few_shot_traces in (None, "calculator"),
           f"task.few_shot_traces must be calculator or null, got {t.few_shot_traces!r}")
    _check(t.few_shot_traces is None or (t.few_shot > 0 and t.name == "arithmetic"),
           "task.few_shot_traces needs task.name=arithmetic and task.few_shot > 0 (the examples it writes)")
    _check(t.num_train >= 1 and t.num_eval >= 0, "task.num_train must be >= 1 and task.num_eval >= 0")


def _check_reward_models(cfg: ConfigTree) -> None:
    rm, run = cfg.rm, cfg.run
    _check(_DEVICE.fullmatch(rm.device) is not None and rm.device != "mps",
           f"rm.device must be auto, cpu, cuda or cuda:N, got {rm.device!r}")
    for name in ("batch_size", "epochs", "train_batch_size", "mc_rollouts"):
        _check(getattr(rm, name) >= 1, f"rm.{name} must be >= 1, got {getattr(rm, name)}")
    _check(rm.max_length >= 0, f"rm.max_length must be >= 0 (0 = the model's limit), got {rm.max_length}")
    _check(bool(rm.step_separator), "rm.step_separator is empty: give the text that ends a step, e.g. '\\n'")
    _check(0.0 <= rm.replay_share < 1.0, f"rm.replay_share must be in [0, 1), got {rm.replay_share}")
    _check(rm.learning_rate > 0, f"rm.learning_rate must be > 0, got {rm.learning_rate}")
    _check(run.iterations >= 0 and run.steps_per_iteration >= 0,
           "run.iterations and run.steps_per_iteration must be >= 0")
    if not run.iterations:
        return
    learned = [n for n in cfg.reward.funcs if str(n).startswith("rm:")]
    _check(len(learned) == 1,
           f"run.iterations={run.iterations} trains one learned reward model: reward.funcs "
           f"needs exactly one 'rm:PATH' entry, has {len(learned)}")
    _check(run.steps_per_iteration >= 1, "run.iterations > 0 needs run.steps_per_iteration >= 1 (M)")
    _check(run.max_steps == run.iterations * run.steps_per_iteration,
           f"run.max_steps ({run.max_steps}) must equal run.iterations * run.steps_per_iteration "
           f"({run.iterations * run.steps_per_iteration}): "
           f"set run.max_steps={run.iterations * run.steps_per_iteration}")
    _check(not cfg.model.lora_r, "run.iterations resets the reference to the policy: it needs full "
           "fine-tuning (model.lora_r=0)")


def validate(cfg: ConfigTree) -> None:
    """Every check; each failure is one line naming the field and the fix."""
    for check in (_check_choices, _check_precision, _check_rollout, _check_vllm, _check_async, _check_tree,
                  _check_mcts, _check_agents, _check_loss, _check_optim_and_run, _check_reward_model_task,
                  check_code, _check_reward_models, check_generation_reuse, check_padding_free,
                  check_reward_overlap):
        check(cfg)


def objective_warnings(cfg: ConfigTree) -> list[str]:
    """Valid but probably unintended objective settings, one line each (the trainers log them)."""
    lo, out = cfg.loss, []
    if lo.importance_sampling_level == "sequence" and lo.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
        out.append(f"loss.importance_sampling_level=sequence with loss.loss_type={lo.loss_type}: the loss "
                   "sums token terms, so each completion's sequence ratio counts once per token, which "
                   "weights each sequence by its completion length, not GSPO's per-sequence objective: use "
                   "loss.loss_type=grpo for GSPO")
    if lo.loss_type == "luspo" and lo.importance_sampling_level != "sequence":
        out.append("loss.loss_type=luspo is a sequence-level objective: set "
                   "loss.importance_sampling_level=sequence, as in the LUSPO paper")
    if lo.loss_type == "vespo" and lo.importance_sampling_level != "token":
        out.append("loss.loss_type=vespo weights the whole sequence ratio itself: leave "
                   "loss.importance_sampling_level=token")
    return out
