"""`grpokit bench --memory`: peak memory of GRPO training steps, where it goes, and next to PPO and TRL.

Every side runs the same work - B prompts x G completions of exactly T tokens (EOS blocked), beta 0.04,
loss_type grpo, fp32, no gradient checkpointing - for `--steps` optimizer steps, in its own fresh
subprocess (so the peak is its own), one side after another:

    grpo       grpokit GRPO: chunked lm-head log-probs, micro-batches of --micro-batch-size completions
    ppo        grpokit PPO with a critic (grpokit.train.ppo), the same micro-batches: + a value model
    trl        TRL GRPOTrainer, the whole generation batch in one forward/backward (TRL's layout)
    trl-micro  TRL GRPOTrainer with --micro-batch-size completions per pass, gradient accumulation
               B*G / micro-batch, one generation per optimizer step

Peak is the process's peak RSS on CPU, torch.cuda.max_memory_allocated on GPU. The breakdown:
weights (every model held: policy, reference, value model), gradients (= the optimizers' weights),
optimizer state (AdamW moments, measured), the largest logits tensor a pass materializes (rows x V
x 4 bytes: grpokit's lm-head chunk, TRL's micro-batch x T), and the rest of the peak over the
process baseline (activations, logits and their temporaries, allocator slack).

    grpokit bench --memory                                    # vocab 49,152, 4 x 8 x 256 tokens
    grpokit bench --memory --sides grpo,ppo --vocab 4096 --completion-length 64

With --config FILE the sides are qlora, lora and full on that recipe instead (grpokit.cli.recipebench).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

import torch

from grpokit import switch
from grpokit.config.schema import ModelConfig, build_config
from grpokit.errors import UserError
from grpokit.model.devices import place_model, resolve_device
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.model.lora import reference_for
from grpokit.model.testing import bench_prompts, build_tokenizer, digit_reward, random_qwen2
from grpokit.observe.metrics import PhaseTimer, peak_rss_mib
from grpokit.rollout.groups import sample_groups
from grpokit.train.ppo import build_critic, ppo_learn
from grpokit.train.state import TrainState, make_optimizer
from grpokit.train.step import compute_advantages
from grpokit.train.update import forward_logprobs, policy_update

SIDES = ("grpo", "ppo", "trl", "trl-micro")
CHUNK_ROWS = 1024  # per_token_logprobs' default lm-head chunk, used by the trainer


def current_rss_mib() -> float:
    """Resident memory of this process now, in MiB (Linux /proc, else psutil)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss / 2**20


def _mib(tensors: Iterable[torch.Tensor]) -> float:
    seen, total = set(), 0
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total / 2**20


def memory_breakdown(models: list[torch.nn.Module], optimizers: list[Any], peak_mib: float,
                     baseline_mib: float, logits_rows: int, vocab: int) -> dict[str, float]:
    """Peak memory and its parts, in MiB (module docstring). Shared storage is counted once."""
    params = [p for m in models for p in list(m.parameters()) + list(m.buffers())]
    trainable = [p for opt in optimizers for g in opt.param_groups for p in g["params"]]  # what has a .grad
    states = [v for opt in optimizers for s in getattr(opt, "optimizer", opt).state.values()
              for v in s.values() if torch.is_tensor(v)]
    out = {"peak_mib": peak_mib, "baseline_mib": baseline_mib, "weights_mib": _mib(params),
           "gradients_mib": _mib(trainable), "optimizer_state_mib": _mib(states),
           "logits_tensor_mib": logits_rows * vocab * 4 / 2**20,
           "trainable_params": sum(p.numel() for p in trainable)}
    out["activations_and_rest_mib"] = peak_mib - baseline_mib - out["weights_mib"] - out["gradients_mib"] \
        - out["optimizer_state_mib"]
    return out


def build_bench_model(args) -> tuple[torch.nn.Module, Any]:
    """The bench's small random-init Qwen2 with `args.vocab` tokens, or a local model / alias (--model)."""
    if args.model:
        return load_model_and_tokenizer(ModelConfig(name_or_path=args.model, device=args.device),
                                        seed=args.seed)
    tok = build_tokenizer(args.vocab)
    model = random_qwen2(tok, "small", args.vocab, args.seed)
    return place_model(model, resolve_device(args.device, where="--device")).train(), tok


def _peak_mib(cuda: bool) -> float:
    return torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mib()


