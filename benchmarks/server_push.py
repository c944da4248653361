"""Time the server-mode weight push (`ServerEngine.load_weights`) against a running `grpokit vllm-serve`,
and check each push: after it, the server's log-probs of a fixed prompt's samples must equal the pushed
model's (float32 server: float rounding; a layer that reached vLLM in part shows as ~0.1-10).

    grpokit vllm-serve --model FOLDER --port 8123 --threads 1 --dtype float32 --kv-cache-gib 0.5 &
    python benchmarks/server_push.py --url http://127.0.0.1:8123 --model FOLDER --repeats 3 \\
        --label new --record benchmarks/results/server_push_smollm2.jsonl

Each repeat moves every weight by a little noise first, so every push changes what the server holds.
Which client pushes is whichever grpokit is imported (PYTHONPATH): run it once per checkout to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_record import append_rows, run_meta  # noqa: E402

from grpokit.model.logprobs import per_token_logprobs  # noqa: E402
from grpokit.rollout.vllm_backend import ServerEngine, policy_weights  # noqa: E402
from grpokit.rollout.vllm_engine import SamplingSpec  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True, help="the folder the server was started from")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--label", required=True, help="which client this is (e.g. old / new)")
    p.add_argument("--record", help="append the rows to this JSONL file")
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    engine, prompt = ServerEngine(args.url), [1, 504, 3245, 30, 216]
    meta = run_meta("server_push", __file__, None, [], argv if argv is not None else sys.argv[1:])
    rows = []
    for r in range(args.repeats):
        with torch.no_grad():
            for w in model.parameters():
                w.add_(torch.randn_like(w) * 1e-3 * w.abs().mean())
        start = time.perf_counter()
        engine.load_weights(policy_weights(model))
        push_s = time.perf_counter() - start
        samples = engine.generate([prompt], SamplingSpec(n=4, max_tokens=8, seed=r))[0]
        worst = 0.0
        for s in samples:
            ids = torch.tensor([prompt + s.token_ids])
            with torch.no_grad():
                lp = per_token_logprobs(model, ids, torch.ones_like(ids), len(s.token_ids))[0]
            worst = max(worst, float((lp - torch.tensor(s.logprobs)).abs().max()))
        rows.append({**meta, "label": args.label, "repeat": r, "push_s": push_s, "tensors":
                     sum(1 for _ in policy_weights(model)), "max_abs_logprob_diff": worst})
        print(json.dumps({k: rows[-1][k] for k in ("label", "repeat", "push_s", "max_abs_logprob_diff")}),
              flush=True)
    if args.record:
        append_rows(args.record, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
