"""`grpokit sft [key=value ...] [--out DIR] [--steps N] [--seed S] ...`: build the demo's warm-start model.

The recipe and the training loop are `grpokit.train.sft`'s; this module reads the command line.

Tool-calling warm starts (docs/agents.md): `--traces calculator` (or guess_number) trains on that many
traces from `grpokit.agents.builtin.demonstrations` (the tool results attended, not trained), `--init`
starts from a model instead of a random one, and the held-out evaluation runs with the config's tools.

    grpokit sft configs/agents_calculator.yaml --init builtin:arith-demo --traces calculator \
        --num-traces 400 --steps 300 --stop-at 60 --out runs/calculator-sft
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from grpokit.agents.agent import agent_from_config
from grpokit.agents.builtin import demonstrations
from grpokit.config.run_config import train_config
from grpokit.config.schema import GRPOConfig
from grpokit.config.sections import ModelConfig
from grpokit.errors import check_out_dir
from grpokit.model.loading import DEMO_CHECKPOINT, build_char_tokenizer, load_model_and_tokenizer
from grpokit.model.precision import apply_precision
from grpokit.tasks import load_examples
from grpokit.train.checkpoint import written_aside
from grpokit.train.evaluate import evaluate
from grpokit.train.guard import owned_folder
from grpokit.train.sft import DEFAULTS, DEMO_SHAPE, build_demo_model, train_sft

log = logging.getLogger("grpokit")

def sft_config(overrides: list[str], path: str | None = None) -> GRPOConfig:
    """The demo's config (or a YAML file's: task, rollout limits, tools), so the warm-up and GRPO see the
    same problems."""
    return train_config(path, overrides, resume=False, overwrite=False)


def main(argv: list[str]) -> int:
    """`grpokit sft [key=value ...] [--out DIR] [--steps N] [--seed S] ...`: build the warm-start model."""
    p = argparse.ArgumentParser(prog="grpokit sft", description="Supervised warm-up of the demo model.")
    p.add_argument("items", nargs="*", help="an optional YAML config, then key=value overrides of it "
                   "(default: the demo config; task.*, rollout.*)")
    p.add_argument("--out", default=str(DEMO_CHECKPOINT),
                   help="save_pretrained folder (default: the shipped asset)")
    for key, value in DEFAULTS.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value, help=f"default {value}")
    p.add_argument("--eval-limit", type=int, default=500,
                   help="held-out problems to evaluate at the end (0: none)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (the recipe was timed with 2)")
    p.add_argument("--max-positions", type=int, default=DEMO_SHAPE["max_positions"],
                   help="the random model's positions (the code demo: 512)")
    p.add_argument("--init", help="start from this model (folder or alias) instead of a random one")
    p.add_argument("--traces", help="train on tool-calling traces: calculator | guess_number")
    p.add_argument("--num-traces", type=int, default=400, help="how many traces (with --traces)")
    args = p.parse_intermixed_args(argv)
    path = args.items[0] if args.items and "=" not in args.items[0] else None
    cfg = sft_config((args.items[1:] if path else args.items) + ["model.device=cpu", "run.progress=false"],
                     path)
    out = check_out_dir(args.out, "--out")
    with owned_folder(out, "--out"):   # one writer per --out; SIGINT / SIGTERM: one line, --out as it was
        return _warm_up(args, cfg, out)


def _warm_up(args: argparse.Namespace, cfg: GRPOConfig, out: Path) -> int:
    torch.set_num_threads(args.threads)
    if args.init:
        model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=args.init, device="cpu"))
    else:
        tokenizer = build_char_tokenizer()
        model = build_demo_model(tokenizer, args.seed, max_positions=args.max_positions)
    apply_precision(model, cfg)   # the config's model.precision (auto: fp32 for the demo's small models)
    n_params = sum(t.numel() for t in model.parameters())
    log.info("sft: %.2f M parameters, %d steps of %d on task %s", n_params / 1e6, args.steps,
             args.batch_size, cfg.task.name)
    train = load_examples(cfg.task, cfg.task.train_split)
    if args.traces:
        train = demonstrations(args.traces, train, args.num_traces, args.seed, cfg.task.trace_answer_prefix)
    rows = train_sft(model, tokenizer, train, args.steps, args.batch_size, args.learning_rate,
                     args.warmup_steps, args.seed, stop_at=args.stop_at, mask_tool_results=bool(args.traces))
    shape = None if args.init else {**DEMO_SHAPE, "max_positions": args.max_positions}   # --init: its own
    report: dict[str, Any] = {"recipe": {k: getattr(args, k) for k in DEFAULTS}, "shape": shape,
                              "parameters": n_params, "log": rows}
    if args.eval_limit:
        result = evaluate(model, tokenizer, load_examples(cfg.task, cfg.task.eval_split), cfg,
                          limit=args.eval_limit, progress=False, agent=agent_from_config(cfg))
        report["eval"] = result
        print(" ".join(f"{k}={v:.4f}" for k, v in result.items()), flush=True)
    if args.init or args.traces:   # a tool-calling warm start: say what it started from and learned on
        report["recipe"].update(init=args.init, traces=args.traces, num_traces=args.num_traces)
    with written_aside(out) as tmp:   # swapped in whole: the old --out stays until the new one is complete
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "sft_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"saved {out} ({n_params / 1e6:.2f} M parameters, {rows[-1]['seconds']:.0f}s of training)",
          flush=True)
    return 0
