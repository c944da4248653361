"""The sampler's prompt cache kept once per prompt against copied to each of its G rows, on real prompts.

    python benchmarks/prompt_cache.py                          # configs/smollm2_gsm8k_cpu.yaml, 16 x 8 rows
    python benchmarks/prompt_cache.py CONFIG key=value ... --prompts 16 --rounds 2 --threads 2

Loads the config's policy (its precision applied) and the first `--prompts` problems of its evaluation
split, then samples G completions of `rollout.max_completion_length` tokens each for them with two cache
layouts, sides alternated ABBA (one process, so the machine's drift hits both alike):

    shared   `sampler.SHARE_PROMPT_CACHE` (as shipped): a prompt's keys/values once, read by its G rows
    copied   the prompt's keys/values copied into each row's cache (the layout before 2026-12-03)

Rows run to the token limit (EOS suppressed) so that both sides decode the same number of tokens.
Prints one JSON line per side and round (seconds, decoded tokens a second, the KV cache's bytes), then
the medians' ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from unittest import mock

import torch

from grpokit import switch
from grpokit.config.run_config import train_config
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.model.precision import apply_precision
from grpokit.rollout import sampler
from grpokit.rollout.groups import sample_groups
from grpokit.tasks import load_examples


@contextlib.contextmanager
def side(name: str, cache_bytes: list[int]):
    """The layout `name` for the sampling calls inside; each LeanDecoder's cache bytes go to cache_bytes."""
    init = sampler.LeanDecoder.__init__

    def counting_init(dec, *args, **kwargs):
        init(dec, *args, **kwargs)
        cache_bytes.append(dec.kv.nbytes + (0 if dec.prefix is None else dec.prefix.nbytes))

    with mock.patch.object(sampler, "SHARE_PROMPT_CACHE", name == "shared"), \
            mock.patch.object(sampler.LeanDecoder, "__init__", counting_init):
        yield


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", default="configs/smollm2_gsm8k_cpu.yaml")
    p.add_argument("items", nargs="*", help="key=value overrides")
    p.add_argument("--prompts", type=int, default=16, help="prompts per call (evaluation's 128 rows at G 8)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = train_config(args.config, args.items, resume=False, overwrite=True)
    model, tok = load_model_and_tokenizer(cfg.model, cfg.run.seed)
    precision, why = apply_precision(model, cfg)
    r = cfg.rollout
    prompts = [ex.prompt for ex in load_examples(cfg.task, cfg.task.eval_split)[:args.prompts]]
    rows = {"shared": [], "copied": []}
    for rnd in range(args.rounds):
        for name in ("shared", "copied") if rnd % 2 == 0 else ("copied", "shared"):
            cache: list[int] = []
            torch.manual_seed(rnd)
            t0 = time.perf_counter()
            with side(name, cache), switch.accelerated(model):
                out = sample_groups(model, tok, prompts, r.num_generations, r.max_completion_length,
                                    temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                    max_prompt_length=r.max_prompt_length, truncate_prompt=r.truncate_prompt,
                                    backend="fast", suppress_eos=True)
            sec = time.perf_counter() - t0
            tokens = int(out.completion_mask.sum())
            row = {"side": name, "round": rnd, "seconds": round(sec, 2),
                   "tokens_per_s": round(tokens / sec, 1), "rows": out.completion_ids.shape[0],
                   "prompt_tokens": out.prompt_ids.shape[1], "completion_tokens": out.completion_ids.shape[1],
                   "kv_cache_mib": round(max(cache) / 2**20), "precision": precision, "threads": args.threads}
            rows[name].append(row)
            print(json.dumps(row), flush=True)
    med = {k: statistics.median(x["seconds"] for x in v) for k, v in rows.items()}
    print(json.dumps({"copied_over_shared": round(med["copied"] / med["shared"], 2), "why": why,
                      "kv_cache_mib": {k: v[0]["kv_cache_mib"] for k, v in rows.items()}}))


if __name__ == "__main__":
    main()
