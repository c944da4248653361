"""[H] The GRPO loop: `train_grpo` builds the state, then runs `train_step` ([G], step.py) every step.

Around the step: evaluation before, during and after (evaluate.py), checkpoints every run.save_steps
(checkpoint.py, or distributed.py with several ranks), one metrics.jsonl row per step, trackers and
callbacks, Algorithm 1's outer loop (reward-model continual training and a reference reset, iterative.py),
and the final model saved with save_pretrained into run.output_dir/final. All of it inside the run's guard
(guard.py): the output folder's lock, --overwrite as a transaction, SIGINT / SIGTERM after the step.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from grpokit.agents.agent import agent_from_config
from grpokit.config.schema import GRPOConfig
from grpokit.model.devices import empty_cache, place_model, resolve_device
from grpokit.model.loading import load_model_and_tokenizer, without_hub_kernels
from grpokit.model.lora import reference_for, wrap_lora
from grpokit.model.precision import apply_precision, reference_storage
from grpokit.observe.loggers import build_loggers, resolve_report_to
from grpokit.observe.metrics import MetricsWriter, PhaseTimer, finish_step_row, format_console
from grpokit.observe.tracking import Tracker
from grpokit.rewards.scoring import build_reward_funcs
from grpokit.tasks import TaskError, load_examples
from grpokit.train import checkpoint
from grpokit.train.async_rollouts import AsyncRollouts
from grpokit.train.callbacks import Observers, TrainHooks
from grpokit.train.data import PromptStream
from grpokit.train.distributed import Distributed
from grpokit.train.evaluate import evaluate
from grpokit.train.export import save_final
from grpokit.train.generations import check_ranks
from grpokit.train.guard import RunGuard
from grpokit.train.iterative import RewardLoop
from grpokit.train.ppo import build_critic
from grpokit.train.preflight import check_environment, check_prompts, enable_full_determinism
from grpokit.train.state import TrainState, make_optimizer
from grpokit.train.step import step_function

log = logging.getLogger("grpokit")


class Silent:
    """Stands in for the metrics writer and loggers on ranks other than 0: every call does nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def build_state(cfg: GRPOConfig, model=None, tokenizer=None, *, train_examples: list | None = None,
                eval_examples: list | None = None, reward_funcs: list | None = None,
                dist: Distributed | None = None, ref_model=None, agent=None) -> TrainState:
    """Load the policy (or take the given one), its frozen reference (only when beta > 0), data, rewards.

    train_examples / eval_examples: objects with .prompt, .answer, .columns (grpokit.tasks.Example);
    when None they come from the configured task. reward_funcs: (name, fn, weight) triples; None: from
    cfg.reward.funcs. dist: the ranks (`train_grpo` passes the one it opened); None: from the environment.
    ref_model: the frozen reference to use when beta > 0 (None: built from the policy, `reference_for`).
    agent: tools and environments (`grpokit.agents.agent.Agent`); None: from rollout.tools /
    rollout.environment (no tools: single-turn sampling); its environments' get_reward() join the rewards.
    """
    if dist is None:  # torchrun / accelerate launch: N ranks; else a no-op
        dist = Distributed.for_run(cfg.run, device=cfg.model.device)
    dist.check(cfg.rollout.prompts_per_step, cfg.loss.algorithm)
    check_ranks(cfg, dist.world_size)                        # steps_per_generation: checkpoints on ranks
    torch.manual_seed(cfg.run.seed)
    if model is None:
        model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    else:  # a model passed in ends on this rank's device too (grpokit.model.devices)
        model = place_model(model, resolve_device(cfg.model.device), what="the policy")
        without_hub_kernels(model)                           # its layers keep their PyTorch forwards
        if cfg.model.lora_r > 0 and not hasattr(model, "peft_config"):   # model.lora_* apply to it too
            model = wrap_lora(model, cfg.model)
    # fp32, or bf16 compute on fp32 master weights (logged)
    apply_precision(model, cfg)
    # beta = 0: no reference at all; LoRA: the base with adapters disabled (no copy of the weights)
    if ref_model is not None:
        ref_model = place_model(ref_model, resolve_device(cfg.model.device), what="the reference model")
        without_hub_kernels(ref_model)
    ref = reference_storage(ref_model if ref_model is not None else reference_for(model), model) \
        if cfg.loss.beta > 0 else None
    dist.prepare(model)                                      # DDP or FSDP2 (same object back)
    if ref is not None:
        dist.prepare(ref, trainable=False)                   # sharded under FSDP, a plain replica under DDP
    dist.seed(cfg.run.seed)                                  # rank r > 0: its own sampling stream
    optimizer, scheduler = make_optimizer(model, cfg)
    train = train_examples if train_examples is not None else load_examples(cfg.task, cfg.task.train_split)
    evals = eval_examples if eval_examples is not None else (
        load_examples(cfg.task, cfg.task.eval_split) if cfg.run.eval_limit != 0 else [])
    k = cfg.rollout.steps_per_generation                     # a generation takes k * B prompts
    if len(train) < cfg.rollout.prompts_per_step * k:
        raise TaskError(f"the training split has {len(train)} examples, fewer than one batch "
                        f"(rollout.prompts_per_step={cfg.rollout.prompts_per_step}"
                        f"{f' x rollout.steps_per_generation={k}' if k > 1 else ''}): add data or lower "
                        f"rollout.prompts_per_step{' or rollout.steps_per_generation' if k > 1 else ''}")
    critic = None
    if cfg.loss.algorithm == "ppo":  # the comparison baseline: a value model initialised from the policy
        critic = build_critic(model, cfg)
    funcs = reward_funcs or build_reward_funcs(cfg, next(model.parameters()).device)
    agent = agent if agent is not None else agent_from_config(cfg)
    dist.seed_environments(agent, cfg.run.seed)             # rank r > 0: its own episodes
    if agent is not None:   # an environment's get_reward(): one more reward column, weight 1 (TRL's)
        funcs = funcs + [f for f in agent.reward_funcs if f[0] not in {n for n, _, _ in funcs}]
    if not funcs:
        raise TaskError("no reward: name reward.funcs, or use an environment that defines get_reward()")
    # Algorithm 1: trains the rm: reward in place
    loop = RewardLoop(cfg, funcs, dist.rank, dist.world_size) if cfg.run.iterations else None
    stream = dist.shard_stream(PromptStream(train, data_seed(cfg.run), shuffle=cfg.task.shuffle))
    # rollout.async: a worker process samples ahead (started at the first step, after any resume)
    worker = AsyncRollouts(cfg) if cfg.rollout.async_max_staleness is not None else None
    return TrainState(cfg, model, tokenizer, ref, optimizer, scheduler, funcs, stream, evals, critic=critic,
                      dist=dist, reward_loop=loop, agent=agent, async_rollouts=worker)


