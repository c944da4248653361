"""benchmarks/trl_time_to_accuracy.py: TRL's GRPOTrainer on a grpokit config's work, rows grpokit can plot."""

import importlib.util
import json
from pathlib import Path

import pytest

from grpokit.cli.eval import eval_config
from grpokit.cli.main import main as cli_main

pytest.importorskip("trl")
ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("trl_tta", ROOT / "benchmarks" / "trl_time_to_accuracy.py")
tta = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(tta)

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["model.name_or_path=builtin:tiny-random", "task.num_train=32", "task.num_eval=8",
        "rollout.prompts_per_step=1", "rollout.num_generations=4", "rollout.max_completion_length=8",
        "optim.learning_rate=3e-4", "optim.micro_batch_size=0", "run.max_steps=2", "run.eval_steps=1",
        "run.eval_limit=4", "rollout.temperature=0.7", "loss.beta=0.04"]


def test_trl_gets_the_configs_work(tmp_path):
    cfg = eval_config(str(ROOT / "configs" / "smollm2_arith_cpu.yaml"), [])
    args = tta.trl_config(cfg, str(tmp_path))
    n = cfg.rollout.prompts_per_step * cfg.rollout.num_generations
    mb = cfg.optim.micro_batch_size
    assert 0 < mb < n and args.generation_batch_size == n          # one optimizer step per generation batch
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (mb, n // mb)
    assert args.steps_per_generation == args.gradient_accumulation_steps
    assert args.num_generations == cfg.rollout.num_generations
    assert (args.max_completion_length, args.temperature) == (cfg.rollout.max_completion_length, 1.0)
    assert (args.beta, args.epsilon, args.loss_type) == (cfg.loss.beta, cfg.loss.epsilon, "grpo")
    assert (args.learning_rate, args.adam_beta2, args.max_grad_norm) == (1e-5, cfg.optim.adam_beta2, 1.0)
    assert args.max_steps == cfg.run.max_steps and not args.gradient_checkpointing
    assert args.bf16  # TRL keeps its own default mixed precision on the CPU


def test_micro_batch_zero_is_one_pass_and_a_non_divisor_is_refused(tmp_path, capsys):
    whole = tta.trl_config(eval_config(str(ROOT / "configs" / "smollm2_arith_cpu.yaml"),
                                       ["optim.micro_batch_size=0"]), str(tmp_path))
    assert (whole.per_device_train_batch_size, whole.gradient_accumulation_steps) == (32, 1)
    assert tta.main([str(ROOT / "configs" / "smollm2_arith_cpu.yaml"), "optim.micro_batch_size=5",
                     "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "must divide" in err
    assert not (tmp_path / "c").exists()                     # refused before the folder is made


def test_a_tiny_run_writes_rows_that_grpokit_plot_reads(tmp_path, capsys):
    out = tmp_path / "trl_run"
    assert tta.main([str(ROOT / "configs" / "smollm2_arith_cpu.yaml"), *TINY, "model.precision=fp32",
                     "task.chat_template=false", "task.few_shot=0", "--out", str(out)]) == 0
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert [(e["tag"], e["step"]) for e in evals] == [("before", 0), ("step1", 1), ("after", 2)]
    assert all(0 <= e["accuracy"] <= 1 and e["num_problems"] == 4 for e in evals)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["time/step"] > 0 for r in rows)
    capsys.readouterr()
    assert cli_main(["plot", str(out), "--out", str(tmp_path / "plots"), "--target", "0.99"]) == 0
    assert "trl_run: " in capsys.readouterr().out
    assert (tmp_path / "plots" / "time_to_accuracy.png").is_file()


def test_run_max_minutes_ends_trls_training_as_it_ends_grpokits(tmp_path):
    out = tmp_path / "trl_run"
    tiny = [x for x in TINY if not x.startswith("run.max_steps=")]
    assert tta.main([str(ROOT / "configs" / "smollm2_arith_cpu.yaml"), *tiny, "run.max_steps=50",
                     "run.max_minutes=1e-6", "model.precision=fp32", "task.chat_template=false",
                     "task.few_shot=0", "--out", str(out)]) == 0
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert [(e["tag"], e["step"]) for e in evals] == [("before", 0), ("after", 1)]   # out of time at step 1


def test_skip_before_leaves_the_starting_model_unevaluated(tmp_path):
    out = tmp_path / "trl_run"
    tiny = [x for x in TINY if not x.startswith(("run.max_steps=", "run.eval_steps="))]
    assert tta.main([str(ROOT / "configs" / "smollm2_arith_cpu.yaml"), *tiny, "run.max_steps=1",
                     "run.eval_steps=0", "model.precision=fp32", "task.chat_template=false",
                     "task.few_shot=0", "--skip-before", "--out", str(out)]) == 0
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert [(e["tag"], e["step"]) for e in evals] == [("after", 1)]


def test_a_bad_override_or_a_used_folder_is_a_one_line_error(tmp_path, capsys):
    cfg = str(ROOT / "configs" / "smollm2_arith_cpu.yaml")
    assert tta.main([cfg, "rollout.num_generatons=4", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "num_generations" in err
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("keep")
    assert tta.main([cfg, "--out", str(tmp_path / "b")]) == 2
    assert "is not empty" in capsys.readouterr().err and (tmp_path / "b" / "x").read_text() == "keep"
