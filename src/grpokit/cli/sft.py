"""`grpokit sft [key=value ...] [--out DIR] [--steps N] [--seed S] ...`: build the demo's warm-start model.

The recipe and the training loop are `grpokit.train.sft`'s; this module reads the command line.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from grpokit.config.run_config import train_config
from grpokit.config.schema import GRPOConfig
from grpokit.errors import check_out_dir
from grpokit.model.loading import DEMO_CHECKPOINT, build_char_tokenizer
from grpokit.tasks import load_examples
from grpokit.train.checkpoint import written_aside
from grpokit.train.evaluate import evaluate
from grpokit.train.guard import owned_folder
from grpokit.train.sft import DEFAULTS, DEMO_SHAPE, build_demo_model, train_sft

log = logging.getLogger("grpokit")

def sft_config(overrides: list[str]) -> GRPOConfig:
    """The demo's config (task, rollout limits), so the warm-up and GRPO see the same problems."""
    return train_config(None, overrides, resume=False, overwrite=False)


def main(argv: list[str]) -> int:
    """`grpokit sft [key=value ...] [--out DIR] [--steps N] [--seed S] ...`: build the warm-start model."""
    p = argparse.ArgumentParser(prog="grpokit sft", description="Supervised warm-up of the demo model.")
    p.add_argument("items", nargs="*", help="key=value overrides of the demo config (task.*, rollout.*)")
    p.add_argument("--out", default=str(DEMO_CHECKPOINT),
                   help="save_pretrained folder (default: the shipped asset)")
    for key, value in DEFAULTS.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value, help=f"default {value}")
    p.add_argument("--eval-limit", type=int, default=500,
                   help="held-out problems to evaluate at the end (0: none)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (the recipe was timed with 2)")
    args = p.parse_args(argv)
    cfg = sft_config(args.items + ["model.device=cpu", "run.progress=false"])
    out = check_out_dir(args.out, "--out")
    with owned_folder(out, "--out"):   # one writer per --out; SIGINT / SIGTERM: one line, --out as it was
        return _warm_up(args, cfg, out)


def _warm_up(args: argparse.Namespace, cfg: GRPOConfig, out: Path) -> int:
    torch.set_num_threads(args.threads)
    tokenizer = build_char_tokenizer()
    model = build_demo_model(tokenizer, args.seed)
    n_params = sum(t.numel() for t in model.parameters())
    log.info("sft: %.2f M parameters, %d steps of %d on task %s", n_params / 1e6, args.steps,
             args.batch_size, cfg.task.name)
    train = load_examples(cfg.task, cfg.task.train_split)
    rows = train_sft(model, tokenizer, train, args.steps, args.batch_size, args.learning_rate,
                     args.warmup_steps, args.seed, stop_at=args.stop_at)
    report: dict[str, Any] = {"recipe": {k: getattr(args, k) for k in DEFAULTS}, "shape": DEMO_SHAPE,
                              "parameters": n_params, "log": rows}
    if args.eval_limit:
        result = evaluate(model, tokenizer, load_examples(cfg.task, cfg.task.eval_split), cfg,
                          limit=args.eval_limit, progress=False)
        report["eval"] = result
        print(" ".join(f"{k}={v:.4f}" for k, v in result.items()), flush=True)
    with written_aside(out) as tmp:   # swapped in whole: the old --out stays until the new one is complete
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "sft_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"saved {out} ({n_params / 1e6:.2f} M parameters, {rows[-1]['seconds']:.0f}s of training)",
          flush=True)
    return 0
