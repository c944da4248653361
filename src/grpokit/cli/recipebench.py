"""`grpokit bench --memory --config FILE`: a real recipe's peak memory and s/step, QLoRA vs LoRA vs full.

Each side trains the config's own task, model and batch for `--steps` optimizer steps (evaluation and
saving off) in its own fresh subprocess, with the model section changed as the side says:

    qlora   model.load_in_4bit=true (the config's 4-bit settings), LoRA (the config's, or r 16 on all 7
            projections when the config has none)
    lora-bf16  the same LoRA on the base stored in bfloat16 (model.dtype=bfloat16; peft keeps the adapters
            and their AdamW state float32): TRL's bf16 LoRA
    lora    the same LoRA on the base as configured (model.dtype and model.precision)
    full    every weight trains (model.lora_r=0), no quantization

Sides run in the order given, then reversed, `--repeats` times over (qlora, lora-bf16, lora, full,
full, lora, ...): this machine drifts, so every side sees early and late minutes. Per run it reports:
    load_peak_mib   the peak resident memory while the model loads (a 4-bit base is quantized here)
    step_peak_mib   the peak from the first step to the last (Linux's VmHWM, reset after loading)
    s_per_step      the median of time/step over steps 2.. (the first one warms caches)
    sequence_width  the median padded row (prompt + completion) the update ran on; sequence_tokens_mean
                    its real tokens per row
    baseline_mib    the process before any model exists (interpreter, torch, transformers)
    weights_mib     every tensor of the policy and the reference (a 4-bit layer's packed weights and
                    its quantization state), counted once; quantized_mib / quantized_params the 4-bit
                    part; trainable_params and optimizer_state_mib as measured
On a GPU the step peak is torch.cuda.max_memory_allocated. The summary line holds each side's median.

    grpokit bench --memory --config configs/qlora_smollm2_arith_cpu.yaml --steps 6 --repeats 2
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

from grpokit import switch
from grpokit.cli.membench import current_rss_mib, run_json_side
from grpokit.config.schema import load_config
from grpokit.train.callbacks import TrainHooks
from grpokit.train.loop import train_grpo

RECIPE_SIDES = ("qlora", "lora-bf16", "lora", "full")
ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def side_overrides(side: str, cfg) -> list[str]:
    """The `key=value` overrides that turn the config into one side (module docstring)."""
    lora = [] if cfg.model.lora_r > 0 else ["model.lora_r=16", "model.lora_alpha=32",
                                             f"model.lora_target_modules={json.dumps(ALL_PROJECTIONS)}"]
    if side == "qlora":
        return ["model.load_in_4bit=true", "model.load_in_8bit=false", *lora]
    if side == "lora-bf16":
        return ["model.load_in_4bit=false", "model.load_in_8bit=false", "model.dtype=bfloat16",
                "model.precision=auto", *lora]   # 16-bit weights compute in their own dtype
    if side == "lora":
        return ["model.load_in_4bit=false", "model.load_in_8bit=false", *lora]
    return ["model.load_in_4bit=false", "model.load_in_8bit=false", "model.lora_r=0"]


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise OSError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Start a new peak-RSS window (Linux: writing 5 to clear_refs resets VmHWM to the current RSS)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _tensor_bytes(t: torch.Tensor, seen: set) -> int:
    if t.data_ptr() in seen:
        return 0
    seen.add(t.data_ptr())
    return t.numel() * t.element_size()


def weight_parts(models: list[torch.nn.Module]) -> dict[str, float]:
    """Every parameter and buffer once, in MiB, and the bitsandbytes-quantized part of it: the packed
    weights plus their quantization state (absmax, nested scales, code book), with its weights' count."""
    seen: set = set()
    total = quantized = 0
    n_quantized = 0
    for m in models:
        for t in list(m.parameters()) + list(m.buffers()):
            qs = getattr(t, "quant_state", None)
            scb = getattr(t, "SCB", None)
            size = _tensor_bytes(t, seen)
            if qs is not None or torch.is_tensor(scb):
                states = [getattr(part, name, None) for part in (qs, getattr(qs, "state2", None))
                          for name in ("absmax", "code")] + [scb]
                size += sum(_tensor_bytes(v, seen) for v in states if torch.is_tensor(v))
                quantized += size
                n_quantized += int(torch.Size(qs.shape).numel()) if qs is not None else t.numel()
            total += size
    return {"weights_mib": total / 2**20, "quantized_mib": quantized / 2**20, "quantized_params": n_quantized}


class _PeakWindow:
    """A TrainerCallback: the load's peak at train begin, then the steps' own peak and metrics rows."""

    def __init__(self) -> None:
        self.load_peak = self.step_peak = 0.0
        self.rows: list[dict[str, Any]] = []

    def on_train_begin(self, args=None, state=None, control=None, **kwargs) -> None:
        self.load_peak = _status_mib("VmHWM")
        reset_peak()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def on_step_end(self, args=None, state=None, control=None, metrics=None, **kwargs) -> None:
        self.rows.append(dict(metrics or {}))
        cuda = torch.cuda.is_available() and torch.cuda.max_memory_allocated() > 0
        self.step_peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _status_mib("VmHWM")