def run_grpokit(args, model, tok, baseline: float) -> dict[str, Any]:
    """grpokit's GRPO or PPO steps on the bench work (the trainer's phases, EOS blocked)."""
    B, G, T = args.prompts, args.num_generations, args.completion_length
    cfg = build_config({"loss.beta": 0.04, "loss.loss_type": "grpo", "loss.algorithm": args.side,
                        "rollout.num_generations": G, "rollout.prompts_per_step": B,
                        "rollout.max_completion_length": T, "optim.micro_batch_size": args.micro_batch_size,
                        "optim.learning_rate": 1e-6, "run.max_steps": args.steps})
    optimizer, scheduler = make_optimizer(model, cfg)
    state = TrainState(cfg, model, tok, reference_for(model), optimizer, scheduler, [], None,
                       critic=build_critic(model, cfg) if args.side == "ppo" else None)
    for _ in range(args.steps):
        timer = PhaseTimer()
        with switch.accelerated(model, cfg, buffers=state.speedup_buffers):   # as the trainer's steps run
            r = sample_groups(model, tok, bench_prompts(B), G, T, suppress_eos=True)
            rewards = torch.tensor(digit_reward(r.completions))
            if args.side == "ppo":
                ppo_learn(state, r, rewards, timer)
            else:
                ref_lp = forward_logprobs(state.ref_model, r, cfg)
                adv = compute_advantages(cfg, r, rewards, None)
                policy_update(state, r, adv, old_lp=None, ref_lp=ref_lp, loss_mask=r.completion_mask.float(),
                              timer=timer)
    models = [model, state.ref_model] + ([state.critic.model] if state.critic else [])
    opts = [optimizer] + ([state.critic.optimizer] if state.critic else [])
    rows = min(CHUNK_ROWS, (args.micro_batch_size or B * G) * T)
    return memory_breakdown(models, opts, _peak_mib(model.device.type == "cuda"), baseline, rows,
                            model.config.vocab_size)


def run_trl(args, model, tok, baseline: float) -> dict[str, Any]:
    """TRL 1.16 GRPOTrainer on the same work, configured like grpokit (module docstring)."""
    import tempfile

    from datasets import Dataset

    from trl import GRPOConfig, GRPOTrainer

    B, G, T = args.prompts, args.num_generations, args.completion_length
    per_pass = args.micro_batch_size if args.side == "trl-micro" else B * G
    data = Dataset.from_dict({"prompt": bench_prompts(B) * (args.steps + 2)})
    out_dir = tempfile.mkdtemp(prefix="trl-mem-")
    # TRL loads its reference from the model's path
    if not Path(model.config._name_or_path or "missing").is_dir():
        model.save_pretrained(out_dir)
        model.config._name_or_path = out_dir
    cfg = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=per_pass,
                     gradient_accumulation_steps=B * G // per_pass, generation_batch_size=B * G,
                     num_generations=G, max_completion_length=T, beta=0.04, loss_type="grpo", bf16=False,
                     fp16=False, gradient_checkpointing=False, num_iterations=1, learning_rate=1e-6,
                     temperature=1.0, top_p=1.0, top_k=0, scale_rewards="group", max_steps=args.steps,
                     logging_steps=1, report_to=[], save_strategy="no", use_cpu=model.device.type == "cpu",
                     seed=args.seed, dataloader_num_workers=0, generation_kwargs={"min_new_tokens": T},
                     shuffle_dataset=False, disable_tqdm=True, adam_beta2=0.99, weight_decay=0.0,
                     max_grad_norm=1.0)
    trainer = GRPOTrainer(model=model, reward_funcs=[digit_reward], args=cfg, train_dataset=data,
                          processing_class=tok)
    trainer.train()
    models = [trainer.model] + ([trainer.ref_model]
                                if getattr(trainer, "ref_model", None) is not None else [])
    return memory_breakdown(models, [trainer.optimizer], _peak_mib(model.device.type == "cuda"), baseline,
                            per_pass * T, model.config.vocab_size)


def run_side(args) -> dict[str, Any]:
    """One side, in this process: build the model, run the steps, measure."""
    torch.manual_seed(args.seed)
    baseline = 0.0 if resolve_device(args.device, where="--device").type == "cuda" else current_rss_mib()
    model, tok = build_bench_model(args)
    run = run_trl if args.side.startswith("trl") else run_grpokit
    out = run(args, model, tok, baseline)
    return {"side": args.side, "device": str(model.device), "vocab": model.config.vocab_size,
            "prompts": args.prompts, "num_generations": args.num_generations,
            "completion_length": args.completion_length, "micro_batch_size": args.micro_batch_size,
            "steps": args.steps, **out}