def train_grpo(cfg: GRPOConfig, model=None, tokenizer=None, *, train_examples: list | None = None,
               eval_examples: list | None = None, hooks: dict[str, Callable] | None = None,
               callbacks: TrainHooks | list | None = None, reward_funcs: list | None = None,
               ref_model=None, agent=None) -> TrainState:
    """[H] The GRPO loop: fresh samples every step, one metrics.jsonl row per step, evaluation before
    and after (when run.eval_limit != 0), checkpoints every run.save_steps, the final model saved with
    save_pretrained into run.output_dir/final.

    hooks (tests only): {"after_step": fn(state, metrics)}. callbacks: transformers-style TrainerCallbacks
    (or a `grpokit.train.callbacks.TrainHooks`); reward_funcs: (name, fn, weight) triples instead of cfg's;
    ref_model: the reference with beta > 0 (None: a frozen copy of the policy, made here); agent: tools and
    environments instead of cfg's (see `build_state`)."""
    resolve_report_to(cfg.run.report_to)  # a missing tracker package fails now, not after loading the model
    check_environment(cfg)                 # the device and optional packages too (grpokit.train.preflight)
    # several ranks: only rank 0 writes, evaluates and saves
    dist = Distributed.for_run(cfg.run, device=cfg.model.device)
    if cfg.run.full_determinism:          # TRL's full_determinism: deterministic kernels, or an error
        enable_full_determinism()
    caller_level = log.level                 # the grpokit logger is the caller's again after the run
    if cfg.run.log_level != "passive":   # TRL's log_level
        log.setLevel(cfg.run.log_level.upper())
    if not dist.is_main:
        log.setLevel(logging.WARNING)
    # rank 0 locks run.output_dir and checks it (deleting nothing); SIGINT / SIGTERM end the run cleanly
    with RunGuard(cfg, dist) as guard, _logger_level_restored(caller_level):
        return _train(cfg, dist, guard, model, tokenizer, train_examples=train_examples,
                      eval_examples=eval_examples, hooks=hooks or {}, callbacks=callbacks,
                      reward_funcs=reward_funcs, ref_model=ref_model, agent=agent)


