"""TRL's GRPOTrainer on the same model, prompts, reward and token counts as `grpokit bench`.

Run by `grpokit bench --compare-trl` in its own process (so its peak RSS is its own); prints one JSON
line in the same format as grpokit's side. TRL 1.16's defaults are overridden to match grpokit's run:

    loss_type "grpo" (TRL default "dapo")      beta 0.04 (TRL default 0.0)
    bf16 as --trl-precision says: default = TRL's own (bf16=True on the CPU), fp32 = bf16 False
    gradient_checkpointing off (TRL default on)
    generation_batch_size = B * G               (TRL counts completions; one optimizer step per
                                                generation batch, like grpokit's mu = 1 step)
    per_device_train_batch_size = M, gradient_accumulation_steps = B * G / M
                                               M = --micro-batch-size (0: the whole batch), so TRL
                                               runs the same micro-batches as grpokit's
                                               optim.micro_batch_size: equal work, equal memory rules
    min_new_tokens = T with --fixed-length     (EOS blocked: both sides produce B * G * T tokens)
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time

import torch

from grpokit.cli.bench import (
    bench_prompts,
    build_model,
    digit_reward,
    matmul_peak_gflops,
    model_flops,
    parse_args,
    summarize,
)


class _Clock:
    """Wall-clock seconds of wrapped trainer methods, per step."""

    def __init__(self) -> None:
        self.row: dict[str, float] = {}

    def wrap(self, obj, name: str, phase: str, when=None) -> None:
        fn = getattr(obj, name)

        def timed(*a, **k):
            if when is not None and not when():
                return fn(*a, **k)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.row[phase] = self.row.get(phase, 0.0) + time.perf_counter() - t0
        setattr(obj, name, timed)


def run_trl(args) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl import GRPOConfig, GRPOTrainer

    model, tok = build_model(args.size, args.seed, args.mean_length, args.model)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    B, G, T = args.prompts, args.num_generations, args.completion_length
    data = Dataset.from_dict({"prompt": bench_prompts(B) * (args.steps + 1)})
    gen_kwargs = {"min_new_tokens": T} if args.fixed_length else None
    out_dir = tempfile.mkdtemp(prefix="trl-bench-")
    micro = args.micro_batch_size or B * G            # grpokit's optim.micro_batch_size, 0 = whole batch
    cfg = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=micro, generation_batch_size=B * G,
                     gradient_accumulation_steps=B * G // micro, num_generations=G, max_completion_length=T,
                     beta=args.beta, loss_type="grpo", bf16=args.trl_precision == "default", fp16=False,
                     gradient_checkpointing=args.gradient_checkpointing,
                     num_iterations=1, learning_rate=1e-6, temperature=1.0, top_p=1.0, top_k=0,
                     scale_rewards="group", mask_truncated_completions=False, max_steps=args.steps,
                     logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=args.seed,
                     dataloader_num_workers=0, generation_kwargs=gen_kwargs, shuffle_dataset=False,
                     disable_tqdm=True, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0)
    # TRL builds its reference model from the policy's path: save the bench model there first.
    model.save_pretrained(f"{out_dir}/init")
    model.config._name_or_path = f"{out_dir}/init"
    trainer = GRPOTrainer(model=model, reward_funcs=[digit_reward], args=cfg, train_dataset=data,
                          processing_class=tok)
    if trainer.ref_model is not None and model.lm_head.bias is not None:  # --spread-lengths: EOS bias
        trainer.ref_model.lm_head = copy.deepcopy(model.lm_head).requires_grad_(False)
    clock, steps, flops = _Clock(), [], []
    peak, peak_bf16 = matmul_peak_gflops(), matmul_peak_gflops(dtype=torch.bfloat16)
    clock.wrap(trainer, "_generate_single_turn", "generate")
    clock.wrap(trainer, "_calculate_rewards", "reward")
    clock.wrap(trainer, "_get_per_token_logps_and_entropies", "ref_forward",
               when=lambda: not torch.is_grad_enabled())
    clock.wrap(trainer, "_prepare_inputs", "prepare")
    clock.wrap(trainer, "training_step", "train_step")
    orig_gen = trainer._generate_single_turn

    def counting(*a, **k):
        ids, lps = orig_gen(*a, **k)
        clock.row["completion_tokens"] = float(sum(len(c) for c in ids))
        clock.row["prompt_tokens"] = float(sum(len(p) for p in a[0]))
        return ids, lps
    trainer._generate_single_turn = counting

    class StepClock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_pre_optimizer_step(self, *a, **k):
            self.o = time.perf_counter()

        def on_optimizer_step(self, *a, **k):
            clock.row["optimizer"] = time.perf_counter() - self.o

        def on_step_end(self, *a, **k):
            now, r = time.perf_counter(), clock.row
            r["step"], self.t = now - self.t, now
            r["policy_fwd_bwd"] = r.pop("train_step", 0.0) - r.pop("prepare", 0.0)
            n, p = r["completion_tokens"], r.pop("prompt_tokens")
            steps.append(dict(r))
            flops.append(model_flops(model, p, n, p / (B * G), n / (B * G)))
            clock.row = {}
    trainer.add_callback(StepClock())
    trainer.train()
    out = summarize(steps, args.warmup, flops, peak, "trl", peak_bf16=peak_bf16,
                    precision="bf16" if args.trl_precision == "default" else "fp32")
    whole = trainer.args.per_device_train_batch_size == B * G        # 0 = the whole batch, as grpokit's
    return {**out, "micro_batch_size": 0 if whole else trainer.args.per_device_train_batch_size,
            "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps}


if __name__ == "__main__":
    a = parse_args(sys.argv[1:])
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    print(json.dumps(run_trl(a)))