def _spawn(args, side: str) -> dict[str, Any]:
    argv = [a for a in args.argv if a != "--memory"]
    cmd = [sys.executable, "-m", "grpokit.cli.membench", *argv, "--side", side]
    return run_json_side(cmd, f"bench --memory: the {side} side")


def run_json_side(cmd: list[str], what: str) -> dict:
    """Run one benchmark side in a fresh interpreter (its own peak RSS); its last JSON line."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        if proc.returncode == 2 and errors:  # the child's one-line user error (grpokit.errors) is ours
            raise UserError(errors[-1][len("error: "):])
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{what} failed (exit {proc.returncode}); its stderr is above")
    return json.loads(lines[-1])


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown table of the sides' peaks and breakdowns (MiB)."""
    cols = ("peak_mib", "baseline_mib", "weights_mib", "gradients_mib", "optimizer_state_mib",
            "logits_tensor_mib", "activations_and_rest_mib")
    rows = ["| side | " + " | ".join(c.replace("_mib", "") for c in cols) + " |",
            "|---" * (len(cols) + 1) + "|"]
    for side, r in results.items():
        rows.append(f"| {side} | " + " | ".join(f"{r[c]:.0f}" for c in cols) + " |")
    return "\n".join(rows)


def compare(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The ratios the docs quote: grpokit GRPO over TRL (both layouts), and GRPO's saving over PPO."""
    peak = {k: v["peak_mib"] for k, v in results.items()}
    out: dict[str, float] = {}
    if "grpo" in peak and "trl" in peak:
        out["grpo_over_trl"] = peak["grpo"] / peak["trl"]
    if "grpo" in peak and "trl-micro" in peak:
        out["grpo_over_trl_micro"] = peak["grpo"] / peak["trl-micro"]
    if "grpo" in peak and "ppo" in peak:
        out["grpo_saving_vs_ppo"] = 1.0 - peak["grpo"] / peak["ppo"]
        ex = {k: peak[k] - results[k]["baseline_mib"] for k in ("grpo", "ppo")}
        out["grpo_saving_vs_ppo_over_baseline"] = 1.0 - ex["grpo"] / ex["ppo"]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grpokit bench --memory", description=__doc__.splitlines()[0])
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma list of {', '.join(SIDES)}")
    p.add_argument("--model", default=None,
                   help="local model folder or alias instead of the random-init Qwen2")
    p.add_argument("--vocab", type=int, default=49152, help="V of the random-init bench model")
    p.add_argument("--prompts", type=int, default=4, help="B: prompts per step")
    p.add_argument("--num-generations", type=int, default=8, help="G: completions per prompt")
    p.add_argument("--completion-length", type=int, default=256, help="T: completion tokens (EOS blocked)")
    p.add_argument("--micro-batch-size", type=int, default=8, help="completions per forward/backward")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps (the 2nd holds AdamW state)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)  # from `grpokit bench --memory`
    p.add_argument("--side", choices=SIDES, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    bad = [s for s in args.sides if s not in SIDES]
    if bad:
        p.error(f"unknown side(s) {', '.join(bad)}: choose from {', '.join(SIDES)}")
    if (args.prompts * args.num_generations) % max(args.micro_batch_size, 1):
        p.error("--micro-batch-size must divide prompts x num-generations")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point: each side in its own subprocess, sequentially; prints JSON lines, a table, the ratios."""
    args = parse_args(argv)
    if args.side:
        if args.side in ("grpo", "ppo"):
            switch.for_this_process()   # as the `grpokit` command's own process (its one process-wide step)
        print(json.dumps(run_side(args)))
        return 0
    results: dict[str, dict[str, Any]] = {}
    for side in args.sides:
        if side.startswith("trl"):
            try:
                import trl  # noqa: F401
            except ImportError:
                print(f"bench --memory: skipping {side} (TRL not installed: pip install 'grpokit[bench]')",
                      file=sys.stderr)
                continue
        results[side] = _spawn(args, side)
        print(json.dumps(results[side]), flush=True)
    print(format_table(results))
    print(json.dumps(compare(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
