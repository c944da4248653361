"""The code demo: its shipped warm start (builtin:code-demo), configs/code_demo.yaml, two steps of it."""

import json
from pathlib import Path

import pytest

from grpokit.model.loading import ASSETS

CHECKPOINT = ASSETS / "code-demo"
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "code_demo.yaml"
pytestmark = [pytest.mark.skipif(not (CHECKPOINT / "model.safetensors").is_file(),
                                 reason="the code demo checkpoint is not built (grpokit sft)"),
              pytest.mark.filterwarnings("ignore::grpokit.sandbox.SandboxWarning")]


def _sandbox() -> str:
    from grpokit.sandbox import SandboxUnavailable, check_sandbox

    try:
        check_sandbox("bwrap")
        return "bwrap"
    except SandboxUnavailable:
        return "process"     # this test's programs come from the shipped tiny model


def test_the_code_demo_model_is_small_sees_the_prompts_and_is_imperfect_on_purpose():
    from grpokit.config.sections import ModelConfig
    from grpokit.model.loading import load_model_and_tokenizer

    assert sum(p.stat().st_size for p in CHECKPOINT.iterdir()) < 20 * 2**20
    model, tok = load_model_and_tokenizer(ModelConfig(name_or_path="builtin:code-demo", device="cpu"))
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert model.config.max_position_embeddings >= 320 + 160      # the config's prompt + completion
    program = "```python\ndef f(xs):\n    return [x + 1 for x in xs]\n```"
    assert tok.decode(tok(program)["input_ids"]) == program       # spaces and newlines kept
    report = json.loads((CHECKPOINT / "sft_report.json").read_text())
    assert report["recipe"]["stop_at"] < report["recipe"]["steps"]   # stopped early on purpose
    assert report["shape"]["max_positions"] == model.config.max_position_embeddings
    assert report["parameters"] == sum(p.numel() for p in model.parameters())


def test_two_steps_of_the_code_demo_run_programs_and_evaluate_held_out_functions(tmp_path):
    from grpokit.cli.main import main as cli_main
    from grpokit.observe.metrics import read_metrics

    out = tmp_path / "code"
    assert cli_main(["train", str(CONFIG), f"run.output_dir={out}", "run.max_steps=2", "run.eval_limit=6",
                     "rollout.prompts_per_step=2", "rollout.num_generations=4", "run.progress=false",
                     f"reward.sandbox={_sandbox()}", "model.device=cpu"]) == 0
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        outcomes = sum(r[f"code/{k}"] for k in ("passed", "failed", "timeout", "memory", "crash",
                                                 "output_too_large", "no_program"))
        assert outcomes == 2 * 4 and 1 <= r["code/programs_run"] <= 8     # each completion's, run once each
        assert 0.0 <= r["rewards/code_tests"] <= 1.0
    evals = {r["tag"]: r for r in read_metrics(out, "eval.jsonl")}
    assert set(evals) == {"before", "after"} and evals["before"]["num_problems"] == 6
    assert 0.0 < evals["before"]["rewards/code_tests"] <= 1.0     # the warm start writes working programs
