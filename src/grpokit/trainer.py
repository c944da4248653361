"""[G-H] GRPO training: `train_step` and `train_grpo` (DeepSeekMath, Shao et al. 2024, Algorithm 1).

Every step, with fresh generations from the current policy:

    1. [A] sample   : G completions per prompt                          sample_groups
    2. [B] score    : r_i = sum_k w_k * reward_k(prompt, completion_i)  score_responses
    3. [D] ref      : log pi_ref per token (frozen; skipped when beta=0) per_token_logprobs
    4. [C] advantage: A_i = (r_i - mean(r_group)) / std(r_group)       group_advantages
    5. [E-F] update : mu times, minimize -(clipped surrogate - beta * k3 KL), per token,
                      averaged per completion then over completions     grpo_objective_from_logprobs
    6. log          : one metrics.jsonl row per step

Choices, all from the config: the loss variants live in loss.py and advantages.py as named switches;
this file only wires the phases together, each inside a named timer. Steps 1-2 are `collect_batch`
(collect.py); step 5 is `policy_update` (update.py, where `optimizer_step` moves the weights); the
state a step reads and writes is `TrainState` (state.py). The loop picks the step once
(`step_function`): this GRPO step, or the PPO baseline's `grpokit.ppo.ppo_train_step`. The optional
CPU speed-ups are on for a step's passes through one line, `with fast.accelerated(...)` (grpokit.fast).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from . import checkpoint, fast, run_dir
from .advantages import group_advantages, process_advantages
from .callbacks import TrainHooks
from .collect import collect_batch
from .config import GRPOConfig
from .data import PromptStream
from .distributed import Distributed, Silent
from .evaluate import evaluate
from .iterative import RewardLoop
from .loggers import build_loggers, resolve_report_to
from .lora import is_peft_model, reference_for, save_lora
from .loss import k3_kl
from .metrics import MetricsWriter, PhaseTimer, finish_step_row, format_console, length_stats, reward_stats, \
    tensor_stats
from .model_card import write_model_card
from .models import load_model_and_tokenizer, sync_reference
from .ppo import build_critic, ppo_train_step
from .precision import apply_precision, reference_storage
from .preflight import check_environment, check_prompts
from .rewards import build_reward_funcs
from .rollout import Rollout
from .state import TrainState, make_optimizer
from .tasks import TaskError, load_examples
from .tracking import Tracker
from .update import forward_logprobs, policy_update, skip_update

log = logging.getLogger("grpokit")


def build_state(cfg: GRPOConfig, model=None, tokenizer=None, *, train_examples: list | None = None,
                eval_examples: list | None = None, reward_funcs: list | None = None) -> TrainState:
    """Load the policy (or take the given one), its frozen reference (only when beta > 0), data, rewards.

    train_examples / eval_examples: objects with .prompt, .answer, .columns (grpokit.tasks.Example);
    when None they come from the configured task. reward_funcs: (name, fn, weight) triples; None: from
    cfg.reward.funcs.
    """
    dist = Distributed.from_env(cfg.run.fsdp)  # torchrun / accelerate launch: N ranks; else a no-op
    dist.check(cfg.rollout.prompts_per_step)
    torch.manual_seed(cfg.run.seed)
    if model is None:
        model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    apply_precision(model, cfg)                              # fp32, or bf16 compute on fp32 master weights (logged)
    # beta = 0: no reference at all; LoRA: the base with adapters disabled (no copy of the weights)
    ref = reference_storage(reference_for(model), model) if cfg.loss.beta > 0 else None
    dist.prepare(model)                                      # DDP or FSDP2 (same object back)
    if ref is not None:
        dist.prepare(ref, trainable=False)                   # sharded under FSDP, a plain replica under DDP
    dist.seed(cfg.run.seed)                                  # rank r > 0: its own sampling stream
    optimizer, scheduler = make_optimizer(model, cfg)
    train = train_examples if train_examples is not None else load_examples(cfg.task, cfg.task.train_split)
    evals = eval_examples if eval_examples is not None else (
        load_examples(cfg.task, cfg.task.eval_split) if cfg.run.eval_limit != 0 else [])
    if len(train) < cfg.rollout.prompts_per_step:
        raise TaskError(f"the training split has {len(train)} examples, fewer than one batch "
                        f"(rollout.prompts_per_step={cfg.rollout.prompts_per_step}): add data or lower "
                        "rollout.prompts_per_step")
    critic = None
    if cfg.loss.algorithm == "ppo":  # the comparison baseline: a value model initialised from the policy
        critic = build_critic(model, cfg)
    funcs = reward_funcs or build_reward_funcs(cfg, next(model.parameters()).device)
    loop = RewardLoop(cfg, funcs) if cfg.run.iterations else None  # Algorithm 1: trains the rm: reward in place
    return TrainState(cfg, model, tokenizer, ref, optimizer, scheduler, funcs,
                      dist.shard_stream(PromptStream(train, cfg.run.seed)), evals, critic=critic, dist=dist,
                      reward_loop=loop)


def compute_advantages(cfg: GRPOConfig, rollout: Rollout, rewards: torch.Tensor,
                       step_rewards, dist: Distributed | None = None) -> torch.Tensor:
    """[C] outcome advantages [N], plus process advantages [N, T] when a process reward is configured.

    With several ranks, groups are whole on each rank; the rewards of all ranks are gathered so that
    scale_rewards=batch divides by the whole batch's std, and this rank keeps its rows.
    """
    G = rollout.group_size
    full, mine = (dist or Distributed()).gather_rows(rewards)                      # [N_all], this rank's rows
    adv = group_advantages(full, G, scale_rewards=cfg.loss.scale_rewards)[mine]    # [N]
    if step_rewards is not None:
        T = rollout.completion_ids.shape[1]
        adv = adv[:, None] + process_advantages(step_rewards, G, T)                # [N, T]
    return adv.to(rollout.completion_ids.device)


def train_step(state: TrainState, timer: PhaseTimer | None = None, tracker=None) -> dict[str, float]:
    """[G] One GRPO step on fresh generations; returns this step's metrics.

    tracker: an optional `grpokit.tracking.Tracker` (completions log, per-prompt history).
    """
    cfg, lo = state.cfg, state.cfg.loss
    if lo.algorithm == "ppo":
        raise ValueError("loss.algorithm=ppo: run grpokit.ppo.ppo_train_step on this state "
                         "(train_grpo picks it: step_function)")
    timer = timer or PhaseTimer()
    # Every optional CPU speed-up (C kernels, fused ops, activation reuse: grpokit.fast) is on for this
    # step's passes only; outside this block, and with it left out, the step is plain PyTorch.
    with fast.accelerated(state.model, cfg, ref_model=state.ref_model, world_size=state.dist.world_size,
                         timer=timer):
        rollout, scores, correct, info = collect_batch(state, timer)
        loss_mask = rollout.completion_mask.float()
        if lo.mask_truncated_completions:
            loss_mask = loss_mask * (~rollout.truncated).float()[:, None]  # no EOS: no loss
        with timer("update"):  # the update's micro-batch plan: reuse the sampler's record? decided once, here,
            fast.decide_reuse(state, rollout)  # so a record that won't pay is freed before the passes
        ref_lp = old_lp = None
        if state.ref_model is not None:
            with timer("ref_forward"):
                ref_lp = forward_logprobs(state.ref_model, rollout, cfg,
                                          state.dist.logprobs_fn(state.ref_model))
        if lo.num_iterations > 1:
            with timer("old_forward"):
                old_lp = forward_logprobs(state.model, rollout, cfg,
                                          state.dist.logprobs_fn(state.model))  # once per batch
        rewards = scores.total
        with timer("advantage"):
            if lo.kl_in_reward and ref_lp is not None:
                base = old_lp if old_lp is not None else forward_logprobs(state.model, rollout, cfg,
                                                                          state.dist.logprobs_fn(state.model))
                seq_kl = (k3_kl(base, ref_lp) * rollout.completion_mask).sum(-1)  # [N]
                rewards = rewards - lo.beta * seq_kl.to(rewards.device)
            if torch.isinf(rewards).any():  # NaN marks a skipped score; inf is a broken reward function
                raise FloatingPointError("rewards contain inf: check the reward functions")
            advantages = compute_advantages(cfg, rollout, rewards.cpu(), scores.step_rewards, state.dist)
        skipped_before = state.skipped_updates
        with timer("update"):
            if state.dist.all_true(bool(torch.isfinite(advantages).all())):  # every rank updates, or none
                upd = policy_update(state, rollout, advantages, old_lp=old_lp, ref_lp=ref_lp, loss_mask=loss_mask,
                                    timer=timer)
            else:  # checked before the update: NaN advantages would poison every weight
                upd = {"grad_norm": skip_update(state)}
    if state.skipped_updates > skipped_before:
        _log_bad_batch(state, rollout, "loss or gradient" if "loss" in upd else "advantages")
    if lo.ref_model_sync_steps and state.ref_model is not None and (state.step + 1) % lo.ref_model_sync_steps == 0:
        sync_reference(state.ref_model, state.model, lo.ref_model_mixup_alpha)
    state.step += 1
    with timer("log"):
        adv_flat = advantages if advantages.dim() == 1 else (advantages * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)
        g = state.dist.gather  # several ranks: per-completion values of all ranks, so figures are global
        mask, correct_all = g(rollout.completion_mask), None if correct is None else g(correct)
        metrics = {"step": state.step, **reward_stats(g(scores.total), correct_all, rollout.group_size),
                   **{f"rewards/{k}": float(torch.nanmean(g(v))) for k, v in scores.per_func.items()},
                   **tensor_stats("advantage", g(adv_flat)),
                   **length_stats(mask, g(rollout.truncated), correct_all),
                   **upd, **state.dist.reduce_sums(info), "reward_errors": state.dist.sum(scores.num_errors),
                   "bad_steps": float(state.bad_steps), "skipped_updates": float(state.skipped_updates),
                   "learning_rate": state.scheduler.get_last_lr()[0], "completion_tokens": float(mask.sum())}
        if tracker is not None:
            tracker.observe(state.step, rollout, scores, adv_flat, correct)
    return metrics


def step_function(cfg: GRPOConfig) -> Callable[..., dict[str, float]]:
    """The step the loop runs: GRPO's `train_step`, or `grpokit.ppo.ppo_train_step` for loss.algorithm=ppo."""
    return ppo_train_step if cfg.loss.algorithm == "ppo" else train_step


