"""The `grpokit` command: train | eval | sft | plot | report | bench.

    grpokit train                         # the built-in demo: GRPO on arithmetic, offline
    grpokit train cfg.yaml loss.beta=0.0  # a YAML config with dotted overrides
    grpokit train preset=dapo --overwrite

User errors (bad config, missing model, bad data, ...) print one line and exit 2; --debug shows the
traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import sys
from pathlib import Path
from typing import Any

from .config import PRESETS, SECTIONS, ConfigError, GRPOConfig, build_config, explicit_preset_conflicts, load_config
from .errors import run_command
from .tasks.files import TASK_LENGTHS

log = logging.getLogger("grpokit")

# The embedded default run (`grpokit train` with no config file): the demo on the built-in task.
# It sets no loss.* key, so the objective is the paper's unless a preset or override says otherwise.
DEMO: dict[str, Any] = {
    "model.name_or_path": "builtin:arith-demo",     # char-level Qwen2, 0.8 M params, SFT'd by `grpokit sft`
    "task.name": "arithmetic", "task.operators": "+",  # two 2-digit operands: 'What is 37+58?'
    "task.num_train": 7600, "task.num_eval": 500,   # the whole space (8100) split: 500 held out, never trained on
    "rollout.num_generations": 8, "rollout.prompts_per_step": 16,  # G = 8, B = 16: 128 completions a step
    "rollout.max_completion_length": 24, "rollout.max_prompt_length": 64,  # '37+58=95. \\boxed{95}' + EOS = 21
    "optim.learning_rate": 1e-4, "optim.max_grad_norm": 1.0,  # 2e-4 and above drift away (KL > 0.05) and lose accuracy
    "run.output_dir": "runs/demo", "run.max_steps": 400,
    "run.eval_limit": 500, "run.eval_steps": 100,   # greedy held-out accuracy at 0, 100, ..., and the end
}
# The demo keys that fit only its arithmetic task: another task.name brings its own (demo_config)
DEMO_TASK_KEYS = ("task.operators", "task.num_train", "task.num_eval", "rollout.max_completion_length",
                  "rollout.max_prompt_length")

SUBCOMMANDS = {  # name -> module with main(argv) -> int, for the commands that live beside their code
    "eval": "grpokit.evaluate", "sft": "grpokit.sft", "plot": "grpokit.plots", "report": "grpokit.report",
    "bench": "grpokit.bench", "vllm-serve": "grpokit.vllm_serve", "sweep": "grpokit.sweep",
    "rm": "grpokit.rm_cli",
}


def describe(cfg: GRPOConfig) -> str:
    """The resolved config: every value that differs from the paper defaults, with where it came from."""
    default = GRPOConfig()
    conflicts = explicit_preset_conflicts(cfg)
    preset_keys = PRESETS.get(cfg.preset or "", {})
    lines = [f"resolved config (preset: {cfg.preset or 'none'}; unlisted keys are the paper defaults):"]
    for section in SECTIONS:
        for f in dataclasses.fields(SECTIONS[section]):
            key = f"{section}.{f.name}"
            value = getattr(getattr(cfg, section), f.name)
            if value == getattr(getattr(default, section), f.name) and key not in preset_keys:
                continue
            note = ""
            if key in conflicts:
                note = f"   # explicit, overrides preset {cfg.preset} ({conflicts[key][0]!r})"
            elif key in preset_keys:
                note = f"   # from preset {cfg.preset}"
            lines.append(f"  {key} = {value!r}{note}")
    return "\n".join(lines)


def train_config(path: str | None, overrides: list[str], resume: bool, overwrite: bool) -> GRPOConfig:
    extra = overrides + (["run.resume=true"] if resume else []) + (["run.overwrite=true"] if overwrite else [])
    if path is not None:
        if _is_config_key(path) and not Path(path).exists():  # `grpokit train loss.beta 0.1`
            value = overrides[0] if overrides and "=" not in overrides[0] else "VALUE"
            raise ConfigError(f"'{path}' is a config key, not a config file: write {path}={value} "
                              "(no spaces around '=')")
        return load_config(path, extra)
    from .config import parse_overrides

    return demo_config(parse_overrides(extra))


def _is_config_key(item: str) -> bool:
    names = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    return item in names or item in {n.split(".", 1)[1] for n in names} or item == "preset"


def demo_config(overrides: dict[str, Any]) -> GRPOConfig:
    """The built-in demo's config under the user's overrides.

    With another task.name, the demo's arithmetic-only keys (DEMO_TASK_KEYS: its 64-token prompts,
    24-token completions, problem counts) are dropped for the task's own lengths (`TASK_LENGTHS`),
    and one line says which demo settings were kept.
    """
    task = overrides.get("task.name", overrides.get("name", DEMO["task.name"]))  # 'name' is task.name, bare
    if task == DEMO["task.name"]:
        return build_config({**DEMO, **overrides})
    values = {k: v for k, v in DEMO.items() if k not in DEMO_TASK_KEYS}
    cfg = build_config({**values, **TASK_LENGTHS.get(str(task), {}), **overrides})
    flat = {f"{s}.{k}": v for s, section in cfg.to_dict().items() if isinstance(section, dict)
            for k, v in section.items()}
    kept = [f"{k}={v}" for k, v in values.items() if k != "task.name" and flat.get(k) == v]
    log.info("task.name=%s: rollout.max_prompt_length=%d, rollout.max_completion_length=%d (the task's); "
             "kept from the built-in demo: %s (override them, or give a YAML config)", cfg.task.name,
             cfg.rollout.max_prompt_length, cfg.rollout.max_completion_length, ", ".join(kept) or "nothing")
    return cfg


def cmd_train(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grpokit train", description="Run GRPO (no config: the built-in demo).")
    p.add_argument("items", nargs="*", help="an optional YAML config, then key=value overrides")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    p.add_argument("--overwrite", action="store_true", help="replace a previous run in output_dir")
    args = p.parse_intermixed_args(argv)
    path = args.items[0] if args.items and "=" not in args.items[0] else None
    overrides = args.items[1:] if path else args.items
    cfg = train_config(path, overrides, args.resume, args.overwrite)
    print(describe(cfg), flush=True)
    from .trainer import train_grpo

    state = train_grpo(cfg)
    print(f"done: {state.step} steps; metrics in {cfg.run.output_dir}/metrics.jsonl, "
          f"model in {cfg.run.output_dir}/final", flush=True)
    from .demo import before_after_table, demo_plot

    try:  # a resumed run may lack the 'before' evaluation: then there is no table to print
        print(before_after_table(cfg.run.output_dir), flush=True)
    except FileNotFoundError:
        pass
    print(f"plot: {demo_plot(cfg.run.output_dir)}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    logging.basicConfig(level=logging.INFO, format="grpokit: %(message)s")
    for noisy in ("httpx", "urllib3", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in the middle of our output
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: grpokit {{train,{','.join(SUBCOMMANDS)}}} ... (grpokit train: the built-in demo)")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        return run_command(cmd_train, rest, debug)
    if cmd in SUBCOMMANDS:
        return run_command(importlib.import_module(SUBCOMMANDS[cmd]).main, rest, debug)
    print(f"error: unknown command '{cmd}': use one of train, {', '.join(SUBCOMMANDS)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
