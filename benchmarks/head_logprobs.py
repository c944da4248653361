"""SmolLM2's lm-head log-probs: grpokit's `HeadLogprobs` against autograd, and the matmul floor.

    python benchmarks/head_logprobs.py                  # 504 rows (8 x 63), H 576, V 49,152, bf16
    python benchmarks/head_logprobs.py --dtype fp32 --rows 2048

Variants, interleaved in one process and each timed `--rounds` times (the minimum is printed, the
machine's noise being one-sided):
    grpokit     HeadLogprobs forward (with the entropy, as the update asks) + backward: bf16 logits cast to
                fp32 in 8-row blocks, probabilities kept for backward where `head_logprobs` would keep them
    autograd    the textbook chunk (`chunk_logprobs` under autograd: [R, V] float32 logits, logsumexp,
                gather, autograd's backward), what the head costs without the hand-written function
    matmuls     the three matmuls alone (z = h W^T, dh = dz W, dW = dz^T h): the floor
    no-grad     the reference pass's head (`chunk_logprobs` without autograd)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from grpokit.model import logprobs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=504)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    R, H, V, tau = args.rows, args.hidden, args.vocab, args.temperature
    W = (torch.randn(V, H) * 0.05).to(dtype).requires_grad_()
    h = torch.randn(R, H).to(dtype).requires_grad_()
    t = torch.randint(0, V, (R,))
    keep_16bit = getattr(logprobs, "KEEP_PROBS_16BIT_BYTES", 0)           # 0: code before it existed
    keep = V <= logprobs.KEEP_PROBS_VOCAB_RATIO * H or (dtype == torch.bfloat16 and R * V * 2 <= keep_16bit)

    def grpokit():
        lp, _ = logprobs.HeadLogprobs.apply(h, W, None, t, tau, keep, True)
        torch.autograd.grad(lp.sum(), (h, W))

    def autograd():
        torch.autograd.grad(logprobs.chunk_logprobs(h, t, W, None, tau).sum(), (h, W))

    def matmuls():
        with torch.no_grad():
            z = h @ W.t()
            z @ W, z.t() @ h

    def no_grad():
        with torch.no_grad():
            logprobs.chunk_logprobs(h, t, W, None, tau)

    variants = {"grpokit": grpokit, "autograd": autograd, "matmuls": matmuls, "no-grad": no_grad}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds + 1):                                      # round 0: warm-up
        for name, fn in (variants.items() if r % 2 else reversed(variants.items())):
            t0 = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - t0)
    best = {k: min(v) * 1e3 for k, v in times.items()}
    print(json.dumps({"rows": R, "hidden": H, "vocab": V, "dtype": args.dtype, "keep_probs": keep,
                      "threads": torch.get_num_threads(), "min_ms": best}))
    print(f"grpokit {best['grpokit']:.0f} ms, autograd {best['autograd']:.0f} ms "
          f"({best['autograd'] / best['grpokit']:.2f}x), the three matmuls {best['matmuls']:.0f} ms; "
          f"no-grad head {best['no-grad']:.0f} ms")


if __name__ == "__main__":
    main()