def save_final(state: TrainState, out_dir: str | Path) -> Path:
    """save_pretrained folder (model + tokenizer + grpokit_config.json) that plain transformers loads."""
    if state.dist.enabled:  # several ranks: rank 0 writes the full weights (gathered from shards under FSDP)
        return state.dist.save_pretrained(state, out_dir)
    out = Path(out_dir)
    with checkpoint.written_aside(out) as tmp:   # then renamed to out: a kill leaves no half export
        if is_peft_model(state.model):  # LoRA: the adapter here, a merged plain model in out/merged
            state.tokenizer.save_pretrained(save_lora(state.model, tmp))
        else:
            state.model.save_pretrained(tmp)
        state.tokenizer.save_pretrained(tmp)
        (tmp / "grpokit_config.json").write_text(json.dumps(state.cfg.to_dict(), indent=2))
        write_model_card(tmp, state.cfg, state.cfg.run.output_dir, {n: w for n, _, w in state.reward_funcs})
    return out


def _log_bad_batch(state: TrainState, rollout: Rollout, what: str) -> None:
    """Warn about a skipped update, naming the batch's prompts (to find the data that caused it)."""
    prompts = [" ".join(str(p).split())[:80] for p in rollout.prompts[::rollout.group_size]]
    log.warning("step %d: non-finite %s, update skipped (%d in a row, run.max_bad_steps=%d); prompts: %s",
                state.step + 1, what, state.bad_steps, state.cfg.run.max_bad_steps, json.dumps(prompts))


