"""TRL's GRPOTrainer on a grpokit config's task, evaluated by grpokit's evaluator: accuracy against time.

    python benchmarks/trl_time_to_accuracy.py configs/smollm2_arith_cpu.yaml --out runs/trl_arith
    grpokit train configs/smollm2_arith_cpu.yaml run.output_dir=runs/smollm2_arith
    grpokit plot runs/smollm2_arith runs/trl_arith --out cmp/    # cmp/time_to_accuracy.png

Both sides read the same config, so they share the model (grpokit's loader; TRL gets a plain
`save_pretrained` copy for its reference), the prompts (grpokit's rendered text: chat template,
instruction, few-shot demonstrations), the rule reward, G, B, the learning rate, beta, epsilon, the
token limit, temperature, AdamW betas, weight decay and gradient clipping. TRL 1.16 keeps its own
default precision (bf16=True with use_cpu=True); its defaults that would change the work are set to
grpokit's: loss_type "grpo" (TRL: "dapo"), one optimizer step per generation batch of B * G
(generation_batch_size = B * G), gradient checkpointing off (TRL: on, which only costs time here).
grpokit's optim.micro_batch_size becomes TRL's per_device_train_batch_size, with the gradient
accumulated over the B * G / micro_batch_size passes (the same update: TRL's "grpo" loss divides each
pass's mean by the accumulation steps); 0 means one pass of B * G rows, as grpokit's 0 does. A whole
GSM8K batch in one pass (32 rows of ~750 tokens, a 49k vocabulary) likely does not fit in 24 GiB: the
one such run logged no step in 30 minutes and ended without a traceback (not verified as memory).
Memory: on the GSM8K recipe this process held 19.5 GiB when the kernel killed it at its "after"
evaluation (TRL's trainer, optimizer and reference beside grpokit's evaluator), with a grpokit
evaluation on the other core. The "after" evaluation now runs once the trainer is freed.

Training ends at run.max_steps or after run.max_minutes of training time, as grpokit's does.
Every run.eval_steps steps the clock stops and grpokit's `evaluate` runs on TRL's live model, in the
precision grpokit's run computes in (model.precision resolved the same way), on the same run.eval_limit
held-out problems. OUT gets metrics.jsonl (step, reward_mean, kl, time/step) and eval.jsonl (grpokit's
rows, tag before / stepN / after), the format `grpokit plot` overlays on a grpokit run.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpokit.cli.eval import eval_config
from grpokit.errors import UserError
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.model.precision import apply_precision
from grpokit.rewards.scoring import rule_rewards
from grpokit.tasks import load_examples, prompt_text
from grpokit.train.evaluate import evaluate


def trl_config(cfg, out_dir: str):
    """TRL's GRPOConfig doing the same work as grpokit's `cfg` (TRL's own precision default kept)."""
    from trl import GRPOConfig

    r, loss, opt = cfg.rollout, cfg.loss, cfg.optim
    n = r.prompts_per_step * r.num_generations
    rows = opt.micro_batch_size or n         # the config already refuses a micro-batch that doesn't divide n
    return GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=rows, generation_batch_size=n,
        gradient_accumulation_steps=n // rows, num_generations=r.num_generations,
        max_completion_length=r.max_completion_length, temperature=r.temperature, top_p=r.top_p,
        top_k=r.top_k, beta=loss.beta, epsilon=loss.epsilon, loss_type=loss.loss_type,
        scale_rewards=loss.scale_rewards, num_iterations=loss.num_iterations,
        mask_truncated_completions=loss.mask_truncated_completions, learning_rate=opt.learning_rate,
        adam_beta1=opt.adam_beta1, adam_beta2=opt.adam_beta2, weight_decay=opt.weight_decay,
        max_grad_norm=opt.max_grad_norm, lr_scheduler_type=opt.lr_scheduler_type,
        warmup_steps=opt.warmup_steps, max_steps=cfg.run.max_steps, seed=cfg.run.seed,
        gradient_checkpointing=False, use_cpu=True, logging_steps=1, report_to=[], save_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True)


