"""The matmul floor of one `grpokit bench` step: how fast the step could be if only its matmuls cost.

    python benchmarks/step_floor.py                                  # SmolLM2, B 4 x G 8, 64 tokens, bf16
    python benchmarks/step_floor.py --bench RESULTS.jsonl   # a `grpokit bench --compare-trl` output
    (the second rescales the floor to that bench run's own peak and sets it against both sides)

Every linear layer of the bench's step (`grpokit bench --model smollm2-135m-instruct --completion-length 64
--fixed-length --micro-batch-size 8`) is timed alone with `torch.nn.functional.linear` at the shapes the
step runs it, in `--dtype`, on this machine's threads:

    generate     prefill of the B prompts, then T decode steps of B*G rows: q/k/v fused, o, gate/up fused,
                 down (each layer), the lm-head on every decode row (grpokit's sampler fuses the same way)
    reference    one forward per micro-batch (a group: its prompt once, then G x T completion rows): q, k,
                 v, o, gate, up, down per layer; the lm-head on the completion rows
    policy       the same forward, plus the two backward matmuls of each (dx = dy W, dW = dy^T x)

Attention's own matmuls, norms, activations, softmax, the optimizer and Python are left out, so the sum
is a lower bound on the step, not an estimate. Each shape's speed is also given as a fraction of the
1024^3 matmul (`grpokit bench`'s "peak"), timed alternately with the shapes, so the floor can be rescaled
to the peak a bench run measured in its own process (`--bench`): the ratio TRL / floor is then the best
speed-up over TRL that the machine's matmuls allow for that run. Times are minima over `--rounds`
(this machine's noise is one-sided).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def best_seconds(fn, rounds: int, min_seconds: float = 0.05) -> float:
    """Minimum over `rounds` of the mean time of fn() over a batch of calls lasting >= min_seconds."""
    fn()
    t0 = time.perf_counter()
    fn()
    reps = max(1, int(min_seconds / max(time.perf_counter() - t0, 1e-6)))
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def linear_seconds(rows: int, d_in: int, d_out: int, dtype: torch.dtype, rounds: int) -> float:
    """Seconds of y = x W^T for x [rows, d_in], W [d_out, d_in]."""
    x, w = torch.randn(rows, d_in, dtype=dtype), torch.randn(d_out, d_in, dtype=dtype) * 0.02
    return best_seconds(lambda: F.linear(x, w), rounds)


def weight_grad_seconds(rows: int, d_in: int, d_out: int, dtype: torch.dtype, rounds: int) -> float:
    """Seconds of dW = dy^T x for dy [rows, d_out], x [rows, d_in] (autograd's layout)."""
    dy, x = torch.randn(rows, d_out, dtype=dtype), torch.randn(rows, d_in, dtype=dtype)
    return best_seconds(lambda: dy.t().mm(x), rounds)


def step_matmuls(cfg, *, prompts: int, generations: int, tokens: int, prompt_len: int,
                 micro_batch: int) -> dict[str, list[tuple[str, int, int, int, int]]]:
    """Per phase: (kind, rows, d_in, d_out, calls) for every linear of one bench step.

    kind "fwd" is y = x W^T; "dx" is dy W (rows x d_out -> d_in); "dw" is dy^T x.
    """
    H, inter, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    layer = [(H, q), (H, kv), (H, kv), (q, H), (H, inter), (H, inter), (inter, H)]   # q k v o gate up down
    fused = [(H, q + 2 * kv), (q, H), (H, 2 * inter), (inter, H)]
    rows = prompts * generations
    gen = [("fwd", prompts * prompt_len, i, o, L) for i, o in fused] + [("fwd", prompts, H, V, 1)]
    gen += [("fwd", rows, i, o, L * tokens) for i, o in fused] + [("fwd", rows, H, V, tokens)]
    passes = rows // micro_batch
    mb_rows = micro_batch * tokens + prompt_len * max(1, micro_batch // generations)  # shared-prompt pass
    fwd = [("fwd", mb_rows, i, o, L * passes) for i, o in layer] + \
        [("fwd", micro_batch * tokens, H, V, passes)]
    bwd = [(kind, r, i, o, n) for _, r, i, o, n in fwd for kind in ("dx", "dw")]
    return {"generate": gen, "ref_forward": fwd, "policy_fwd_bwd": fwd + bwd}


def measure(phases: dict, dtype: torch.dtype, rounds: int) -> tuple[dict, float]:
    """(per phase: floor seconds, FLOPs, the phase's matmul GFLOP/s), and the 1024^3 GFLOP/s measured
    alternately with the shapes (the median of its runs)."""
    cache: dict[tuple, float] = {}
    peaks = []
    for key in sorted({(k, r, i, o) for rows in phases.values() for k, r, i, o, _ in rows}):
        peaks.append(2 * 1024 ** 3 / linear_seconds(1024, 1024, 1024, dtype, rounds) / 1e9)
        kind, r, i, o = key
        cache[key] = weight_grad_seconds(r, i, o, dtype, rounds) if kind == "dw" else \
            linear_seconds(r, o, i, dtype, rounds) if kind == "dx" else linear_seconds(r, i, o, dtype, rounds)
    out = {}
    for name, rows in phases.items():
        secs = sum(cache[(k, r, i, o)] * n for k, r, i, o, n in rows)
        flops = sum(2 * r * i * o * n for _, r, i, o, n in rows)
        out[name] = {"floor_s": secs, "gflop": flops / 1e9, "gflops": flops / secs / 1e9}
    return out, sorted(peaks)[len(peaks) // 2]


def bench_figures(path: Path, dtype: str = "bf16") -> dict:
    """The highest `dtype` 1024^3 peak grpokit's side measured in a `grpokit bench --compare-trl` results
    file, and each side's median s/step (as the bench's ratio)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    sides = {s: [r for r in rows if r.get("side") == s] for s in ("grpokit", "trl")}
    if not sides["grpokit"] or not sides["trl"]:
        raise SystemExit(f"step_floor: {path} has no grpokit and TRL rows: give a `grpokit bench "
                         "--compare-trl` output")
    key = "matmul_peak_gflops_bf16" if dtype == "bf16" else "matmul_peak_gflops"
    # the highest peak of the run gives the lowest floor: the bound favours a speed-up, not a verdict of none
    return {"peak_gflops": max(r.get(key, r["matmul_peak_gflops"]) for r in sides["grpokit"]),
            "grpokit_s": statistics.median(r["s_per_step"] for r in sides["grpokit"]),
            "trl_s": statistics.median(r["s_per_step"] for r in sides["trl"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="the alias or a local model folder")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--completion-length", type=int, default=64)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--bench", type=Path, default=None,
                   help="a `grpokit bench --compare-trl` results file: the floor at its --dtype peak")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from grpokit.model.testing import bench_prompts, build_model

    model, tok = build_model("tiny", model_path=args.model)
    prompt_len = max(len(tok(t)["input_ids"]) for t in bench_prompts(args.prompts))
    phases = step_matmuls(model.config, prompts=args.prompts, generations=args.num_generations,
                          tokens=args.completion_length, prompt_len=prompt_len,
                          micro_batch=args.micro_batch_size)
    del model
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    floor, peak = measure(phases, dtype, args.rounds)
    total = sum(v["floor_s"] for v in floor.values())
    row = {"dtype": args.dtype, "threads": torch.get_num_threads(), "prompt_tokens": prompt_len,
           "peak_1024_gflops": round(peak, 1), "floor_s": round(total, 3),
           "phases": {k: {n: round(x, 3) for n, x in v.items()} for k, v in floor.items()}}
    for name, v in floor.items():
        print(f"{name:15s} floor {v['floor_s']:6.2f} s  {v['gflop']:7.1f} GFLOP at {v['gflops']:5.0f} "
              f"GFLOP/s ({v['gflops'] / peak:.2f} of the 1024^3 peak, {peak:.0f})")
    print(f"step floor {total:.2f} s = {total * peak:.0f} peak-GFLOP (seconds at a 1 GFLOP/s peak)")
    if args.bench:
        b = bench_figures(args.bench, args.dtype)
        scaled = total * peak / b["peak_gflops"]
        row["bench"] = {"file": args.bench.name, **b, "floor_s": round(scaled, 3),
                        "trl_over_floor": round(b["trl_s"] / scaled, 3),
                        "trl_over_grpokit": round(b["trl_s"] / b["grpokit_s"], 3)}
        print(f"{args.bench.name}: {args.dtype} peak in that run {b['peak_gflops']:.0f} GFLOP/s -> "
              f"floor {scaled:.2f} s; "
              f"grpokit {b['grpokit_s']:.2f} s/step ({scaled / b['grpokit_s']:.2f} of it is the floor), "
              f"TRL {b['trl_s']:.2f} s/step: TRL / floor = {b['trl_s'] / scaled:.2f}x "
              f"(grpokit measured {b['trl_s'] / b['grpokit_s']:.2f}x; 4x needs {b['trl_s'] / 4:.2f} s/step)")
    print(json.dumps(row))

if __name__ == "__main__":
    main()