def _train(cfg: GRPOConfig, dist: Distributed, guard: RunGuard, model, tokenizer, *, train_examples,
           eval_examples, hooks, callbacks, reward_funcs, ref_model, agent) -> TrainState:
    """`train_grpo` inside its RunGuard (grpokit.train.guard)."""
    from tqdm import tqdm

    out_dir = Path(cfg.run.output_dir)
    state = build_state(cfg, model, tokenizer, train_examples=train_examples, eval_examples=eval_examples,
                        reward_funcs=reward_funcs, dist=dist, ref_model=ref_model, agent=agent)
    check_prompts(cfg, state.tokenizer, state.stream.examples, state.eval_examples)  # chat template, lengths
    events = callbacks if isinstance(callbacks, TrainHooks) else TrainHooks(cfg, callbacks)
    state.reward_hooks = events.reward_kwargs()
    guard.prepare_output_dir(state)  # everything loaded: only now may --overwrite move the old run aside
    dist.barrier()
    resumed = state.dist.resume(state, out_dir)
    main = state.dist.is_main
    writer, loggers, tracker = _open_outputs(state, out_dir) if main else (Silent(), Silent(), Silent())
    events.train_begin(state)
    if not resumed and state.eval_examples:
        loggers.log_eval(events.evaluate(_evaluate_and_log(state, writer, "before")))
    timer = PhaseTimer(cuda=next(state.model.parameters()).is_cuda)   # GPU runs sync at phase ends
    step = step_function(cfg)  # GRPO's train_step, or PPO's (the critic baseline): chosen once, here
    bar = tqdm(total=cfg.run.max_steps, initial=state.step, disable=not (cfg.run.progress and main),
               desc="grpo", dynamic_ncols=True)
    trained_s = 0.0  # training seconds in this process, evaluations off the clock (run.max_minutes)
    try:
        while state.step < cfg.run.max_steps:
            # phases inside: generate reward ref_forward old_forward advantage update save log
            with timer("step"), guard.step():   # a SIGINT / SIGTERM now ends the run after this step
                metrics = step(state, timer, Observers(tracker, events))
                if state.reward_loop is not None and state.reward_loop.at_boundary(state.step):
                    with timer("reward_model"):  # Algorithm 1: RM continual training, reference <- policy
                        row = state.reward_loop.end_iteration(state, out_dir if main else None)
                    metrics.update({f"iteration/{k}": v for k, v in row.items() if k != "step"})
                with timer("save"):
                    if (cfg.run.save_steps and state.step % cfg.run.save_steps == 0
                            and state.bad_steps < cfg.run.max_bad_steps):
                        # the row is written after the save: the checkpoint keeps it for a kill in between
                        # one process: checkpoint.py
                        state.dist.save_checkpoint(state, out_dir, metrics_row=metrics)
                        events.save(out_dir / f"checkpoint-{state.step}")
                with timer("log"):
                    _log_step(state, metrics, timer, writer=writer, loggers=loggers, bar=bar, events=events)
            trained_s += timer.pop().get("time/step", 0.0)
            if cfg.run.torch_empty_cache_steps and state.step % cfg.run.torch_empty_cache_steps == 0:
                empty_cache(next(state.model.parameters()).device)   # TRL's torch_empty_cache_steps
            guard.after_step(state)   # the old run goes once this one has a checkpoint; a signal stops here
            if "after_step" in hooks:
                hooks["after_step"](state, metrics)
            if events.step_end(state, metrics):  # a callback set control.should_training_stop
                break
            _stop_on_bad_steps(state, out_dir)
            if _out_of_time(state, trained_s):  # run.max_minutes
                break
            if (cfg.run.eval_steps and state.eval_examples and state.step % cfg.run.eval_steps == 0
                    and state.step < cfg.run.max_steps):   # eval_limit = 0: nothing to evaluate, skip
                loggers.log_eval(events.evaluate(_evaluate_and_log(state, writer, f"step{state.step}")))
        if state.eval_examples:
            loggers.log_eval(events.evaluate(_evaluate_and_log(state, writer, "after")))
    finally:
        bar.close()
        tracker.finish()
        loggers.close()
        if state.async_rollouts is not None:   # the worker stops; the trainer's cores come back
            state.async_rollouts.close()
    writer.close()
    save_final(state, out_dir / "final")
    events.train_end(state)
    return state


