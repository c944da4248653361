"""[G] the step and [H] the loop, and what they read and write.

    step         [G] train_step: sample -> score -> reference -> advantage -> update, each phase timed
    update       the policy update: micro-batches, the loss, and `optimizer_step` (`optimizer.step()`)
    loop         [H] train_grpo: build the state, evaluate, step, log, checkpoint, save the final model
    state        TrainState and the optimizer
    collect      [A] + [B] for one step, with DAPO's dynamic sampling
    generations  rollout.steps_per_generation: one generation batch, k steps on its slices, its checkpoint
    mcts_rollouts  rollout.mcts: a tree search per prompt samples its group (value, budget, metrics)
    async_rollouts  rollout.async: the worker's schedule (bounded staleness), restarts, checkpoint state
    ppo          the PPO baseline's step (value model, critic update); its math is in grpokit.core.ppo
    iterative    Algorithm 1's outer loop: reward-model continual training with replay, reference reset
    evaluate     greedy pass@1, sampled pass@k, format rate on a held-out split
    checkpoint   atomic save (manifest with checksums); resume: verified, bit-identical resume;
                 fsdp_checkpoint: the same checkpoint with sharded weights; export: the final model
    distributed  DDP / FSDP2 over torch.distributed
    data         the seeded, resumable prompt order; callbacks: transformers-style callbacks
    preflight    checks before a run starts; run_dir, resume_logs: the output folder (--overwrite too)
    guard        what a run holds while it writes: run_lock (one writer per folder), interrupt (SIGINT,
                 SIGTERM: stop after the step, one line), the --overwrite transaction
    sft          the supervised warm-up that makes the built-in demo checkpoint
"""
