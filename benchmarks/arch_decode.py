"""`grpokit bench` on architectures outside the lean decoder (a MoE, a Gemma): grpokit's decode loop (the
model's own forward with a DynamicCache, the prompt prefilled once) against `model.generate`.

    python benchmarks/arch_decode.py [--types qwen3_moe,gemma3_text] [--repeats 2] \
        [--out benchmarks/results/arch_decode.jsonl]

Each type is a random-init 4-layer model (hidden 256, the bench's 512-id char tokenizer) saved to a temp
folder; per repeat, `grpokit bench --model DIR --backend fast` then `--backend generate` (the sides
alternate, so a drift of the machine falls on both), fixed-length completions. Printed per side: the
generation phase's tokens/s and the whole step's seconds; then the ratio fast / generate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_record import machine  # noqa: E402

from grpokit.model.testing import build_tokenizer, family_model  # noqa: E402

SIZES = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=64, intermediate_size=512)
BENCH = ["--prompts", "4", "--num-generations", "8", "--completion-length", "64", "--fixed-length",
         "--steps", "4", "--warmup", "1", "--beta", "0", "--threads", "1"]


def save(model_type: str, folder: Path) -> Path:
    tok = build_tokenizer()
    model = family_model(model_type, len(tok), tok.eos_token_id, tok.pad_token_id, **SIZES)
    out = folder / model_type
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def bench(path: Path, backend: str) -> dict:
    cmd = ["grpokit", "bench", "--model", str(path), "--backend", backend, *BENCH]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    row = json.loads(out)
    return {"backend": backend, "s_per_step": row["s_per_step"], "generate_s": row["phases_s"]["generate"],
            "generate_tokens_per_s": row["completion_tokens"] / row["phases_s"]["generate"],
            "completion_tokens": row["completion_tokens"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default="qwen3_moe,gemma3_text")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    how = {"commit": commit, "machine": machine(), "command": "python benchmarks/arch_decode.py "
           + " ".join(sys.argv[1:]), "bench_args": " ".join(BENCH), "sizes": SIZES}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in args.types.split(","):
            path = save(model_type, Path(tmp))
            for k in range(args.repeats):
                for backend in ("fast", "generate"):
                    rows.append({"bench": "arch_decode", "model_type": model_type, "repeat": k,
                                 **bench(path, backend), **how})
                    print(json.dumps(rows[-1]), flush=True)
    for model_type in args.types.split(","):
        med = {b: statistics.median(r["generate_tokens_per_s"] for r in rows
                                    if r["model_type"] == model_type and r["backend"] == b)
               for b in ("fast", "generate")}
        summary = {"bench": "arch_decode", "summary": True, "model_type": model_type,
                   "fast_generate_tokens_per_s": med["fast"],
                   "generate_generate_tokens_per_s": med["generate"],
                   "ratio_fast_over_generate": med["fast"] / med["generate"], **how}
        rows.append(summary)
        print(f"{model_type}: decode loop {med['fast']:.0f} tok/s, model.generate {med['generate']:.0f} "
              f"tok/s, {summary['ratio_fast_over_generate']:.2f}x")
    if args.out:
        with args.out.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
