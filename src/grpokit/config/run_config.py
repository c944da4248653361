"""The config of a run started from the command line: a YAML file, or the built-in demo, plus overrides.

`grpokit train`, `grpokit eval` and `grpokit sft` resolve their config here; `describe` prints what
differs from the paper's defaults and where each value came from (a preset or the user).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from grpokit.config.schema import (
    PRESETS,
    SECTIONS,
    ConfigError,
    GRPOConfig,
    build_config,
    explicit_preset_conflicts,
    load_config,
    parse_overrides,
)
from grpokit.tasks.files import TASK_LENGTHS

log = logging.getLogger("grpokit")

# The embedded default run (`grpokit train` with no config file): the demo on the built-in task.
# It sets no loss.* key, so the objective is the paper's unless a preset or override says otherwise.
DEMO: dict[str, Any] = {
    "model.name_or_path": "builtin:arith-demo",  # char-level Qwen2, 0.8 M params, SFT'd by `grpokit sft`
    "task.name": "arithmetic", "task.operators": "+",  # two 2-digit operands: 'What is 37+58?'
    "task.num_train": 7600, "task.num_eval": 500,  # the whole space (8100): 500 held out, never trained on
    "rollout.num_generations": 8, "rollout.prompts_per_step": 16,  # G = 8, B = 16: 128 completions a step
    # '37+58=95. \\boxed{95}' + EOS = 21 tokens
    "rollout.max_completion_length": 24, "rollout.max_prompt_length": 64,
    # 2e-4 and above drift away (KL > 0.05) and lose accuracy
    "optim.learning_rate": 1e-4, "optim.max_grad_norm": 1.0,
    "run.output_dir": "runs/demo", "run.max_steps": 400,
    "run.eval_limit": 500, "run.eval_steps": 100,   # greedy held-out accuracy at 0, 100, ..., and the end
}
# The demo keys that fit only its arithmetic task: another task.name brings its own (demo_config)
DEMO_TASK_KEYS = ("task.operators", "task.num_train", "task.num_eval", "rollout.max_completion_length",
                  "rollout.max_prompt_length")


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


def train_config(path: str | None, overrides: list[str], *, resume: bool = False,
                 overwrite: bool = False) -> GRPOConfig:
    """A YAML config (or the demo's when path is None) with the overrides; resume, overwrite: CLI flags."""
    extra = overrides + (["run.resume=true"] if resume else [])
    extra += ["run.overwrite=true"] if overwrite else []
    if path is not None:
        if is_config_key(path) and not Path(path).exists():  # `grpokit train loss.beta 0.1`
            value = overrides[0] if overrides and "=" not in overrides[0] else "VALUE"
            raise ConfigError(f"'{path}' is a config key, not a config file: write {path}={value} "
                              "(no spaces around '=')")
        return load_config(path, extra)
    return demo_config(parse_overrides(extra))


def is_config_key(item: str) -> bool:
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