def write_row(path: Path, row: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def run(cfg, out: Path, *, before: bool = True) -> None:
    """Train with TRL on `cfg`'s work, evaluating with grpokit's evaluator; rows go to `out`."""
    from datasets import Dataset

    model, tok = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    choice, _ = apply_precision(model, cfg)  # marks the model for grpokit's evaluator only
    train = load_examples(cfg.task, cfg.task.train_split)
    held_out = load_examples(cfg.task, cfg.task.eval_split)
    data = Dataset.from_dict({"prompt": [prompt_text(e, tok) for e in train],
                              "answer": [e.answer for e in train]})
    with tempfile.TemporaryDirectory(prefix="trl-tta-") as tmp:
        model.save_pretrained(f"{tmp}/init")       # TRL builds its reference model from this path
        model.config._name_or_path = f"{tmp}/init"
        _train(cfg, out, model, tok, data, held_out, choice, tmp, before=before)


def _train(cfg, out: Path, model, tok, data, held_out, choice: str, tmp: str, *, before: bool) -> None:
    from transformers import TrainerCallback

    from trl import GRPOTrainer

    def held_out_eval(tag: str, step: int, seconds: float) -> None:
        was_training = model.training
        model.eval()
        result = evaluate(model, tok, held_out, cfg, limit=cfg.run.eval_limit)
        model.train(was_training)
        write_row(out / "eval.jsonl", {"tag": tag, "step": step, **result})
        print(f"eval {tag} (step {step}, {seconds:.0f} s of training): accuracy {result['accuracy']:.3f}",
              flush=True)

    class Clock(TrainerCallback):
        """Training seconds per step; the evaluations in between are off the clock."""

        seconds, t0, dt = 0.0, 0.0, 0.0

        def on_train_begin(self, *a, **k):
            if before:
                held_out_eval("before", 0, 0.0)

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **k):
            self.dt = time.perf_counter() - self.t0
            self.seconds += self.dt
            step = state.global_step
            out_of_time = bool(cfg.run.max_minutes) and self.seconds >= cfg.run.max_minutes * 60
            if out_of_time:                           # run.max_minutes: the same training time as grpokit's
                control.should_training_stop = True
            last = step == cfg.run.max_steps or out_of_time
            if not last and cfg.run.eval_steps and step % cfg.run.eval_steps == 0:
                held_out_eval(f"step{step}", step, self.seconds)

        def on_log(self, args, state, control, logs=None, **k):  # after on_step_end of the same step
            logs = logs or {}
            if "reward" in logs:
                write_row(out / "metrics.jsonl", {"step": state.global_step, "reward_mean": logs["reward"],
                                                  "approx_kl": logs.get("kl"), "time/step": self.dt})

    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=[rule_rewards], args=trl_config(cfg, tmp),
                          train_dataset=data, processing_class=tok, callbacks=[clock])
    print(f"TRL GRPOTrainer: precision bf16={trainer.args.bf16}; grpokit's evaluator computes in {choice}",
          flush=True)
    trainer.train()
    # "after" runs once TRL's trainer, optimizer and reference are gone: beside them, grpokit's evaluator
    # took this process to 19.5 GiB on GSM8K and the kernel killed it (2026-12-03).
    step, seconds = trainer.state.global_step, clock.seconds
    del trainer
    gc.collect()
    held_out_eval("after", step, seconds)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="a grpokit YAML config (the run to compare with)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, as for `grpokit train`")
    p.add_argument("--out", required=True, help="new folder for metrics.jsonl and eval.jsonl")
    p.add_argument("--skip-before", action="store_true",
                   help="no evaluation of the starting model (the same model grpokit's run evaluates before)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"error: --out {out} is not empty: pick a new folder", file=sys.stderr)
        return 2
    try:
        cfg = eval_config(args.config, args.overrides)
    except (UserError, ValueError) as e:  # a bad file or key=value: one line, nothing written
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"grpokit_config": args.config,
                                                 "overrides": args.overrides, "side": "trl"}) + "\n")
    torch.manual_seed(cfg.run.seed)
    run(cfg, out, before=not args.skip_before)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
