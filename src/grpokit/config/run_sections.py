"""The config's run and rm sections: how a run is driven, logged, saved and launched (`RunConfig`), and
the learned reward models with their continual training (`RMConfig`). Part of
`grpokit.config.sections`, which re-exports them."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.config.choices import DDPBackend, LogLevel, RMObjective, RMPrecision, RMTransform, StepLabels
from grpokit.config.field_help import _choice, _f


@dataclass
class RunConfig:
    output_dir: str = _f("runs/grpo", "where metrics, checkpoints and the final model go")
    max_steps: int = _f(100, "optimizer steps")
    max_minutes: float = _f(0.0, "also stop after the step that ends past this many minutes of training in "
                            "this process (evaluations off the clock), then evaluate and save as at "
                            "max_steps; 0 = max_steps only")
    seed: int = _f(0, "seed for data order, sampling and init")
    data_seed: int | None = _f(None, "seed of the training prompts' order alone (None: run.seed); sampling "
                               "and init keep run.seed")
    logging_steps: int = _f(1, "console log every N steps (metrics.jsonl gets every step)")
    eval_steps: int = _f(0, "evaluate on the held-out split every N steps; 0 = start and end only")
    eval_limit: int = _f(0, "held-out problems per evaluation; 0 = none, -1 = all")
    save_steps: int = _f(0, "checkpoint every N steps; 0 = only the final model")
    save_total_limit: int = _f(2, "checkpoints kept")
    save_on_interrupt: bool = _f(False, "on SIGINT / SIGTERM, also checkpoint the step the run stopped after "
                                 "(default: resume from the last periodic checkpoint)")
    resume: bool | str = _f(False, "true: continue from the newest complete checkpoint in output_dir "
                            "(error if none) | auto: continue if there is one, else start fresh | false")
    overwrite: bool = _f(False, "replace the run in output_dir: the old one is kept aside until the new one "
                         "has its first checkpoint (or final model), and put back if it fails before")
    report_to: list = _f([], "extra loggers: tensorboard, wandb, mlflow, trackio")
    run_name: str = _f("", "the run's name in wandb, mlflow and trackio ('' = output_dir's folder name)")
    log_completions_steps: int = _f(0, "write sample completions every N steps; 0 = never")
    track_prompts: bool = _f(False, "per-prompt reward history")
    max_bad_steps: int = _f(3, "stop after this many non-finite updates in a row")
    progress: bool = _f(True, "show a progress bar")
    torch_empty_cache_steps: int = _f(0, "give the accelerator's cached, unused memory back every N steps "
                                      "(torch.cuda.empty_cache: less memory held, a little slower); 0 = "
                                      "never; the CPU keeps no cache")
    log_level: LogLevel = _choice(LogLevel, "passive", before="the `grpokit` logger's level for the run: ",
                                  passive="leave it as the caller set it; the CLI logs info")
    ddp_timeout_s: int = _f(1800, "with several ranks: seconds a collective may wait before the run fails")
    ddp_backend: DDPBackend = _choice(DDPBackend, "auto", before="with several ranks: the process group's "
                                      "backend: ", auto="NCCL for CUDA, gloo otherwise")
    ddp_find_unused_parameters: bool = _f(False, "DDP: look for parameters the forward did not use (needed "
                                          "when some trainable weights get no gradient in a step)")
    ddp_bucket_cap_mb: int = _f(25, "DDP: gradient bucket size in MiB for the all-reduce")
    ddp_broadcast_buffers: bool = _f(True, "DDP: broadcast rank 0's buffers at each forward")
    ddp_static_graph: bool = _f(False, "DDP: the graph is the same every step (lets DDP optimize its hooks)")
    full_determinism: bool = _f(False, "torch.use_deterministic_algorithms(True) (and cuBLAS's workspace "
                                "setting on CUDA): deterministic kernels or an error naming the op")
    fsdp: bool = _f(False, "with several ranks (torchrun): shard weights, gradients and optimizer state "
                    "with PyTorch FSDP2 instead of replicating them (DDP)")
    iterations: int = _f(0, "Algorithm 1: I outer iterations, each: reference <- policy, M policy steps, "
                         "then continual training of the rm: reward on the iteration's samples; 0 = off")
    steps_per_iteration: int = _f(0, "Algorithm 1: M policy steps per iteration (run.max_steps = I * M)")


@dataclass
class RMConfig:
    """Learned reward models (`rm:PATH` in reward.funcs) and their continual training (Algorithm 1)."""

    batch_size: int = _f(32, "texts per reward-model forward pass")
    device: str = _f("auto", "where the reward model runs: auto (the policy's device) | cpu | cuda | cuda:N")
    precision: RMPrecision = _choice(RMPrecision, "fp32", before="reward-model compute: ")
    transform: RMTransform = _choice(RMTransform, "none", before="score squash: ",
                                     none="the raw logit, as TRL", sigmoid="a probability in (0, 1)")
    step_separator: str = _f("\n", "process RM: the text between separators is one step (e.g. a newline, "
                             "'. ' or a step tag)")
    max_length: int = _f(0, "longest reward-model input in tokens (prompt + completion); 0 = the model's "
                         "max_position_embeddings; a longer input is an error")
    continual_training: bool = _f(True, "Algorithm 1: train the RM after each iteration; false = a frozen RM "
                                  "(the comparison), the reference still reset each iteration")
    replay_share: float = _f(0.1, "Algorithm 1: share of historical samples in each continual-training mix")
    learning_rate: float = _f(1e-4, "Algorithm 1: reward-model AdamW learning rate")
    epochs: int = _f(1, "Algorithm 1: passes over each iteration's training mix")
    train_batch_size: int = _f(32, "Algorithm 1: samples per reward-model optimizer step")
    objective: RMObjective = _choice(RMObjective, "pointwise",
                                     pointwise="binary cross-entropy on verifier labels",
                                     pairwise="Bradley-Terry on right/wrong pairs of one prompt")
    step_labels: StepLabels = _choice(StepLabels, "verifier", before="process RM labels: ",
                                      verifier="the arithmetic step checker; the final step by the answer",
                                      mc="Math-Shepherd: a step is good if a rollout from it is right")
    mc_rollouts: int = _f(4, "step_labels=mc: completions sampled from each step prefix")