class _BatchShapes(TrainHooks):
    """The run's hooks, also keeping each step's padded row width (prompt + completion) and real tokens."""

    def __init__(self, cfg, callbacks: list) -> None:
        super().__init__(cfg, callbacks)
        self.widths: list[int] = []
        self.tokens: list[float] = []

    def observe(self, step, rollout, scores, advantages, correct=None) -> None:
        self.widths.append(rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1])
        real = rollout.prompt_mask.sum() + rollout.completion_mask.sum()
        self.tokens.append(float(real) / rollout.prompt_ids.shape[0])


def run_recipe_side(config: str, side: str, steps: int, extra: list[str]) -> dict[str, Any]:
    """One side in this process: train `steps` steps of the config as the side says, measure."""
    switch.for_this_process()
    for optional in ("peft", "bitsandbytes"):   # imported on every side: the same baseline
        if importlib.util.find_spec(optional):
            importlib.import_module(optional)
    baseline = current_rss_mib()   # the interpreter, torch, transformers: before any model exists
    base = load_config(config, list(extra))
    out_dir = tempfile.mkdtemp(prefix=f"grpokit-recipe-{side}-")
    cfg = load_config(config, [*extra, *side_overrides(side, base), f"run.max_steps={steps}",
                               "run.max_minutes=0", "run.eval_limit=0", "run.save_steps=0",
                               f"run.output_dir={out_dir}"])
    window = _PeakWindow()
    hooks = _BatchShapes(cfg, [window])
    state = train_grpo(cfg, callbacks=hooks)
    rows = window.rows
    opt = state.optimizer
    trainable = [p for g in opt.param_groups for p in g["params"]]
    moments = [v for s in getattr(opt, "optimizer", opt).state.values() for v in s.values()
               if torch.is_tensor(v) and v.dim() > 0]
    seen: set = set()
    times = [r["time/step"] for r in rows]
    return {"side": side, "config": config, "steps": len(rows), "device": str(state.model.device),
            "load_peak_mib": window.load_peak, "step_peak_mib": window.step_peak,
            "s_per_step": statistics.median(times[1:] or times), "step_seconds": times,
            "baseline_mib": baseline, **weight_parts([state.model, state.ref_model]),
            "trainable_params": sum(p.numel() for p in trainable),
            "optimizer_state_mib": sum(_tensor_bytes(v, seen) for v in moments) / 2**20,
            "sequence_width": statistics.median(hooks.widths),
            "sequence_tokens_mean": statistics.fmean(hooks.tokens),
            "overrides": side_overrides(side, base)}


def run_order(sides: list[str], repeats: int) -> list[str]:
    """sides, then reversed, `repeats` times: every side sees early and late minutes."""
    order: list[str] = []
    for i in range(repeats):
        order += sides if i % 2 == 0 else sides[::-1]
    return order


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each side's medians, and qlora's and lora's ratios to full."""
    out: dict[str, Any] = {}
    for side in dict.fromkeys(r["side"] for r in rows):
        mine = [r for r in rows if r["side"] == side]
        out[side] = {k: statistics.median(r[k] for r in mine)
                     for k in ("load_peak_mib", "step_peak_mib", "s_per_step", "weights_mib")}
    if "full" in out:
        for side in ("qlora", "lora-bf16", "lora"):
            if side in out:
                out[f"{side}_over_full"] = {k: out[side][k] / out["full"][k]
                                            for k in ("step_peak_mib", "s_per_step", "weights_mib")}
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grpokit bench --memory --config", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the training config (YAML) whose recipe is measured")
    p.add_argument("--sides", default=",".join(RECIPE_SIDES), help=f"comma list of {', '.join(RECIPE_SIDES)}")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run (s/step: the median of 2..)")
    p.add_argument("--repeats", type=int, default=1, help="runs per side, the order reversed each round")
    p.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)  # from `grpokit bench --memory`
    p.add_argument("overrides", nargs="*", help="key=value overrides applied to every side")
    args = p.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    bad = [s for s in args.sides if s not in RECIPE_SIDES]
    if bad:
        p.error(f"unknown side(s) {', '.join(bad)}: choose from {', '.join(RECIPE_SIDES)}")
    if args.steps < 1 or args.repeats < 1:
        p.error("--steps and --repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Parent: each run in its own interpreter, in run_order; one JSON line per run, a table, a summary."""
    args = parse_args(argv)
    config, steps, extra = args.config, args.steps, args.overrides
    rows = []
    for side in run_order(args.sides, args.repeats):
        cmd = [sys.executable, "-m", "grpokit.cli.recipebench", config, side, str(steps), *extra]
        t0 = time.perf_counter()
        row = run_json_side(cmd, f"bench --memory --config: the {side} side")
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("| side | load peak MiB | step peak MiB | s/step | weights MiB | trainable | optimizer MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['side']} | {r['load_peak_mib']:.0f} | {r['step_peak_mib']:.0f} | "
              f"{r['s_per_step']:.2f} | {r['weights_mib']:.0f} | {r['trainable_params']:,} | "
              f"{r['optimizer_state_mib']:.0f} |")
    print(json.dumps({"summary": summarize(rows)}))
    return 0


if __name__ == "__main__":   # the child: config side steps [key=value ...]
    print(json.dumps(run_recipe_side(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:])))