def end_ranks(state: TrainState | None) -> None:
    """The end of a distributed `grpokit train` under torchrun, every rank at once: the colocated vLLM
    engine stopped, then the process group closed (`Distributed.close`). `train_grpo` leaves both to its
    caller, who may use them afterwards (`GRPOTrainer.save_model` gathers FSDP shards); a script ends
    them with this call. One process, or a group someone else opened: nothing to do."""
    if state is None or not state.dist.owns_group:
        return
    if state.rollout_engine is not None:     # every rank done sampling; vLLM's teardown ends its groups and
        state.dist.barrier()                 # the default one too (close() checks before its own barrier)
        state.rollout_engine.shutdown()
    state.dist.close()


def _open_outputs(state: TrainState, out_dir: Path) -> tuple[MetricsWriter, object, Tracker]:
    """Rank 0's outputs: config.json, metrics.jsonl (from the resumed step on), the experiment loggers
    and the completions / prompts tracker."""
    cfg = state.cfg
    (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    writer = MetricsWriter(out_dir / "metrics.jsonl", start_step=state.step)
    loggers = build_loggers(cfg.run.report_to, out_dir, cfg.to_dict(), start_step=state.step)
    return writer, loggers, Tracker.from_config(cfg, out_dir, state.step, state.stream.examples, loggers)


def _log_step(state: TrainState, metrics: dict, timer: PhaseTimer, *, writer, loggers, bar, events) -> None:
    """One step's row: metrics.jsonl, the trackers, the progress bar and, every logging_steps, a console
    line."""
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


def _out_of_time(state: TrainState, trained_s: float) -> bool:
    """run.max_minutes spent; every rank stops at the same step (the first rank past the budget decides)."""
    budget = 60 * state.cfg.run.max_minutes
    if not budget or state.dist.all_true(trained_s < budget):
        return False
    log.info("run.max_minutes=%g reached after step %d (%.0f s of training)", state.cfg.run.max_minutes,
             state.step, trained_s)
    return True


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
    """Greedy held-out evaluation; appended to eval.jsonl and logged (rank 0 only; {} on other ranks).

    Several ranks: rank 0 evaluates while the others wait for it (`on_main(patient=True)`: not under the
    process group's timeout, which a long evaluation would outlast), so no rank runs ahead into the next
    step's collectives."""
    cfg = state.cfg
    with state.dist.unsharded(state.model):  # FSDP: every rank gathers the weights, rank 0 evaluates
        result = state.dist.on_main(lambda: evaluate(
            state.model, state.tokenizer, state.eval_examples, cfg, limit=cfg.run.eval_limit,
            reward_funcs=state.reward_funcs, reward_extra=state.reward_hooks, agent=state.agent),
            patient=True)
    if not state.dist.is_main:
        return {}
    row = {"tag": tag, "step": state.step, **result}
    with open(Path(cfg.run.output_dir) / "eval.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    log.info("eval %s (step %d): %s", tag, state.step,
             " ".join(f"{k}={v:.4g}" for k, v in result.items() if isinstance(v, float)))
    return row


def data_seed(run) -> int:
    """The training prompts' order: run.data_seed, else run.seed (TRL's data_seed)."""
    return run.seed if run.data_seed is None else run.data_seed


@contextlib.contextmanager
def _logger_level_restored(level: int):
    """The `grpokit` logger's level back to `level` when the run ends, however it ends."""
    try:
        yield
    finally:
        log.setLevel(level)
