"""`grpokit bench --memory --config`: a recipe measured as QLoRA, LoRA and full training, each side in its
own process, the order alternated; what each side changes, and that the figures move the way the
storage does (4-bit weights < fp32 weights; LoRA's optimizer state a sliver of full training's)."""

import json
from pathlib import Path

import pytest

from grpokit.cli import recipebench
from grpokit.cli.bench import main as bench_main
from grpokit.config.schema import load_config

RECIPE = """model:
  name_or_path: builtin:arith-demo
  device: cpu
  precision: fp32
task:
  name: arithmetic
  operators: "+"
  num_train: 64
  num_eval: 8
rollout:
  num_generations: 4
  prompts_per_step: 2
  max_completion_length: 8
  max_prompt_length: 64
optim:
  learning_rate: 1.0e-4
run:
  max_steps: 100
"""


def _recipe(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.replace("model:\n", "model:\n" + extra), encoding="utf-8")
    return path


def test_sides_change_only_the_model_section(tmp_path):
    plain = load_config(_recipe(tmp_path))
    assert recipebench.side_overrides("full", plain)[-1] == "model.lora_r=0"
    qlora = load_config(_recipe(tmp_path), recipebench.side_overrides("qlora", plain))
    assert qlora.model.load_in_4bit and qlora.model.lora_r == 16
    assert qlora.model.lora_target_modules == recipebench.ALL_PROJECTIONS   # the config had no LoRA
    lora = load_config(_recipe(tmp_path), recipebench.side_overrides("lora", plain))
    assert not lora.model.load_in_4bit and lora.model.lora_r == 16 and lora.model.dtype == plain.model.dtype
    bf16 = load_config(_recipe(tmp_path), recipebench.side_overrides("lora-bf16", plain))
    assert bf16.model.dtype == "bfloat16" and bf16.model.lora_r == 16
    assert (qlora.rollout, qlora.optim, qlora.loss) == (plain.rollout, plain.optim, plain.loss)
    # a config with its own LoRA keeps it on both LoRA sides
    own = load_config(_recipe(tmp_path, "  lora_r: 4\n  lora_alpha: 8\n"))
    assert not [o for o in recipebench.side_overrides("qlora", own) if o.startswith("model.lora")]


def test_the_order_alternates_and_the_summary_takes_medians():
    assert recipebench.run_order(["qlora", "lora", "full"], 3) == [
        "qlora", "lora", "full", "full", "lora", "qlora", "qlora", "lora", "full"]
    row = {"load_peak_mib": 1.0, "weights_mib": 1.0}
    rows = [{"side": "full", "step_peak_mib": 100.0, "s_per_step": s, **row} for s in (1.0, 3.0, 9.0)]
    rows += [{"side": "qlora", "step_peak_mib": 50.0, "s_per_step": 6.0, **row}]
    out = recipebench.summarize(rows)
    assert out["full"]["s_per_step"] == 3.0
    assert out["qlora_over_full"]["s_per_step"] == 2.0 and out["qlora_over_full"]["step_peak_mib"] == 0.5


def test_bad_sides_and_steps_are_refused(tmp_path, capsys):
    for argv, says in ((["--sides", "qlora,fp8"], "unknown side(s) fp8"), (["--steps", "0"], "at least 1")):
        with pytest.raises(SystemExit):
            bench_main(["--memory", "--config", str(_recipe(tmp_path)), *argv])
        assert says in capsys.readouterr().err


def test_the_three_sides_run_and_measure_what_they_store(tmp_path, capsys):
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    path = _recipe(tmp_path)
    assert bench_main(["--memory", "--config", str(path), "--steps", "2", "run.seed=3"]) == 0
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    rows = {r["side"]: r for r in lines if "side" in r}
    assert set(rows) == {"qlora", "lora-bf16", "lora", "full"}
    for r in rows.values():
        assert r["steps"] == 2 and len(r["step_seconds"]) == 2 and r["s_per_step"] > 0
        assert r["step_peak_mib"] > 0 and r["load_peak_mib"] > 0
    assert rows["qlora"]["weights_mib"] < rows["lora"]["weights_mib"] < rows["full"]["weights_mib"]
    assert rows["lora-bf16"]["weights_mib"] < rows["lora"]["weights_mib"]
    assert rows["lora-bf16"]["optimizer_state_mib"] == rows["lora"]["optimizer_state_mib"]   # fp32 adapters
    assert rows["qlora"]["quantized_params"] > 0 and rows["lora"]["quantized_params"] == 0
    assert rows["qlora"]["quantized_mib"] < rows["qlora"]["quantized_params"] * 0.6 / 2**20   # ~4.1 bits
    assert rows["qlora"]["trainable_params"] == rows["lora"]["trainable_params"]
    assert rows["lora"]["trainable_params"] < rows["full"]["trainable_params"] / 2
    assert rows["lora"]["optimizer_state_mib"] < rows["full"]["optimizer_state_mib"]
    summary = lines[-1]["summary"]
    assert summary["qlora_over_full"]["weights_mib"] < 1
