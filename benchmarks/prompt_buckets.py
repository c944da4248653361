"""Prompt-aware micro-batches against length-only ones, on one real batch of a config (GSM8K by default).

    python benchmarks/prompt_buckets.py                                   # configs/smollm2_gsm8k_cpu.yaml
    python benchmarks/prompt_buckets.py CONFIG key=value ... --rounds 2 --threads 1

Samples one batch with the config's policy (B prompts x G completions), then times the reference pass
(`forward_logprobs`) and the policy update (`policy_update`: forward, backward, AdamW) on that batch with
two micro-batch plans, sides alternated ABBA:

    length   rows sorted by prompt + completion length (the plan before 2026-12-02): rows of
             different prompts share micro-batches, so each runs its own prompt
    prompt   `grpokit.model.buckets.prompt_buckets`: a group's rows stay together, its prompt runs once

Prints one JSON line per side and round (seconds, micro-batches, token-slots = distinct prompts x
longest prompt + rows x longest completion, summed over micro-batches), then the ratios.
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
from grpokit.config.schema import load_config
from grpokit.model.buckets import micro_batches
from grpokit.model.shared_prompts import model_shares_prompts
from grpokit.observe.metrics import PhaseTimer
from grpokit.train.collect import collect_batch
from grpokit.train.loop import build_state
from grpokit.train.update import forward_logprobs, policy_update


@contextlib.contextmanager
def plan(side: str):
    """`length`: the update and reference passes see no shared prompts; `prompt`: as shipped."""
    if side == "prompt":
        yield
        return
    with mock.patch("grpokit.train.update.model_shares_prompts", lambda m: False):
        yield


def token_slots(rollout, groups) -> int:
    pm, cm, ids = rollout.prompt_mask, rollout.completion_mask, rollout.prompt_ids
    total = 0
    for rows in groups:
        uniq = torch.unique(torch.cat([ids[rows], pm[rows].to(ids.dtype)], 1), dim=0).shape[0]
        total += uniq * int(pm[rows].sum(-1).max()) + len(rows) * int(cm[rows].sum(-1).max())
    return total


def run_side(state, rollout, side: str, rnd: int) -> dict:
    cfg, n_params = state.cfg, sum(p.numel() for p in state.model.parameters())
    shared = rollout.prompt_ids if side == "prompt" and model_shares_prompts(state.model) else None
    groups = micro_batches(rollout.prompt_mask, rollout.completion_mask,
                           cfg.optim.micro_batch_size or rollout.completion_ids.shape[0], n_params,
                           prompt_ids=shared)
    adv = torch.randn(rollout.completion_ids.shape[0])
    with plan(side), switch.accelerated(state.model, cfg):       # a fresh scope per side: its own plan
        t0 = time.perf_counter()
        ref_lp = forward_logprobs(state.ref_model, rollout, cfg)
        t1 = time.perf_counter()
        policy_update(state, rollout, adv, old_lp=None, ref_lp=ref_lp,
                      loss_mask=rollout.completion_mask.float(), timer=PhaseTimer())
        t2 = time.perf_counter()
    return {"side": side, "round": rnd, "ref_s": t1 - t0, "update_s": t2 - t1, "micro_batches": len(groups),
            "token_slots": token_slots(rollout, groups)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("items", nargs="*", help="a YAML config, then key=value overrides")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    given = a.items and a.items[0].endswith((".yaml", ".yml"))
    path = a.items[0] if given else "configs/smollm2_gsm8k_cpu.yaml"
    cfg = load_config(path, [x for x in a.items if "=" in x] + ["run.eval_limit=0"])
    state = build_state(cfg)
    with switch.accelerated(state.model, cfg):
        rollout = collect_batch(state, PhaseTimer())[0]
    lengths = rollout.completion_mask.sum(-1)
    print(json.dumps({"config": path, "rows": int(lengths.numel()),
                      "prompt_tokens_mean": float(rollout.prompt_mask.sum(-1).float().mean()),
                      "completion_tokens_mean": float(lengths.float().mean()),
                      "micro_batch_size": cfg.optim.micro_batch_size}), flush=True)
    rows = []
    for r in range(a.rounds):
        for side in (("length", "prompt") if r % 2 == 0 else ("prompt", "length")):
            rows.append(run_side(state, rollout, side, r + 1))
            print(json.dumps(rows[-1]), flush=True)
    med = {s: {k: statistics.median(x[k] for x in rows if x["side"] == s) for k in ("ref_s", "update_s")}
           for s in ("length", "prompt")}
    ratio = {f"{k}_ratio_length_over_prompt": med["length"][f"{k}_s"] / med["prompt"][f"{k}_s"]
             for k in ("ref", "update")}
    print(json.dumps({**ratio, "medians": med}))


if __name__ == "__main__":
    main()