def train_grpo(cfg: GRPOConfig, model=None, tokenizer=None, *, train_examples: list | None = None,
               eval_examples: list | None = None, hooks: dict[str, Callable] | None = None,
               callbacks: TrainHooks | list | None = None, reward_funcs: list | None = None) -> TrainState:
    """[H] The GRPO loop: fresh samples every step, one metrics.jsonl row per step, evaluation before
    and after (when run.eval_limit != 0), checkpoints every run.save_steps, the final model saved with
    save_pretrained into run.output_dir/final.

    hooks (tests only): {"after_step": fn(state, metrics)}. callbacks: transformers-style TrainerCallbacks
    (or a `grpokit.callbacks.TrainHooks`); reward_funcs: (name, fn, weight) triples instead of cfg's.
    """
    from tqdm import tqdm

    hooks = hooks or {}
    out_dir = Path(cfg.run.output_dir)
    resolve_report_to(cfg.run.report_to)  # a missing tracker package fails now, not after loading the model
    check_environment(cfg)                 # the device and optional packages too (grpokit.preflight)
    dist = Distributed.from_env(cfg.run.fsdp)  # several ranks: only rank 0 writes, evaluates and saves
    if dist.is_main:
        run_dir.check_output_dir(cfg)   # refuse a busy or unwritable folder now, deleting nothing
    else:
        log.setLevel(logging.WARNING)
    state = build_state(cfg, model, tokenizer, train_examples=train_examples, eval_examples=eval_examples,
                        reward_funcs=reward_funcs)
    check_prompts(cfg, state.tokenizer, state.stream.examples, state.eval_examples)  # chat template, lengths
    events = callbacks if isinstance(callbacks, TrainHooks) else TrainHooks(cfg, callbacks)
    state.reward_hooks = events.reward_kwargs()
    if dist.is_main:  # everything loaded: only now may --overwrite clear the previous run
        run_dir.prepare_output_dir(cfg)
    dist.barrier()
    resumed = state.dist.resume(state, out_dir)
    main = state.dist.is_main
    if main:
        (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    writer = MetricsWriter(out_dir / "metrics.jsonl", start_step=state.step) if main else Silent()
    loggers = build_loggers(cfg.run.report_to, out_dir, cfg.to_dict(), start_step=state.step) if main else Silent()
    tracker = Tracker.from_config(cfg, out_dir, state.step, state.stream.examples, loggers) if main else Silent()
    events.train_begin(state)
    if not resumed and state.eval_examples:
        loggers.log_eval(events.evaluate(_evaluate_and_log(state, writer, "before")))
    timer = PhaseTimer()
    step = step_function(cfg)  # GRPO's train_step, or PPO's (the critic baseline): chosen once, here
    bar = tqdm(total=cfg.run.max_steps, initial=state.step, disable=not (cfg.run.progress and main), desc="grpo",
               dynamic_ncols=True)
    try:
        while state.step < cfg.run.max_steps:
            with timer("step"):  # phases inside: generate reward ref_forward old_forward advantage update save log
                metrics = step(state, timer, tracker)
                if state.reward_loop is not None and state.reward_loop.at_boundary(state.step):
                    with timer("reward_model"):  # Algorithm 1: RM continual training, reference <- policy
                        row = state.reward_loop.end_iteration(state, out_dir if main else None)
                    metrics.update({f"iteration/{k}": v for k, v in row.items() if k != "step"})
                with timer("save"):
                    if (cfg.run.save_steps and state.step % cfg.run.save_steps == 0
                            and state.bad_steps < cfg.run.max_bad_steps):
                        # the row is written after the save: the checkpoint keeps it for a kill in between
                        state.dist.save_checkpoint(state, out_dir, metrics_row=metrics)  # one process: checkpoint.py
                        events.save(out_dir / f"checkpoint-{state.step}")
                with timer("log"):
                    _log_step(state, metrics, timer, writer=writer, loggers=loggers, bar=bar, events=events)
            timer.pop()
            if "after_step" in hooks:
                hooks["after_step"](state, metrics)
            if events.step_end(state, metrics):  # a callback set control.should_training_stop
                break
            _stop_on_bad_steps(state, out_dir)
            if (cfg.run.eval_steps and state.eval_examples and state.step % cfg.run.eval_steps == 0
                    and state.step < cfg.run.max_steps):   # eval_limit = 0: nothing to evaluate, skip
                loggers.log_eval(events.evaluate(_evaluate_and_log(state, writer, f"step{state.step}")))
        if state.eval_examples:
            loggers.log_eval(events.evaluate(_evaluate_and_log(state, writer, "after")))
    finally:
        bar.close()
        tracker.finish()
        loggers.close()
    writer.close()
    save_final(state, out_dir / "final")
    events.train_end(state)
    return state


def _log_step(state: TrainState, metrics: dict, timer: PhaseTimer, *, writer, loggers, bar, events) -> None:
    """One step's row: metrics.jsonl, the trackers, the progress bar and, every logging_steps, a console line."""
    from tqdm import tqdm

    finish_step_row(metrics, timer)  # time/<phase> so far, tokens/s, peak memory
    metrics.update(events.step_metrics())  # what reward functions sent to log_metric
    writer.write({**metrics, **events.step_extras()})
    loggers.log(metrics, state.step)
    bar.update(1)
    bar.set_postfix_str(format_console(metrics, short=True))
    if state.step % state.cfg.run.logging_steps == 0:
        line = f"step {state.step} {format_console(metrics)}"
        if state.cfg.run.progress and state.dist.is_main:
            tqdm.write(line)  # above the progress bar
        else:
            log.info(line)


def _stop_on_bad_steps(state: TrainState, out_dir: Path) -> None:
    """run.max_bad_steps non-finite updates in a row end the run, naming the last good checkpoint."""
    if state.bad_steps < state.cfg.run.max_bad_steps:
        return
    good = checkpoint.list_checkpoints(out_dir)
    raise FloatingPointError(
        f"{state.bad_steps} non-finite updates in a row (run.max_bad_steps): lower "
        f"optim.learning_rate or check the rewards; last good checkpoint: "
        f"{good[-1] if good else f'none (run.save_steps={state.cfg.run.save_steps})'}")


def _evaluate_and_log(state: TrainState, writer, tag: str) -> dict[str, float]:
    """Greedy held-out evaluation; appended to eval.jsonl and logged (rank 0 only; {} on other ranks)."""
    cfg = state.cfg
    with state.dist.unsharded(state.model):  # FSDP: every rank gathers the weights, rank 0 evaluates
        if not state.dist.is_main:
            return {}
        result = evaluate(state.model, state.tokenizer, state.eval_examples, cfg, limit=cfg.run.eval_limit,
                          reward_funcs=state.reward_funcs, reward_extra=state.reward_hooks)
    row = {"tag": tag, "step": state.step, **result}
    with open(Path(cfg.run.output_dir) / "eval.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    log.info("eval %s (step %d): %s", tag, state.step,
             " ".join(f"{k}={v:.4g}" for k, v in result.items() if isinstance(v, float)))
    return row
